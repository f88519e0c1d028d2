package settings

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"

	"github.com/google/uuid"
	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/store"
)

// GlobalScope is the record scope of the gateway-wide settings.
const GlobalScope = "global"

// Snapshot is the settings of one scope at one revision. Revision 0 is
// the empty snapshot of a scope nothing was ever set in.
type Snapshot struct {
	Revision uint64
	Values   map[string]*sandboxv1.SettingValue
}

// Store keeps settings snapshots as scoped records: store.TypeGatewaySettings
// in scope GlobalScope and store.TypeSandboxSettings in the scope of a
// sandbox id (deleted with the sandbox). It is safe for concurrent use.
// Writes in one process are serialized by a mutex (so multi-step checks of
// the caller see a stable state); across processes each write is a
// compare-and-swap on the revision read (see Put).
type Store struct {
	Records store.Records
	mu      sync.Mutex
}

// Lock serializes settings writes in this process; callers that check
// one scope before writing another (a sandbox write refused while the key
// is set globally) hold it across both.
func (s *Store) Lock() func() {
	s.mu.Lock()
	return s.mu.Unlock
}

func recordType(scope string) string {
	if scope == GlobalScope {
		return store.TypeGatewaySettings
	}
	return store.TypeSandboxSettings
}

// Get returns the newest snapshot of scope (GlobalScope or a sandbox id).
func (s *Store) Get(ctx context.Context, scope string) (Snapshot, error) {
	rec, err := s.Records.GetLatestScoped(ctx, recordType(scope), scope, "")
	if errors.Is(err, errdefs.ErrNotFound) {
		return Snapshot{Values: map[string]*sandboxv1.SettingValue{}}, nil
	}
	if err != nil {
		return Snapshot{}, err
	}
	msg := &sandboxv1.GetGatewayConfigResponse{}
	if err := proto.Unmarshal(rec.Payload, msg); err != nil {
		return Snapshot{}, fmt.Errorf("decode settings of %s@%d: %w", scope, rec.Version, err)
	}
	values := msg.GetSettings()
	if values == nil {
		values = map[string]*sandboxv1.SettingValue{}
	}
	return Snapshot{Revision: uint64(rec.Version), Values: values}, nil
}

// snapshotNamespace scopes the derived ids of settings snapshots.
var snapshotNamespace = uuid.MustParse("1d6b8f0e-52a4-4c3e-a0a7-5c2f61f0b6c4")

// snapshotID is the record id of revision rev of scope. Every revision of a
// scope has this id, so two writers that read the same revision race for
// one primary key and exactly one wins.
func snapshotID(scope string, rev uint64) string {
	return uuid.NewSHA1(snapshotNamespace, fmt.Appendf(nil, "settings/%s/%d", scope, rev)).String()
}

// errConcurrent is OpenShell's text for a lost compare-and-swap.
var errConcurrent = errdefs.Conflict("settings were modified concurrently; please retry")

// Put stores values as the revision after base in scope, if base is still
// the newest revision: otherwise it returns errdefs.ErrConflict and stores
// nothing. A sandbox scope whose sandbox is gone is NotFound.
func (s *Store) Put(ctx context.Context, scope string, base Snapshot, values map[string]*sandboxv1.SettingValue) (Snapshot, error) {
	payload, err := proto.MarshalOptions{Deterministic: true}.Marshal(&sandboxv1.GetGatewayConfigResponse{Settings: values})
	if err != nil {
		return Snapshot{}, fmt.Errorf("encode settings: %w", err)
	}
	next := base.Revision + 1
	rec, err := s.Records.CreateScoped(ctx, store.Record{ID: snapshotID(scope, next), Type: recordType(scope), Scope: scope, Payload: payload})
	if errors.Is(err, errdefs.ErrAlreadyExists) {
		return Snapshot{}, errConcurrent
	}
	if err != nil {
		return Snapshot{}, err
	}
	if uint64(rec.Version) != next {
		// Only a write that bypassed Put can get here.
		return Snapshot{}, fmt.Errorf("settings of %s stored as revision %d, want %d", scope, rec.Version, next)
	}
	return Snapshot{Revision: next, Values: values}, nil
}

// Update applies mutate to a copy of scope's newest values and stores the
// result with Put when mutate reports a change. A lost compare-and-swap
// (another replica wrote in between) is retried on the new state a few
// times, so mutate must be a function of its argument only; after that
// the conflict is returned. It returns the snapshot in force afterwards
// and whether it changed.
func (s *Store) Update(ctx context.Context, scope string, mutate func(values map[string]*sandboxv1.SettingValue) (bool, error)) (Snapshot, bool, error) {
	for attempt := 0; ; attempt++ {
		base, err := s.Get(ctx, scope)
		if err != nil {
			return Snapshot{}, false, err
		}
		values := maps.Clone(base.Values)
		changed, err := mutate(values)
		if err != nil || !changed {
			return base, false, err
		}
		snap, err := s.Put(ctx, scope, base, values)
		if errors.Is(err, errdefs.ErrConflict) && attempt < 4 {
			continue
		}
		return snap, err == nil, err
	}
}
