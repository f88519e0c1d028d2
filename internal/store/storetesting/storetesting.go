// Package storetesting holds the store's unconditional write, for tests
// only. Production code must never import it; a test in package store
// (TestStoretestingImportedOnlyByTests) fails when a non-test file outside
// internal/store does.
package storetesting

import (
	"context"
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/openshell-go/openshell/internal/store"
)

// Key authorizes an unconditional write. Only this package can make a
// valid one; backends refuse the zero value.
type Key struct{ k *key }

type key struct{}

var theKey = Key{k: &key{}}

// Valid reports whether k was made by this package.
func Valid(k Key) bool { return k.k == theKey.k && k.k != nil }

// unconditionalPutter is implemented by the SQL backends.
type unconditionalPutter interface {
	PutUnconditional(ctx context.Context, k Key, objType string, msg proto.Message) (store.WriteResult, error)
}

// Put writes msg whatever is stored under its id (insert or overwrite,
// bumping resource_version). Tests use it to seed or corrupt state.
func Put(ctx context.Context, s store.Store, objType string, msg proto.Message) (store.WriteResult, error) {
	p, ok := s.(unconditionalPutter)
	if !ok {
		return store.WriteResult{}, fmt.Errorf("storetesting: %T has no unconditional write", s)
	}
	return p.PutUnconditional(ctx, theKey, objType, msg)
}
