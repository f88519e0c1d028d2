package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// memStore is a map-backed Store for unit tests of the engine's logic; the
// real backends are exercised in the gateway integration tests.
type memStore struct {
	mu   sync.Mutex
	rows map[string]*openshellv1.Sandbox
	// Hooks run outside mu, so they may call the engine. afterCreate runs
	// once the row is in; beforeUpdate may fail the write.
	afterCreate  func(*openshellv1.Sandbox)
	beforeUpdate func(*openshellv1.Sandbox) error
}

// hooks returns the hooks under mu.
func (s *memStore) hooks() (func(*openshellv1.Sandbox), func(*openshellv1.Sandbox) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.afterCreate, s.beforeUpdate
}

func (s *memStore) setHooks(afterCreate func(*openshellv1.Sandbox), beforeUpdate func(*openshellv1.Sandbox) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.afterCreate, s.beforeUpdate = afterCreate, beforeUpdate
}

func newMemStore() *memStore { return &memStore{rows: map[string]*openshellv1.Sandbox{}} }

func (s *memStore) CreateSandbox(_ context.Context, sb *openshellv1.Sandbox) error {
	if err := s.insert(sb); err != nil {
		return err
	}
	if after, _ := s.hooks(); after != nil {
		after(sb)
	}
	return nil
}

func (s *memStore) insert(sb *openshellv1.Sandbox) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.rows {
		if r.Metadata.Workspace == sb.Metadata.Workspace && r.Metadata.Name == sb.Metadata.Name {
			return fmt.Errorf("sandbox %q: %w", sb.Metadata.Name, errdefs.ErrAlreadyExists)
		}
	}
	sb.Metadata.ResourceVersion = 1
	s.rows[sb.Metadata.Id] = proto.Clone(sb).(*openshellv1.Sandbox)
	return nil
}

func (s *memStore) GetSandbox(_ context.Context, id string) (*openshellv1.Sandbox, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.rows[id]
	if !ok {
		return nil, errdefs.ErrNotFound
	}
	return proto.Clone(r).(*openshellv1.Sandbox), nil
}

func (s *memStore) GetSandboxByName(_ context.Context, ws, name string) (*openshellv1.Sandbox, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.rows {
		if r.Metadata.Workspace == ws && r.Metadata.Name == name {
			return proto.Clone(r).(*openshellv1.Sandbox), nil
		}
	}
	return nil, errdefs.ErrNotFound
}

