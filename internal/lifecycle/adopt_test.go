package lifecycle

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// fakeAdopter is a fakeDriver whose backend also has bare workloads that
// can be adopted: workloads maps a name to the sandbox id its labels name
// ("" = not managed).
type fakeAdopter struct {
	*fakeDriver
	amu       sync.Mutex
	workloads map[string]string
	calls     []compute.AdoptRequest
	dryErr    error // returned by dry runs
	writeErr  error // returned by real runs
	written   bool  // whether a failing real run still labelled the workload
	suspended bool  // the workload is suspended by its owner
	disabled  error // adoption switched off: every call fails with it, as the kubernetes driver's
	// duringWrite runs inside a real run (the pod restarting).
	duringWrite func()
}

func (d *fakeAdopter) AdoptionEnabled(context.Context) error {
	d.amu.Lock()
	defer d.amu.Unlock()
	return d.disabled
}

func (d *fakeAdopter) Adopt(_ context.Context, req compute.AdoptRequest) (compute.AdoptResult, error) {
	d.amu.Lock()
	defer d.amu.Unlock()
	d.calls = append(d.calls, req)
	if d.disabled != nil {
		return compute.AdoptResult{}, d.disabled
	}
	owner, ok := d.workloads[req.Sandbox.Name]
	if !ok {
		return compute.AdoptResult{}, errdefs.NotFound("sandbox not found")
	}
	if owner != "" && owner != req.Sandbox.ID {
		return compute.AdoptResult{}, errdefs.FailedPrecondition("already managed as sandbox " + owner)
	}
	view := compute.Sandbox{ID: owner, Name: req.Sandbox.Name, Namespace: "ns", Status: compute.Status{SandboxName: req.Sandbox.Name, Conditions: ready("False", "PodNotReady")}}
	if d.suspended {
		view.Status.Conditions = append(ready("False", "Suspended"), compute.Condition{Type: compute.ConditionSuspended, Status: "True"})
	}
	if req.DryRun {
		return compute.AdoptResult{Sandbox: view, BackendUID: "uid-1"}, d.dryErr
	}
	if d.writeErr != nil && !d.written {
		return compute.AdoptResult{}, d.writeErr
	}
	if d.duringWrite != nil {
		d.duringWrite()
	}
	d.workloads[req.Sandbox.Name] = req.Sandbox.ID
	view.ID = req.Sandbox.ID
	d.mu.Lock()
	d.sandboxes[req.Sandbox.ID] = view
	d.tokens = append(d.tokens, req.Sandbox.Spec.SandboxToken)
	d.mu.Unlock()
	return compute.AdoptResult{Sandbox: view, BackendUID: "uid-1"}, d.writeErr
}

func (d *fakeAdopter) realCalls() int {
	d.amu.Lock()
	defer d.amu.Unlock()
	n := 0
	for _, c := range d.calls {
		if !c.DryRun {
			n++
		}
	}
	return n
}

type countingIssuer struct {
	mu sync.Mutex
	n  int
}

func (c *countingIssuer) Mint(id string) (string, time.Time, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	return "tok-" + id, time.Time{}, nil
}

func newAdoptEngine(t *testing.T) (*Engine, *memStore, *fakeAdopter, *countingIssuer) {
	t.Helper()
	st := newMemStore()
	d := &fakeAdopter{fakeDriver: newFakeDriver(), workloads: map[string]string{"bare": ""}}
	iss := &countingIssuer{}
	e, err := New(t.Context(), Options{Store: st, Driver: d, Issuer: iss, DriverName: "kubernetes"})
	if err != nil {
		t.Fatal(err)
	}
	return e, st, d, iss
}

func TestAdoptRequiresAnAdopter(t *testing.T) {
	e, st, _ := newEngine(t)
	_, err := e.Adopt(t.Context(), &openshellv1.AdoptSandboxRequest{Name: "bare"})
	if errdefs.Code(err) != codes.FailedPrecondition || err.Error() != "adoption is only supported by the kubernetes driver" {
		t.Fatalf("Adopt on a driver without adoption = %v", err)
	}
	if len(st.rows) != 0 {
		t.Errorf("rows = %d, want 0", len(st.rows))
	}
}

