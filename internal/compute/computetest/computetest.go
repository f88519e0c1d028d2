// Package computetest is the conformance suite every compute.Driver runs:
//
//	computetest.Run(t, func(t *testing.T) compute.Driver { ... }, computetest.Options{...})
//
// Each subtest gets a fresh driver from newDriver and cleans up the
// sandboxes it creates. Options let a driver skip what its backend cannot
// do, always with a reason.
package computetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// Options tune the suite for one driver.
type Options struct {
	// Sandbox returns a valid sandbox with the given id and name. Nil
	// means a minimal sandbox with only id and name set.
	Sandbox func(id, name string) compute.Sandbox
	// Invalid are extra driver-specific sandboxes ValidateCreate and
	// Create must reject with InvalidArgument or FailedPrecondition,
	// keyed by case name. Empty id and empty name are always checked.
	Invalid map[string]func(id, name string) compute.Sandbox
	// NotReadyReason, when set, skips waiting for backend readiness
	// (Ready=True) and says why the backend cannot become ready here.
	NotReadyReason string
	// MakeReady, when set, is called each time the suite starts waiting
	// for Ready=True (after Create and after Start), for backends where
	// something outside the driver makes the workload ready (a test
	// standing in for a kubelet). It may block until it has done so.
	MakeReady func(t *testing.T, sb compute.Sandbox)
	// NoStopStartReason, when set, skips the stop/start checks.
	NoStopStartReason string
	// Timeout bounds each wait for an event; zero means 30s.
	Timeout time.Duration
}

func (o Options) timeout() time.Duration {
	if o.Timeout > 0 {
		return o.Timeout
	}
	return 30 * time.Second
}

func (o Options) sandbox(id, name string) compute.Sandbox {
	if o.Sandbox != nil {
		return o.Sandbox(id, name)
	}
	return compute.Sandbox{ID: id, Name: name}
}

// Run runs the conformance suite.
func Run(t *testing.T, newDriver func(t *testing.T) compute.Driver, opts Options) {
	t.Run("Capabilities", func(t *testing.T) { testCapabilities(t, newDriver(t)) })
	t.Run("ValidateCreate", func(t *testing.T) { testValidateCreate(t, newDriver(t), opts) })
	t.Run("UnselectableServiceAccount", func(t *testing.T) { testUnselectableServiceAccount(t, newDriver(t), opts) })
	t.Run("NotFound", func(t *testing.T) { testNotFound(t, newDriver(t)) })
	t.Run("Lifecycle", func(t *testing.T) { testLifecycle(t, newDriver(t), opts) })
}

// NewID returns a random sandbox id.
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-4" + h[13:16] + "-8" + h[17:20] + "-" + h[20:32]
}

// NewName returns a random DNS-1123 sandbox name of at most 19 characters.
func NewName() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "ct-" + hex.EncodeToString(b[:])
}

func wantCode(t *testing.T, what string, err error, codes ...codes.Code) {
	t.Helper()
	if !slices.Contains(codes, errdefs.Code(err)) {
		t.Errorf("%s error = %v (code %v), want code in %v", what, err, errdefs.Code(err), codes)
	}
}

func testCapabilities(t *testing.T, d compute.Driver) {
	caps, err := d.Capabilities(t.Context())
	if err != nil {
		t.Fatalf("Capabilities() error = %v", err)
	}
	if caps.DriverName == "" {
		t.Errorf("Capabilities().DriverName is empty")
	}
	if _, err := compute.ListenerRequirements(t.Context(), d); err != nil {
		t.Errorf("ListenerRequirements() error = %v", err)
	}
	if err := compute.EnsureWorkspace(t.Context(), d, "default"); err != nil {
		t.Errorf("EnsureWorkspace(default) error = %v", err)
	}
}

// testUnselectableServiceAccount checks the gateway's create path
// (CheckTemplate, then ValidateCreate) refuses a ServiceAccount the driver
// cannot select, whether or not it selects ServiceAccounts at all.
func testUnselectableServiceAccount(t *testing.T, d compute.Driver, opts Options) {
	caps, err := d.Capabilities(t.Context())
	if err != nil {
		t.Fatalf("Capabilities() error = %v", err)
	}
	sb := opts.sandbox(NewID(), NewName())
	sb.Spec.Template.ServiceAccountName = "openshell-conformance-not-selectable"
	err = compute.CheckTemplate(d, caps.DriverName, sb.Spec.Template)
	if err == nil {
		err = d.ValidateCreate(t.Context(), sb)
	}
	wantCode(t, "CheckTemplate+ValidateCreate(unselectable service account)", err, codes.InvalidArgument)
}