func (s *memStore) UpdateSandbox(_ context.Context, sb *openshellv1.Sandbox) error {
	if _, before := s.hooks(); before != nil {
		if err := before(sb); err != nil {
			return err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.rows[sb.Metadata.Id]
	if !ok || r.Metadata.ResourceVersion != sb.Metadata.ResourceVersion {
		return errdefs.ErrConflict
	}
	sb.Metadata.ResourceVersion++
	s.rows[sb.Metadata.Id] = proto.Clone(sb).(*openshellv1.Sandbox)
	return nil
}

func (s *memStore) DeleteSandbox(_ context.Context, id string, expectedRV uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.rows[id]
	if !ok {
		return errdefs.ErrNotFound
	}
	if r.Metadata.ResourceVersion != expectedRV {
		return errdefs.ErrConflict
	}
	delete(s.rows, id)
	return nil
}

func (s *memStore) ListSandboxes(_ context.Context, o ListOptions) ([]*openshellv1.Sandbox, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*openshellv1.Sandbox
	for _, r := range s.rows {
		if o.AllWorkspaces || r.Metadata.Workspace == o.Workspace {
			out = append(out, proto.Clone(r).(*openshellv1.Sandbox))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Metadata.Name < out[j].Metadata.Name })
	return out, nil
}

// fakeDriver keeps backend sandboxes in a map; hooks override behaviour.
type fakeDriver struct {
	mu         sync.Mutex
	sandboxes  map[string]compute.Sandbox
	createErr  error
	validateFn func(compute.Sandbox) error
	tokens     []string
	ensured    []string // workspaces passed to EnsureWorkspace
}

func newFakeDriver() *fakeDriver { return &fakeDriver{sandboxes: map[string]compute.Sandbox{}} }

func ready(status, reason string) []compute.Condition {
	return []compute.Condition{{Type: compute.ConditionReady, Status: status, Reason: reason}}
}

func (d *fakeDriver) Capabilities(context.Context) (compute.Capabilities, error) {
	return compute.Capabilities{DriverName: "fake", DefaultImage: "default-image", GatewayManagesLifecycle: true}, nil
}
func (d *fakeDriver) ListenerRequirements(context.Context) ([]compute.ListenerRequirement, error) {
	return nil, nil
}
func (d *fakeDriver) ValidateCreate(_ context.Context, sb compute.Sandbox) error {
	if d.validateFn != nil {
		return d.validateFn(sb)
	}
	return nil
}
func (d *fakeDriver) Create(_ context.Context, sb compute.Sandbox) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.tokens = append(d.tokens, sb.Spec.SandboxToken)
	if d.createErr != nil {
		return d.createErr
	}
	sb.Status.Conditions = ready("True", "Running")
	sb.Status.InstanceID = "i1"
	d.sandboxes[sb.ID] = sb
	return nil
}
func (d *fakeDriver) Get(_ context.Context, ref compute.Ref) (compute.Sandbox, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	sb, ok := d.sandboxes[ref.ID]
	if !ok {
		return compute.Sandbox{}, errdefs.ErrNotFound
	}
	return sb, nil
}
func (d *fakeDriver) List(context.Context) ([]compute.Sandbox, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []compute.Sandbox
	for _, sb := range d.sandboxes {
		out = append(out, sb)
	}
	return out, nil
}
func (d *fakeDriver) set(id string, conds []compute.Condition) {
	d.mu.Lock()
	defer d.mu.Unlock()
	sb := d.sandboxes[id]
	sb.Status.Conditions = conds
	d.sandboxes[id] = sb
}
func (d *fakeDriver) Stop(_ context.Context, ref compute.Ref) error {
	d.set(ref.ID, append(ready("False", "Stopped"), compute.Condition{Type: compute.ConditionSuspended, Status: "True"}))
	return nil
}
func (d *fakeDriver) Start(_ context.Context, ref compute.Ref) error {
	d.set(ref.ID, ready("True", "Running"))
	return nil
}
func (d *fakeDriver) Delete(_ context.Context, ref compute.Ref) (bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, ok := d.sandboxes[ref.ID]
	delete(d.sandboxes, ref.ID)
	return ok, nil
}
func (d *fakeDriver) Watch(ctx context.Context) (<-chan compute.Event, func() error, error) {
	ch := make(chan compute.Event)
	go func() { <-ctx.Done(); close(ch) }()
	return ch, func() error { return nil }, nil
}
func (d *fakeDriver) EnsureWorkspace(_ context.Context, ws string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ensured = append(d.ensured, ws)
	return nil
}
func (d *fakeDriver) DeleteWorkspace(context.Context, string) error { return nil }

type fakeIssuer struct{}

func (fakeIssuer) Mint(id string) (string, time.Time, error) { return "tok-" + id, time.Time{}, nil }

func newEngine(t *testing.T) (*Engine, *memStore, *fakeDriver) {
	t.Helper()
	st, d := newMemStore(), newFakeDriver()
	e, err := New(t.Context(), Options{Store: st, Driver: d, Issuer: fakeIssuer{}})
	if err != nil {
		t.Fatal(err)
	}
	return e, st, d
}

func phase(t *testing.T, e *Engine, name string) openshellv1.SandboxPhase {
	t.Helper()
	sb, err := e.Get(t.Context(), "", name)
	if err != nil {
		t.Fatal(err)
	}
	return sb.Status.Phase
}

func TestCreateComposesReadinessWithSession(t *testing.T) {
	e, _, d := newEngine(t)
	ctx := t.Context()
	sb, err := e.Create(ctx, &openshellv1.CreateSandboxRequest{Name: "demo"})
	if err != nil {
		t.Fatal(err)
	}
	if sb.Spec.Template.Image != "default-image" {
		t.Errorf("image = %q, want driver default", sb.Spec.Template.Image)
	}
	if d.tokens[0] != "tok-"+sb.Metadata.Id {
		t.Errorf("driver got token %q", d.tokens[0])
	}
	if got := phase(t, e, "demo"); got != openshellv1.SandboxPhase_SANDBOX_PHASE_PROVISIONING {
		t.Fatalf("phase before session = %v, want PROVISIONING", got)
	}
	got, _ := e.Get(ctx, "", "demo")
	if c := got.Status.Conditions[0]; c.Reason != ReasonSupervisorNotConnected || c.Message != "Backend ready; waiting for supervisor session" {
		t.Errorf("condition = %v", c)
	}
	e.SessionChanged(ctx, sb.Metadata.Id, true, "inst-1")
	if got := phase(t, e, "demo"); got != openshellv1.SandboxPhase_SANDBOX_PHASE_READY {
		t.Fatalf("phase with session = %v, want READY", got)
	}
	e.SessionChanged(ctx, sb.Metadata.Id, false, "")
	got, _ = e.Get(ctx, "", "demo")
	if got.Status.Phase != openshellv1.SandboxPhase_SANDBOX_PHASE_PROVISIONING {
		t.Fatalf("phase after session end = %v, want PROVISIONING", got.Status.Phase)
	}
	// Main process exit: ERROR with the code, sticky across sessions.
	e.SessionChanged(ctx, sb.Metadata.Id, true, "inst-1")
	if err := e.ReportMainProcessExit(ctx, sb.Metadata.Id, "stale", 0); errdefs.Code(err) != codes.FailedPrecondition {
		t.Fatalf("stale exit report = %v, want FailedPrecondition", err)
	}
	if err := e.ReportMainProcessExit(ctx, sb.Metadata.Id, "inst-1", 0); err != nil {
		t.Fatal(err)
	}
	e.SessionChanged(ctx, sb.Metadata.Id, true, "inst-1")
	got, _ = e.Get(ctx, "", "demo")
	if got.Status.Phase != openshellv1.SandboxPhase_SANDBOX_PHASE_ERROR || got.Status.ExitCode == nil || *got.Status.ExitCode != 0 {
		t.Fatalf("after exit: phase %v exit %v, want ERROR 0", got.Status.Phase, got.Status.ExitCode)
	}
}

func TestCreateRejectionsLeaveNothing(t *testing.T) {
	tests := []struct {
		name string
		req  *openshellv1.CreateSandboxRequest
		prep func(*fakeDriver)
		code codes.Code
		msg  string
	}{
		{"too long", &openshellv1.CreateSandboxRequest{Name: "abcdefghijklmnopqrst"}, nil, codes.InvalidArgument, "name exceeds maximum length (20 > 19)"},
		{"uppercase", &openshellv1.CreateSandboxRequest{Name: "Demo"}, nil, codes.InvalidArgument, "lowercase"},
		{"bad label", &openshellv1.CreateSandboxRequest{Name: "a", Labels: map[string]string{"k": "-bad"}}, nil, codes.InvalidArgument, `label "k" value`},
		{"unsafe policy", &openshellv1.CreateSandboxRequest{Name: "a", Spec: &openshellv1.SandboxSpec{Policy: unsafePolicy()}}, nil, codes.InvalidArgument, unsafePolicyMessage},
		{"unknown provider", &openshellv1.CreateSandboxRequest{Name: "a", Spec: &openshellv1.SandboxSpec{Providers: []string{"gh"}}}, nil, codes.FailedPrecondition, "provider 'gh' not found"},
		{"sa on non-k8s", &openshellv1.CreateSandboxRequest{Name: "a", Spec: &openshellv1.SandboxSpec{Template: &openshellv1.SandboxTemplate{ServiceAccountName: "sa"}}}, nil, codes.InvalidArgument, "template.service_account_name is not supported by the fake compute driver"},
		{"driver validate", &openshellv1.CreateSandboxRequest{Name: "a"}, func(d *fakeDriver) {
			d.validateFn = func(compute.Sandbox) error { return errdefs.InvalidArgument("process driver cannot pull images") }
		}, codes.InvalidArgument, "cannot pull images"},
		{"driver create fails internal", &openshellv1.CreateSandboxRequest{Name: "a"}, func(d *fakeDriver) { d.createErr = errors.New("boom") }, codes.Internal, "internal error"},
		{"driver create precondition kept", &openshellv1.CreateSandboxRequest{Name: "a"}, func(d *fakeDriver) { d.createErr = errdefs.FailedPrecondition("no cgroups") }, codes.FailedPrecondition, "no cgroups"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, st, d := newEngine(t)
			if tt.prep != nil {
				tt.prep(d)
			}
			_, err := e.Create(t.Context(), tt.req)
			st2 := errdefs.ToGRPC(err)
			if errdefs.Code(st2) != tt.code || !strings.Contains(st2.Error(), tt.msg) {
				t.Fatalf("Create = %v, want %v containing %q", st2, tt.code, tt.msg)
			}
			if len(st.rows) != 0 || len(d.sandboxes) != 0 {
				t.Fatalf("rejected create left %d rows, %d backends", len(st.rows), len(d.sandboxes))
			}
		})
	}
}