func TestAdopt(t *testing.T) {
	e, st, d, iss := newAdoptEngine(t)
	ctx := t.Context()
	sb, err := e.Adopt(ctx, &openshellv1.AdoptSandboxRequest{Name: "bare", Labels: map[string]string{"team": "a"}, AgentContainer: "agent", Namespace: "ns"})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.GetMetadata().GetId()
	if sb.GetStatus().GetPhase() != openshellv1.SandboxPhase_SANDBOX_PHASE_STARTING || sb.GetMetadata().GetLabels()["team"] != "a" {
		t.Errorf("adopted sandbox = %v", sb)
	}
	if len(d.calls) != 2 || !d.calls[0].DryRun || d.calls[1].DryRun || d.calls[1].AgentContainer != "agent" || d.calls[1].Namespace != "ns" {
		t.Errorf("driver calls = %+v, want a dry run then the adoption", d.calls)
	}
	if d.calls[0].Sandbox.Spec.SandboxToken != "" || d.tokens[0] != "tok-"+id {
		t.Errorf("dry run token %q, adoption token %q", d.calls[0].Sandbox.Spec.SandboxToken, d.tokens[0])
	}
	if d.workloads["bare"] != id || len(st.rows) != 1 {
		t.Errorf("workload owner %q rows %d", d.workloads["bare"], len(st.rows))
	}
	var adopted []*openshellv1.PlatformEvent // besides phase transitions
	for _, ev := range e.EventTail(id, 0) {
		if !strings.HasPrefix(ev.GetReason(), ReasonPhasePrefix) {
			adopted = append(adopted, ev)
		}
	}
	if len(adopted) != 1 || adopted[0].GetReason() != ReasonAdopted || !strings.Contains(adopted[0].GetMessage(), "ns/bare (uid uid-1)") {
		t.Errorf("events = %v", adopted)
	}
	// Snapshots of the restart's suspension arrive late: still STARTING.
	e.apply(ctx, compute.Event{Kind: compute.EventSandbox, Sandbox: compute.Sandbox{ID: id, Name: "bare", Status: compute.Status{
		Conditions: append(ready("False", "Suspended"), compute.Condition{Type: compute.ConditionSuspended, Status: "True"}),
	}}})
	if got := phase(t, e, "bare"); got != openshellv1.SandboxPhase_SANDBOX_PHASE_STARTING {
		t.Errorf("phase after a late suspended snapshot = %v, want STARTING", got)
	}
	d.set(id, ready("True", "Running"))
	e.refreshBackend(ctx, sb)
	e.SessionChanged(ctx, id, true, "inst")
	if got := phase(t, e, "bare"); got != openshellv1.SandboxPhase_SANDBOX_PHASE_READY {
		t.Errorf("phase with backend ready and session = %v", got)
	}

	// Again: the same sandbox, nothing written, no token minted.
	mints := iss.n
	again, err := e.Adopt(ctx, &openshellv1.AdoptSandboxRequest{Name: "bare"})
	if err != nil || again.GetMetadata().GetId() != id {
		t.Fatalf("adopt again = %v, %v; want the same sandbox %s", again, err, id)
	}
	if d.realCalls() != 1 || iss.n != mints {
		t.Errorf("adopt again wrote %d times, minted %d tokens", d.realCalls()-1, iss.n-mints)
	}
	// Re-enrich: one more real call with Reenrich, same id, an event. The
	// old supervisor's session has not been reported as ended when the
	// driver returns; the restart's suspended snapshots arrive late: the
	// sandbox stays STARTING, then READY with the new supervisor.
	d.duringWrite = func() {}
	re, err := e.Adopt(ctx, &openshellv1.AdoptSandboxRequest{Name: "bare", Reenrich: true})
	if err != nil || re.GetMetadata().GetId() != id {
		t.Fatalf("reenrich = %v, %v", re, err)
	}
	if last := d.calls[len(d.calls)-1]; last.DryRun || !last.Reenrich || last.Sandbox.ID != id {
		t.Errorf("reenrich call = %+v", last)
	}
	if evs := e.EventTail(id, 0); evs[len(evs)-1].GetReason() != ReasonReenriched {
		t.Errorf("last event = %v", evs[len(evs)-1])
	}
	if got := re.GetStatus().GetPhase(); got != openshellv1.SandboxPhase_SANDBOX_PHASE_STARTING {
		t.Errorf("phase during the re-enrich restart = %v, want STARTING", got)
	}
	e.apply(ctx, compute.Event{Kind: compute.EventSandbox, Sandbox: compute.Sandbox{ID: id, Name: "bare", Status: compute.Status{
		Conditions: append(ready("False", "Suspended"), compute.Condition{Type: compute.ConditionSuspended, Status: "True"}),
	}}})
	// The old supervisor reports its main process's exit (SIGTERM) and
	// its session's end, late: neither is an ERROR or a stop.
	if err := e.ReportMainProcessExit(ctx, id, "inst", 143); errdefs.Code(err) != codes.FailedPrecondition {
		t.Errorf("old instance's exit report = %v, want FailedPrecondition (stale)", err)
	}
	e.SessionChanged(ctx, id, false, "")
	if got := phase(t, e, "bare"); got != openshellv1.SandboxPhase_SANDBOX_PHASE_STARTING {
		t.Errorf("phase after late restart snapshots = %v, want STARTING", got)
	}
	e.SessionChanged(ctx, id, true, "inst-2")
	got, _ := e.Get(ctx, "", "bare")
	if got.GetStatus().GetPhase() != openshellv1.SandboxPhase_SANDBOX_PHASE_READY || got.GetStatus().GetMainProcessInstanceId() != "inst-2" {
		t.Errorf("with the new supervisor: phase %v instance %q, want READY inst-2", got.GetStatus().GetPhase(), got.GetStatus().GetMainProcessInstanceId())
	}
	if len(st.rows) != 1 {
		t.Errorf("rows = %d, want 1", len(st.rows))
	}
}