func testValidateCreate(t *testing.T, d compute.Driver, opts Options) {
	good := opts.sandbox(NewID(), NewName())
	if err := d.ValidateCreate(t.Context(), good); err != nil {
		t.Fatalf("ValidateCreate(good) error = %v", err)
	}
	invalid := map[string]func(id, name string) compute.Sandbox{
		"empty id":   func(_, name string) compute.Sandbox { return opts.sandbox("", name) },
		"empty name": func(id, _ string) compute.Sandbox { return opts.sandbox(id, "") },
	}
	for k, v := range opts.Invalid {
		invalid[k] = v
	}
	for name, mk := range invalid {
		t.Run(name, func(t *testing.T) {
			sb := mk(NewID(), NewName())
			wantCode(t, "ValidateCreate", d.ValidateCreate(t.Context(), sb), codes.InvalidArgument, codes.FailedPrecondition)
			err := d.Create(t.Context(), sb)
			wantCode(t, "Create", err, codes.InvalidArgument, codes.FailedPrecondition)
			if err == nil {
				_, _ = d.Delete(context.WithoutCancel(t.Context()), compute.Ref{ID: sb.ID, Name: sb.Name})
				return
			}
			if sb.ID != "" {
				_, err := d.Get(t.Context(), compute.Ref{ID: sb.ID})
				wantCode(t, "Get after rejected Create", err, codes.NotFound)
			}
		})
	}
}

func testNotFound(t *testing.T, d compute.Driver) {
	ref := compute.Ref{ID: NewID(), Name: NewName()}
	_, err := d.Get(t.Context(), ref)
	wantCode(t, "Get(missing)", err, codes.NotFound)
	wantCode(t, "Stop(missing)", d.Stop(t.Context(), ref), codes.NotFound)
	wantCode(t, "Start(missing)", d.Start(t.Context(), ref), codes.NotFound)
	deleted, err := d.Delete(t.Context(), ref)
	if err != nil || deleted {
		t.Errorf("Delete(missing) = %v, %v, want false, nil", deleted, err)
	}
}

// watcher collects events from one Watch.
type watcher struct {
	t       *testing.T
	ch      <-chan compute.Event
	timeout time.Duration
}

// next waits for an event for id that satisfies pred.
func (w *watcher) next(id, what string, pred func(compute.Event) bool) compute.Event {
	w.t.Helper()
	timer := time.NewTimer(w.timeout)
	defer timer.Stop()
	for {
		select {
		case ev, ok := <-w.ch:
			if !ok {
				w.t.Fatalf("watch ended while waiting for %s", what)
			}
			if ev.SandboxID == id && pred(ev) {
				return ev
			}
		case <-timer.C:
			w.t.Fatalf("no watch event %s for %s within %v", what, id, w.timeout)
		}
	}
}

// Cond returns the condition of type typ, if any.
func Cond(sb compute.Sandbox, typ string) (compute.Condition, bool) {
	for _, c := range sb.Status.Conditions {
		if c.Type == typ {
			return c, true
		}
	}
	return compute.Condition{}, false
}

// IsReady reports whether the backend reports Ready=True.
func IsReady(sb compute.Sandbox) bool {
	c, ok := Cond(sb, compute.ConditionReady)
	return ok && c.Status == "True"
}

// IsStopped reports whether the backend reports Suspended=True or a
// Ready condition that is not True.
func IsStopped(sb compute.Sandbox) bool {
	if c, ok := Cond(sb, compute.ConditionSuspended); ok && c.Status == "True" {
		return true
	}
	c, ok := Cond(sb, compute.ConditionReady)
	return ok && c.Status != "True"
}

