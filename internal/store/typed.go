package store

import (
	"context"

	"google.golang.org/protobuf/proto"
)

// ListAs lists objects like s.List and unmarshals each into a message made
// by newT, with metadata.resource_version hydrated.
func ListAs[T proto.Message](ctx context.Context, s Objects, objType string, opts ListOptions, newT func() T) ([]T, error) {
	objs, err := s.List(ctx, objType, opts)
	if err != nil {
		return nil, err
	}
	out := make([]T, 0, len(objs))
	for _, o := range objs {
		m := newT()
		if err := Hydrate(o.Payload, o.ResourceVersion, m); err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, nil
}

// GetAs reads object id into a new message made by newT.
func GetAs[T proto.Message](ctx context.Context, s Objects, objType, id string, newT func() T) (T, error) {
	m := newT()
	if err := s.Get(ctx, objType, id, m); err != nil {
		var zero T
		return zero, err
	}
	return m, nil
}

// UpdateCASAs is UpdateCAS with a typed mutate function. It returns the
// written message.
func UpdateCASAs[T proto.Message](ctx context.Context, s Objects, objType, id string, expectedRV uint64, newT func() T, mutate func(T) error) (T, WriteResult, error) {
	m := newT()
	wr, err := s.UpdateCAS(ctx, objType, id, expectedRV, m, func(p proto.Message) error { return mutate(p.(T)) })
	if err != nil {
		var zero T
		return zero, WriteResult{}, err
	}
	return m, wr, nil
}