func TestAdoptSuspendedWorkloadIsStopped(t *testing.T) {
	e, _, d, _ := newAdoptEngine(t)
	d.suspended = true
	sb, err := e.Adopt(t.Context(), &openshellv1.AdoptSandboxRequest{Name: "bare"})
	if err != nil {
		t.Fatal(err)
	}
	if got := sb.GetStatus().GetPhase(); got != openshellv1.SandboxPhase_SANDBOX_PHASE_STOPPED {
		t.Errorf("adopting a suspended workload: phase %v, want STOPPED", got)
	}
}

// TestAdoptDisabled checks that with adoption switched off every adoption
// says so, also one naming a sandbox adopted before the switch was turned
// off (not AlreadyExists, which would send the caller looking for a name
// clash).
func TestAdoptDisabled(t *testing.T) {
	e, st, d, _ := newAdoptEngine(t)
	d.workloads["other"] = ""
	if _, err := e.Adopt(t.Context(), &openshellv1.AdoptSandboxRequest{Name: "bare"}); err != nil {
		t.Fatal(err)
	}
	d.amu.Lock()
	d.disabled = errdefs.FailedPrecondition("sandbox adoption is disabled on this gateway")
	d.amu.Unlock()
	for _, name := range []string{"bare", "other"} {
		_, err := e.Adopt(t.Context(), &openshellv1.AdoptSandboxRequest{Name: name})
		if errdefs.Code(err) != codes.FailedPrecondition || err.Error() != "sandbox adoption is disabled on this gateway" {
			t.Errorf("Adopt(%s) with adoption disabled = %v, want FailedPrecondition \"sandbox adoption is disabled on this gateway\"", name, err)
		}
	}
	if len(st.rows) != 1 {
		t.Errorf("rows = %d, want the one adopted before", len(st.rows))
	}
}

func TestAdoptNameTakenByAnotherSandbox(t *testing.T) {
	e, st, d, _ := newAdoptEngine(t)
	// A sandbox created normally under the name of a bare workload.
	if _, err := e.Create(t.Context(), &openshellv1.CreateSandboxRequest{Name: "bare"}); err != nil {
		t.Fatal(err)
	}
	_, err := e.Adopt(t.Context(), &openshellv1.AdoptSandboxRequest{Name: "bare"})
	if errdefs.Code(err) != codes.AlreadyExists || !strings.Contains(err.Error(), `sandbox "bare" already exists in workspace "default"`) {
		t.Fatalf("Adopt(taken) = %v, want AlreadyExists", err)
	}
	if d.realCalls() != 0 || d.workloads["bare"] != "" || len(st.rows) != 1 {
		t.Errorf("adopting a taken name wrote: calls %d owner %q rows %d", d.realCalls(), d.workloads["bare"], len(st.rows))
	}
}