func testLifecycle(t *testing.T, d compute.Driver, opts Options) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	events, watchErr, err := d.Watch(ctx)
	if err != nil {
		t.Fatalf("Watch() error = %v", err)
	}
	w := &watcher{t: t, ch: events, timeout: opts.timeout()}

	sb := opts.sandbox(NewID(), NewName())
	if err := d.Create(t.Context(), sb); err != nil {
		t.Fatalf("Create(%s) error = %v", sb.Name, err)
	}
	t.Cleanup(func() { _, _ = d.Delete(context.Background(), compute.Ref{ID: sb.ID}) })

	for _, ref := range []compute.Ref{{ID: sb.ID}, {Name: sb.Name}} {
		got, err := d.Get(t.Context(), ref)
		if err != nil {
			t.Fatalf("Get(%+v) error = %v", ref, err)
		}
		if got.ID != sb.ID || got.Name != sb.Name {
			t.Errorf("Get(%+v) = id %q name %q, want %q %q", ref, got.ID, got.Name, sb.ID, sb.Name)
		}
	}
	list, err := d.List(t.Context())
	if err != nil {
		t.Fatalf("List() error = %v", err)
	}
	if !slices.ContainsFunc(list, func(s compute.Sandbox) bool { return s.ID == sb.ID }) {
		t.Errorf("List() does not contain %s", sb.ID)
	}

	dup := opts.sandbox(sb.ID, NewName())
	wantCode(t, "Create(duplicate id)", d.Create(t.Context(), dup), codes.AlreadyExists)
	dup = opts.sandbox(NewID(), sb.Name)
	wantCode(t, "Create(duplicate name)", d.Create(t.Context(), dup), codes.AlreadyExists)

	ready := opts.NotReadyReason == ""
	if ready {
		if opts.MakeReady != nil {
			opts.MakeReady(t, sb)
		}
		ev := w.next(sb.ID, "Ready=True", func(ev compute.Event) bool {
			return ev.Kind == compute.EventSandbox && IsReady(ev.Sandbox)
		})
		firstInstance := ev.Sandbox.Status.InstanceID

		if opts.NoStopStartReason == "" {
			for i := range 2 {
				if err := d.Stop(t.Context(), compute.Ref{ID: sb.ID}); err != nil {
					t.Fatalf("Stop #%d error = %v", i+1, err)
				}
			}
			w.next(sb.ID, "stopped", func(ev compute.Event) bool {
				return ev.Kind == compute.EventSandbox && IsStopped(ev.Sandbox)
			})
			if got, err := d.Get(t.Context(), compute.Ref{ID: sb.ID}); err != nil || !IsStopped(got) {
				t.Errorf("Get after Stop = %+v, %v, want stopped", got.Status, err)
			}
			if err := d.Start(t.Context(), compute.Ref{Name: sb.Name}); err != nil {
				t.Fatalf("Start error = %v", err)
			}
			if opts.MakeReady != nil {
				opts.MakeReady(t, sb)
			}
			ev := w.next(sb.ID, "Ready=True after Start", func(ev compute.Event) bool {
				return ev.Kind == compute.EventSandbox && IsReady(ev.Sandbox)
			})
			if ev.Sandbox.Status.InstanceID == "" || ev.Sandbox.Status.InstanceID == firstInstance {
				t.Errorf("InstanceID after Start = %q, want new and different from %q", ev.Sandbox.Status.InstanceID, firstInstance)
			}
			if err := d.Start(t.Context(), compute.Ref{ID: sb.ID}); err != nil {
				t.Errorf("second Start error = %v, want nil (idempotent)", err)
			}
		} else {
			t.Logf("skipping stop/start: %s", opts.NoStopStartReason)
		}
	} else {
		w.next(sb.ID, "any sandbox event", func(ev compute.Event) bool { return ev.Kind == compute.EventSandbox })
		t.Logf("not waiting for readiness: %s", opts.NotReadyReason)
	}

	deleted, err := d.Delete(t.Context(), compute.Ref{ID: sb.ID})
	if err != nil || !deleted {
		t.Fatalf("Delete = %v, %v, want true, nil", deleted, err)
	}
	_, err = d.Get(t.Context(), compute.Ref{ID: sb.ID})
	wantCode(t, "Get after Delete", err, codes.NotFound)
	deleted, err = d.Delete(t.Context(), compute.Ref{ID: sb.ID})
	if err != nil || deleted {
		t.Errorf("second Delete = %v, %v, want false, nil", deleted, err)
	}
	w.next(sb.ID, "deleted", func(ev compute.Event) bool { return ev.Kind == compute.EventDeleted })

	cancel()
	for range events {
	}
	if err := watchErr(); err != nil {
		t.Errorf("watch error after cancel = %v, want nil", err)
	}
}
