package store

import (
	"fmt"
	"maps"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/openshell-go/openshell/internal/errdefs"
)

const objectMetaName protoreflect.FullName = "openshell.datamodel.v1.ObjectMeta"

// Meta is the part of ObjectMeta the store reads and writes.
type Meta struct {
	ID              string
	Name            string
	Workspace       string
	Labels          map[string]string
	ResourceVersion uint64
	CreatedAtMs     int64
}

// metaField returns msg's "metadata" field descriptor.
func metaField(msg proto.Message) (protoreflect.FieldDescriptor, error) {
	if msg == nil {
		return nil, errdefs.InvalidArgument("message is required")
	}
	md := msg.ProtoReflect().Descriptor()
	fd := md.Fields().ByName("metadata")
	if fd == nil || fd.Message() == nil || fd.Message().FullName() != objectMetaName {
		return nil, fmt.Errorf("%s has no metadata field of type %s: %w", md.FullName(), objectMetaName, errdefs.ErrInvalidArgument)
	}
	return fd, nil
}

// GetMeta reads the ObjectMeta fields of msg.
func GetMeta(msg proto.Message) (Meta, error) {
	fd, err := metaField(msg)
	if err != nil {
		return Meta{}, err
	}
	r := msg.ProtoReflect()
	if !r.Has(fd) {
		return Meta{Labels: map[string]string{}}, nil
	}
	m := r.Get(fd).Message()
	f := m.Descriptor().Fields()
	out := Meta{
		ID:              m.Get(f.ByName("id")).String(),
		Name:            m.Get(f.ByName("name")).String(),
		Workspace:       m.Get(f.ByName("workspace")).String(),
		ResourceVersion: m.Get(f.ByName("resource_version")).Uint(),
		CreatedAtMs:     m.Get(f.ByName("created_at_ms")).Int(),
		Labels:          map[string]string{},
	}
	m.Get(f.ByName("labels")).Map().Range(func(k protoreflect.MapKey, v protoreflect.Value) bool {
		out.Labels[k.String()] = v.String()
		return true
	})
	return out, nil
}

// metaMessage returns msg's metadata message, creating it when absent.
func metaMessage(msg proto.Message) (protoreflect.Message, error) {
	fd, err := metaField(msg)
	if err != nil {
		return nil, err
	}
	return msg.ProtoReflect().Mutable(fd).Message(), nil
}

// SetID sets metadata.id.
func SetID(msg proto.Message, id string) error {
	return setMetaField(msg, "id", protoreflect.ValueOfString(id))
}

// SetResourceVersion sets metadata.resource_version.
func SetResourceVersion(msg proto.Message, rv uint64) error {
	return setMetaField(msg, "resource_version", protoreflect.ValueOfUint64(rv))
}

// SetCreatedAtMs sets metadata.created_at_ms.
func SetCreatedAtMs(msg proto.Message, ms int64) error {
	return setMetaField(msg, "created_at_ms", protoreflect.ValueOfInt64(ms))
}

func setMetaField(msg proto.Message, name protoreflect.Name, v protoreflect.Value) error {
	m, err := metaMessage(msg)
	if err != nil {
		return err
	}
	m.Set(m.Descriptor().Fields().ByName(name), v)
	return nil
}

// SetAnnotations returns a mutate function (for UpdateCAS or Projection)
// that merges annotations into metadata.annotations; an empty value
// deletes the key.
func SetAnnotations(annotations map[string]string) func(proto.Message) error {
	ann := maps.Clone(annotations)
	return func(msg proto.Message) error {
		m, err := metaMessage(msg)
		if err != nil {
			return err
		}
		mp := m.Mutable(m.Descriptor().Fields().ByName("annotations")).Map()
		for k, v := range ann {
			if v == "" {
				mp.Clear(protoreflect.ValueOfString(k).MapKey())
				continue
			}
			mp.Set(protoreflect.ValueOfString(k).MapKey(), protoreflect.ValueOfString(v))
		}
		return nil
	}
}

// Hydrate unmarshals payload into msg (which is reset first) and sets
// metadata.resource_version to rv. Unknown fields are kept.
func Hydrate(payload []byte, rv uint64, msg proto.Message) error {
	proto.Reset(msg)
	if err := proto.Unmarshal(payload, msg); err != nil {
		return fmt.Errorf("decode stored %s: %w", msg.ProtoReflect().Descriptor().FullName(), err)
	}
	return SetResourceVersion(msg, rv)
}