func TestAdoptRejectionsLeaveNothing(t *testing.T) {
	tests := []struct {
		name string
		req  *openshellv1.AdoptSandboxRequest
		prep func(*fakeAdopter)
		code codes.Code
		msg  string
		// adopted: the failing write still labelled the workload.
		adopted bool
	}{
		{"empty name", &openshellv1.AdoptSandboxRequest{}, nil, codes.InvalidArgument, "name is required", false},
		{"bad name", &openshellv1.AdoptSandboxRequest{Name: "Bare"}, nil, codes.InvalidArgument, "lowercase", false},
		{"bad label", &openshellv1.AdoptSandboxRequest{Name: "bare", Labels: map[string]string{"k": "-x"}}, nil, codes.InvalidArgument, `label "k" value`, false},
		{"command", &openshellv1.AdoptSandboxRequest{Name: "bare", Spec: &openshellv1.SandboxSpec{Command: []string{"sh"}}}, nil, codes.InvalidArgument, "spec.command cannot be set", false},
		{"image", &openshellv1.AdoptSandboxRequest{Name: "bare", Spec: &openshellv1.SandboxSpec{Template: &openshellv1.SandboxTemplate{Image: "x:1"}}}, nil, codes.InvalidArgument, "spec.template.image cannot be set", false},
		{"unsafe policy", &openshellv1.AdoptSandboxRequest{Name: "bare", Spec: &openshellv1.SandboxSpec{Policy: unsafePolicy()}}, nil, codes.InvalidArgument, unsafePolicyMessage, false},
		{"unknown provider", &openshellv1.AdoptSandboxRequest{Name: "bare", Spec: &openshellv1.SandboxSpec{Providers: []string{"gh"}}}, nil, codes.FailedPrecondition, "provider 'gh' not found", false},
		{"not found", &openshellv1.AdoptSandboxRequest{Name: "missing"}, nil, codes.NotFound, "not found", false},
		{"disabled", &openshellv1.AdoptSandboxRequest{Name: "bare"}, func(d *fakeAdopter) {
			d.dryErr = errdefs.FailedPrecondition("sandbox adoption is disabled on this gateway")
		}, codes.FailedPrecondition, "disabled", false},
		{"ambiguous container", &openshellv1.AdoptSandboxRequest{Name: "bare"}, func(d *fakeAdopter) {
			d.dryErr = errdefs.InvalidArgument("containers a, b")
		}, codes.InvalidArgument, "containers a, b", false},
		{"concurrent edit", &openshellv1.AdoptSandboxRequest{Name: "bare"}, func(d *fakeAdopter) {
			d.writeErr = errdefs.Conflict("changed while it was being adopted")
		}, codes.Aborted, "changed while", false},
		{"internal before write", &openshellv1.AdoptSandboxRequest{Name: "bare"}, func(d *fakeAdopter) {
			d.writeErr = errors.New("boom")
		}, codes.Internal, "", false},
		{"unavailable after write", &openshellv1.AdoptSandboxRequest{Name: "bare"}, func(d *fakeAdopter) {
			d.writeErr, d.written = errdefs.Unavailable("pod did not stop"), true
		}, codes.Unavailable, "pod did not stop", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, st, d, iss := newAdoptEngine(t)
			if tt.prep != nil {
				tt.prep(d)
			}
			_, err := e.Adopt(t.Context(), tt.req)
			if errdefs.Code(err) != tt.code || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("Adopt = %v (%v), want %v containing %q", err, errdefs.Code(err), tt.code, tt.msg)
			}
			if tt.adopted {
				// The workload carries the id: the row stays so that the
				// reconciler does not delete the workload as an orphan.
				if len(st.rows) != 1 {
					t.Fatalf("rows = %d, want the adopted sandbox kept", len(st.rows))
				}
				return
			}
			if len(st.rows) != 0 {
				t.Errorf("rejected adoption left %d rows", len(st.rows))
			}
			if d.workloads["bare"] != "" {
				t.Errorf("rejected adoption labelled the workload as %q", d.workloads["bare"])
			}
			if d.writeErr == nil && (d.realCalls() != 0 || iss.n != 0) {
				t.Errorf("rejected adoption wrote %d times and minted %d tokens", d.realCalls(), iss.n)
			}
		})
	}
}
