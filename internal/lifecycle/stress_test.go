package lifecycle_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/lifecycle"
	"github.com/openshell-go/openshell/internal/store"
	"github.com/openshell-go/openshell/internal/store/sqlite"
)

// stressDriver is a compute.Driver whose events the test controls: every
// change it makes is reported at once through emit (while the engine may
// still hold the sandbox's gate), half of its deletes finish later in a
// reaper goroutine (as with Kubernetes), and some creates fail.
type stressDriver struct {
	emit func(compute.Event) // set before use; the engine's event intake

	mu        sync.Mutex
	workloads map[string]compute.Sandbox
	lastSeen  map[string]compute.Sandbox // every workload ever made: stale snapshots
	rng       *rand.Rand

	reap    chan string
	reaping sync.WaitGroup
}

var _ compute.Driver = (*stressDriver)(nil)

func newStressDriver(seed uint64) *stressDriver {
	return &stressDriver{
		workloads: map[string]compute.Sandbox{}, lastSeen: map[string]compute.Sandbox{},
		rng: rand.New(rand.NewPCG(seed, 13)), reap: make(chan string, 1024),
	}
}

func (d *stressDriver) chance(p float64) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.rng.Float64() < p
}

func (d *stressDriver) Capabilities(context.Context) (compute.Capabilities, error) {
	return compute.Capabilities{DriverName: "stress", DefaultImage: "img"}, nil
}
func (d *stressDriver) ListenerRequirements(context.Context) ([]compute.ListenerRequirement, error) {
	return nil, nil
}
func (d *stressDriver) ValidateCreate(context.Context, compute.Sandbox) error { return nil }
func (d *stressDriver) EnsureWorkspace(context.Context, string) error         { return nil }
func (d *stressDriver) DeleteWorkspace(context.Context, string) error         { return nil }

// put stores sb and reports it.
func (d *stressDriver) put(sb compute.Sandbox) {
	d.mu.Lock()
	d.workloads[sb.ID] = sb
	d.lastSeen[sb.ID] = sb
	d.mu.Unlock()
	d.emit(compute.Event{Kind: compute.EventSandbox, Sandbox: sb})
}

func running() []compute.Condition {
	return []compute.Condition{{Type: compute.ConditionReady, Status: "True", Reason: "Running"}}
}

func (d *stressDriver) Create(_ context.Context, sb compute.Sandbox) error {
	runtime.Gosched() // widen the window between the insert and the driver
	if d.chance(0.1) {
		return errors.New("injected create failure")
	}
	sb.Status.Conditions = running()
	d.put(sb)
	return nil
}

func (d *stressDriver) change(id string, fn func(*compute.Sandbox)) error {
	d.mu.Lock()
	sb, ok := d.workloads[id]
	d.mu.Unlock()
	if !ok {
		return errdefs.NotFound("workload not found")
	}
	fn(&sb)
	d.put(sb)
	return nil
}

func (d *stressDriver) Stop(_ context.Context, ref compute.Ref) error {
	return d.change(ref.ID, func(sb *compute.Sandbox) {
		sb.Status.Conditions = []compute.Condition{
			{Type: compute.ConditionReady, Status: "False", Reason: "Stopped"},
			{Type: compute.ConditionSuspended, Status: "True"},
		}
	})
}

func (d *stressDriver) Start(_ context.Context, ref compute.Ref) error {
	return d.change(ref.ID, func(sb *compute.Sandbox) { sb.Status.Conditions = running() })
}

func (d *stressDriver) Delete(_ context.Context, ref compute.Ref) (bool, error) {
	d.mu.Lock()
	sb, ok := d.workloads[ref.ID]
	later := d.rng.IntN(2) == 0
	d.mu.Unlock()
	if !ok {
		return false, nil
	}
	if later && !sb.Status.Deleting {
		sb.Status.Deleting = true
		d.put(sb)
		d.reaping.Add(1)
		d.reap <- ref.ID
		return true, nil
	}
	if !later {
		d.remove(ref.ID)
	}
	return true, nil
}

func (d *stressDriver) remove(id string) {
	d.mu.Lock()
	_, ok := d.workloads[id]
	delete(d.workloads, id)
	d.mu.Unlock()
	if ok {
		d.emit(compute.Event{Kind: compute.EventDeleted, SandboxID: id})
	}
}

// reaper finishes deferred deletes until reap is closed.
func (d *stressDriver) reaper() {
	for id := range d.reap {
		runtime.Gosched()
		d.remove(id)
		d.reaping.Done()
	}
}

func (d *stressDriver) Get(_ context.Context, ref compute.Ref) (compute.Sandbox, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	sb, ok := d.workloads[ref.ID]
	if !ok {
		return compute.Sandbox{}, errdefs.NotFound("workload not found")
	}
	return sb, nil
}