// unsafePolicy breaks three of OpenShell's policy rules at once.
func unsafePolicy() *sandboxv1.SandboxPolicy {
	return &sandboxv1.SandboxPolicy{
		Process:    &sandboxv1.ProcessPolicy{RunAsUser: "root"},
		Filesystem: &sandboxv1.FilesystemPolicy{ReadOnly: []string{"/usr/../etc/shadow"}, ReadWrite: []string{"/"}},
	}
}

const unsafePolicyMessage = "policy contains unsafe content: " +
	"run_as_user must be 'sandbox' or a numeric UID/GID in range [1, 4294967294], got 'root'; " +
	"path contains '..' traversal component: /usr/../etc/shadow; " +
	"read-write path is overly broad: /"

func TestDuplicateName(t *testing.T) {
	e, _, _ := newEngine(t)
	if _, err := e.Create(t.Context(), &openshellv1.CreateSandboxRequest{Name: "a"}); err != nil {
		t.Fatal(err)
	}
	_, err := e.Create(t.Context(), &openshellv1.CreateSandboxRequest{Name: "a"})
	if errdefs.Code(err) != codes.AlreadyExists {
		t.Fatalf("duplicate = %v, want AlreadyExists", err)
	}
}

func TestStopStartDelete(t *testing.T) {
	e, st, d := newEngine(t)
	ctx := t.Context()
	sb, err := e.Create(ctx, &openshellv1.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	name := sb.Metadata.Name
	if err := ValidateSandboxName(name); err != nil || name == "" {
		t.Fatalf("generated name %q: %v", name, err)
	}
	e.SessionChanged(ctx, sb.Metadata.Id, true, "i")
	for range 2 { // idempotent
		got, err := e.Stop(ctx, "", name)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status.Phase != openshellv1.SandboxPhase_SANDBOX_PHASE_STOPPED {
			t.Fatalf("after stop = %v, want STOPPED", got.Status.Phase)
		}
	}
	got, err := e.Start(ctx, "", name)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.Phase != openshellv1.SandboxPhase_SANDBOX_PHASE_READY {
		t.Fatalf("after start with live session = %v, want READY", got.Status.Phase)
	}
	ok, err := e.Delete(ctx, "", name)
	if err != nil || !ok {
		t.Fatalf("Delete = %v, %v", ok, err)
	}
	if len(st.rows) != 0 || len(d.sandboxes) != 0 {
		t.Fatalf("delete left %d rows, %d backends", len(st.rows), len(d.sandboxes))
	}
	if _, err := e.Get(ctx, "", name); errdefs.Code(err) != codes.NotFound {
		t.Fatalf("Get after delete = %v, want NotFound", err)
	}
}

func TestRecoverRemovesOrphans(t *testing.T) {
	e, st, d := newEngine(t)
	ctx := t.Context()
	// A row whose create never reached the driver, and a backend without a row.
	half, _ := e.Create(ctx, &openshellv1.CreateSandboxRequest{Name: "half"})
	delete(d.sandboxes, half.Metadata.Id)
	d.sandboxes["orphan"] = compute.Sandbox{ID: "orphan", Name: "orphan"}
	kept, _ := e.Create(ctx, &openshellv1.CreateSandboxRequest{Name: "kept"})
	// A delete interrupted after DELETING was persisted.
	del, _ := e.Create(ctx, &openshellv1.CreateSandboxRequest{Name: "del"})
	if _, err := e.mutate(ctx, del.Metadata.Id, func(sb *openshellv1.Sandbox) bool {
		sb.Status.Phase = openshellv1.SandboxPhase_SANDBOX_PHASE_DELETING
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if err := e.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := st.rows[kept.Metadata.Id]; !ok || len(st.rows) != 1 {
		t.Fatalf("rows after recover = %d, want only kept", len(st.rows))
	}
	if _, ok := d.sandboxes[kept.Metadata.Id]; !ok || len(d.sandboxes) != 1 {
		t.Fatalf("backends after recover = %d, want only kept", len(d.sandboxes))
	}
}

func TestComposePhase(t *testing.T) {
	present := func(conds ...compute.Condition) backendView {
		return backendView{present: true, sb: compute.Sandbox{Status: compute.Status{Conditions: conds}}}
	}
	readyC := compute.Condition{Type: "Ready", Status: "True"}
	tests := []struct {
		name    string
		current openshellv1.SandboxPhase
		b       backendView
		session bool
		want    openshellv1.SandboxPhase
	}{
		{"backend ready no session", openshellv1.SandboxPhase_SANDBOX_PHASE_PROVISIONING, present(readyC), false, openshellv1.SandboxPhase_SANDBOX_PHASE_PROVISIONING},
		{"both ready", openshellv1.SandboxPhase_SANDBOX_PHASE_PROVISIONING, present(readyC), true, openshellv1.SandboxPhase_SANDBOX_PHASE_READY},
		{"session beats lagging backend", openshellv1.SandboxPhase_SANDBOX_PHASE_PROVISIONING, backendView{}, true, openshellv1.SandboxPhase_SANDBOX_PHASE_READY},
		{"error sticky", openshellv1.SandboxPhase_SANDBOX_PHASE_ERROR, present(readyC), true, openshellv1.SandboxPhase_SANDBOX_PHASE_ERROR},
		{"terminal reason", openshellv1.SandboxPhase_SANDBOX_PHASE_READY, present(compute.Condition{Type: "Ready", Status: "False", Reason: "ProcessExited"}), false, openshellv1.SandboxPhase_SANDBOX_PHASE_ERROR},
		{"stopping to stopped", openshellv1.SandboxPhase_SANDBOX_PHASE_STOPPING, present(compute.Condition{Type: "Suspended", Status: "True"}), false, openshellv1.SandboxPhase_SANDBOX_PHASE_STOPPED},
		{"stopping while running", openshellv1.SandboxPhase_SANDBOX_PHASE_STOPPING, present(readyC), true, openshellv1.SandboxPhase_SANDBOX_PHASE_STOPPING},
		{"starting waits for session", openshellv1.SandboxPhase_SANDBOX_PHASE_STARTING, present(readyC), false, openshellv1.SandboxPhase_SANDBOX_PHASE_STARTING},
		{"deleting stays", openshellv1.SandboxPhase_SANDBOX_PHASE_DELETING, present(readyC), true, openshellv1.SandboxPhase_SANDBOX_PHASE_DELETING},
		{"session beats stale suspended snapshot", openshellv1.SandboxPhase_SANDBOX_PHASE_READY, present(compute.Condition{Type: "Suspended", Status: "True"}), true, openshellv1.SandboxPhase_SANDBOX_PHASE_READY},
		{"suspended without session", openshellv1.SandboxPhase_SANDBOX_PHASE_READY, present(compute.Condition{Type: "Suspended", Status: "True"}), false, openshellv1.SandboxPhase_SANDBOX_PHASE_STOPPED},
		{"backend deleting", openshellv1.SandboxPhase_SANDBOX_PHASE_READY, backendView{present: true, sb: compute.Sandbox{Status: compute.Status{Deleting: true}}}, true, openshellv1.SandboxPhase_SANDBOX_PHASE_DELETING},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got, _ := composePhase(tt.current, tt.b, tt.session); got != tt.want {
				t.Errorf("composePhase(%v) = %v, want %v", tt.current, got, tt.want)
			}
		})
	}
}

func TestSetCurrentPolicyVersion(t *testing.T) {
	e, st, _ := newEngine(t)
	sb, err := e.Create(t.Context(), &openshellv1.CreateSandboxRequest{Name: "pv"})
	if err != nil {
		t.Fatal(err)
	}
	updates, stop := e.Subscribe(sb.Metadata.Id)
	defer stop()
	if err := e.SetCurrentPolicyVersion(t.Context(), sb.Metadata.Id, 3); err != nil {
		t.Fatal(err)
	}
	if got, err := st.GetSandbox(t.Context(), sb.Metadata.Id); err != nil || got.GetStatus().GetCurrentPolicyVersion() != 3 {
		t.Errorf("stored sandbox = %v, %v; want current_policy_version 3", got.GetStatus(), err)
	}
	timeout := time.After(10 * time.Second)
	for published := false; !published; {
		select {
		case u := <-updates:
			published = u.Sandbox.GetStatus().GetCurrentPolicyVersion() == 3
		case <-timeout:
			t.Fatal("no update with current_policy_version 3 published")
		}
	}
	if err := e.SetCurrentPolicyVersion(t.Context(), "missing", 1); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("SetCurrentPolicyVersion(missing) = %v, want NotFound", err)
	}
}