func (d *stressDriver) List(context.Context) ([]compute.Sandbox, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]compute.Sandbox, 0, len(d.workloads))
	for _, sb := range d.workloads {
		out = append(out, sb)
	}
	return out, nil
}

func (d *stressDriver) Watch(context.Context) (<-chan compute.Event, func() error, error) {
	return nil, nil, errdefs.Unimplemented("the stress test delivers events itself")
}

// noise sends a snapshot of a random workload, live or long deleted (a
// late informer update), or a platform event.
func (d *stressDriver) noise() {
	d.mu.Lock()
	var pick compute.Sandbox
	n := d.rng.IntN(len(d.lastSeen) + 1)
	for _, sb := range d.lastSeen {
		if n--; n < 0 {
			pick = sb
			break
		}
	}
	kind := d.rng.IntN(3)
	d.mu.Unlock()
	if pick.ID == "" {
		return
	}
	switch kind {
	case 0:
		d.emit(compute.Event{Kind: compute.EventPlatform, SandboxID: pick.ID, Platform: compute.PlatformEvent{Source: "stress", Reason: "Noise"}})
	default:
		d.emit(compute.Event{Kind: compute.EventSandbox, Sandbox: pick})
	}
}

// busyStore is the real store with another writer in it: some writes of
// the engine find that the row was just written by someone else (its
// version bumped), so compare-and-swap retries happen often.
type busyStore struct {
	lifecycle.ObjectStore
	mu  sync.Mutex
	rng *rand.Rand
}

func (s *busyStore) interfere(ctx context.Context, id string) {
	s.mu.Lock()
	hit := s.rng.IntN(5) == 0
	s.mu.Unlock()
	if !hit {
		return
	}
	if sb, err := s.GetSandbox(ctx, id); err == nil {
		_ = s.ObjectStore.UpdateSandbox(ctx, sb) // same content, new version
	}
}

func (s *busyStore) UpdateSandbox(ctx context.Context, sb *openshellv1.Sandbox) error {
	s.interfere(ctx, sb.GetMetadata().GetId())
	return s.ObjectStore.UpdateSandbox(ctx, sb)
}

func (s *busyStore) DeleteSandbox(ctx context.Context, id string, expectedRV uint64) error {
	s.interfere(ctx, id)
	return s.ObjectStore.DeleteSandbox(ctx, id, expectedRV)
}

// TestStress interleaves create, delete, stop, start, driver events,
// supervisor session changes and policy writes on a few sandbox names,
// over a real SQLite store in which other writers keep bumping versions
// (so compare-and-swap retries are frequent), then checks the engine's invariants once
// everything has settled:
//   - no backend workload without a row;
//   - no READY sandbox whose supervisor session is not connected;
//   - no scoped record (policy revision, draft chunk) of a sandbox without
//     a row;
//
// and, after deleting everything, that no row, workload, scoped record,
// gate or tracked state is left.
func TestStress(t *testing.T) {
	ctx := t.Context()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "gateway.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	d := newStressDriver(seed)
	busy := &busyStore{ObjectStore: lifecycle.ObjectStore{S: st}, rng: rand.New(rand.NewPCG(seed, 300))}
	e, err := lifecycle.New(ctx, lifecycle.Options{Store: busy, Driver: d})
	if err != nil {
		t.Fatal(err)
	}
	d.emit = func(ev compute.Event) { lifecycle.ApplyEventForTest(ctx, e, ev) }
	var reaper sync.WaitGroup
	reaper.Go(d.reaper)

	names := []string{"a", "b", "c", "d", "e"}
	var idsMu sync.Mutex
	ids := map[string]bool{}     // every sandbox id ever created
	session := map[string]bool{} // the relay's view: connected or not
	randomID := func(r *rand.Rand) string {
		idsMu.Lock()
		defer idsMu.Unlock()
		n := r.IntN(len(ids) + 1)
		for id := range ids {
			if n--; n < 0 {
				return id
			}
		}
		return ""
	}
	unexpected := make(chan error, 64)
	check := func(op string, err error, allowed ...codes.Code) {
		if err == nil {
			return
		}
		for _, c := range allowed {
			if errdefs.Code(err) == c {
				return
			}
		}
		select {
		case unexpected <- fmt.Errorf("%s: %w", op, err):
		default:
		}
	}

	const workers, opsPerWorker, noiseOps = 4, 40, 200
	var wg sync.WaitGroup
	for w := range workers {
		r := rand.New(rand.NewPCG(seed, uint64(w)))
		wg.Go(func() {
			for range opsPerWorker {
				name := names[r.IntN(len(names))]
				switch r.IntN(4) {
				case 0:
					sb, err := e.Create(ctx, &openshellv1.CreateSandboxRequest{Name: name})
					if err == nil {
						idsMu.Lock()
						ids[sb.GetMetadata().GetId()] = true
						idsMu.Unlock()
					}
					// AlreadyExists: the name is taken; Internal: injected driver failure.
					check("create", err, codes.AlreadyExists, codes.Internal)
				case 1:
					_, err := e.Delete(ctx, "", name)
					check("delete", err, codes.NotFound)
				case 2:
					_, err := e.Stop(ctx, "", name)
					check("stop", err, codes.NotFound, codes.FailedPrecondition)
				case 3:
					_, err := e.Start(ctx, "", name)
					check("start", err, codes.NotFound, codes.FailedPrecondition)
				}
			}
		})
	}
	// Driver events.
	wg.Go(func() {
		for range noiseOps {
			d.noise()
			runtime.Gosched()
		}
	})
	// Supervisor sessions: calls are serialized, like the relay's hook.
	wg.Go(func() {
		r := rand.New(rand.NewPCG(seed, 100))
		for range noiseOps {
			id := randomID(r)
			if id == "" {
				runtime.Gosched()
				continue
			}
			connected := r.IntN(2) == 0
			idsMu.Lock()
			session[id] = connected
			idsMu.Unlock()
			e.SessionChanged(ctx, id, connected, "inst-"+id)
		}
	})
	// Policy writes and draft chunks, as the policy service makes them.
	wg.Go(func() {
		r := rand.New(rand.NewPCG(seed, 200))
		for range noiseOps / 4 {
			id := randomID(r)
			if id == "" {
				runtime.Gosched()
				continue
			}
			_, err := st.CommitPolicyRevision(ctx, store.PolicyRevision{Revision: store.Record{Type: store.TypeSandboxPolicy, Scope: id, Status: "pending"}})
			check("commit policy", err, codes.NotFound)
			_, _, err = st.RecordHit(ctx, store.Record{Type: store.TypeDraftPolicyChunk, Scope: id, DedupKey: "host:443"})
			check("record hit", err, codes.NotFound)
		}
	})
	wg.Wait()
	d.reaping.Wait()

	rows, err := e.List(ctx, lifecycle.ListOptions{AllWorkspaces: true, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	live := map[string]*openshellv1.Sandbox{}
	for _, sb := range rows {
		live[sb.GetMetadata().GetId()] = sb
	}
	workloads, _ := d.List(ctx)
	for _, w := range workloads {
		if live[w.ID] == nil {
			t.Errorf("workload %s has no row", w.ID)
		}
	}
	for id, sb := range live {
		if sb.GetStatus().GetPhase() == openshellv1.SandboxPhase_SANDBOX_PHASE_READY && !session[id] {
			t.Errorf("sandbox %s is READY without a supervisor session", sb.GetMetadata().GetName())
		}
	}
	for id := range ids {
		if live[id] == nil {
			if n := scopedRecords(t, st, id); n != 0 {
				t.Errorf("%d scoped records outlived sandbox %s", n, id)
			}
		}
	}
	if gates, states := lifecycle.EngineMapsForTest(e); gates != 0 || states > len(live) {
		t.Errorf("settled engine holds %d gates and %d tracked sandboxes for %d rows", gates, states, len(live))
	}

	// Delete everything; deferred backend deletes finish through events.
	for _, sb := range rows {
		if _, err := e.Delete(ctx, sb.GetMetadata().GetWorkspace(), sb.GetMetadata().GetName()); err != nil && errdefs.Code(err) != codes.NotFound {
			t.Errorf("final delete of %s: %v", sb.GetMetadata().GetName(), err)
		}
	}
	d.reaping.Wait()
	close(d.reap)
	reaper.Wait()
	close(unexpected)
	for err := range unexpected {
		t.Errorf("unexpected error: %v", err)
	}
	if rows, err := e.List(ctx, lifecycle.ListOptions{AllWorkspaces: true}); err != nil || len(rows) != 0 {
		t.Errorf("rows after deleting everything: %d (%v)", len(rows), err)
	}
	if workloads, _ := d.List(ctx); len(workloads) != 0 {
		t.Errorf("workloads after deleting everything: %d", len(workloads))
	}
	for id := range ids {
		if n := scopedRecords(t, st, id); n != 0 {
			t.Errorf("%d scoped records outlived sandbox %s", n, id)
		}
	}
	if gates, states := lifecycle.EngineMapsForTest(e); gates != 0 || states != 0 {
		t.Errorf("after deleting everything the engine holds %d gates and %d tracked sandboxes", gates, states)
	}
}

func scopedRecords(t testing.TB, st store.Store, id string) int {
	t.Helper()
	n := 0
	for _, typ := range store.OwnedRecordTypes(store.TypeSandbox) {
		recs, err := st.ListScoped(t.Context(), typ, id, store.MaxLimit, 0)
		if err != nil {
			t.Fatalf("ListScoped(%s, %s): %v", typ, id, err)
		}
		n += len(recs)
	}
	return n
}
