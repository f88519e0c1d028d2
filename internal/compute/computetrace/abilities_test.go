package computetrace

import (
	"context"
	"errors"
	"io"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// fake implements Driver and every optional ability; each call records
// its method name.
type fake struct{ calls []string }

func (f *fake) rec(m string) { f.calls = append(f.calls, m) }

func (f *fake) Capabilities(context.Context) (compute.Capabilities, error) {
	f.rec("Capabilities")
	return compute.Capabilities{DriverName: "fake"}, nil
}
func (f *fake) ValidateCreate(context.Context, compute.Sandbox) error {
	f.rec("ValidateCreate")
	return nil
}
func (f *fake) Create(context.Context, compute.Sandbox) error { f.rec("Create"); return nil }
func (f *fake) Get(context.Context, compute.Ref) (compute.Sandbox, error) {
	f.rec("Get")
	return compute.Sandbox{}, errdefs.NotFound("sandbox x not found")
}
func (f *fake) List(context.Context) ([]compute.Sandbox, error) { f.rec("List"); return nil, nil }
func (f *fake) Stop(context.Context, compute.Ref) error         { f.rec("Stop"); return nil }
func (f *fake) Start(context.Context, compute.Ref) error        { f.rec("Start"); return nil }
func (f *fake) Delete(context.Context, compute.Ref) (bool, error) {
	f.rec("Delete")
	return true, nil
}
func (f *fake) Watch(context.Context) (<-chan compute.Event, func() error, error) {
	f.rec("Watch")
	return nil, nil, errors.New("no watch")
}
func (f *fake) Close() error                                  { f.rec("Close"); return nil }
func (f *fake) EnsureWorkspace(context.Context, string) error { f.rec("EnsureWorkspace"); return nil }
func (f *fake) DeleteWorkspace(context.Context, string) error { f.rec("DeleteWorkspace"); return nil }
func (f *fake) AdoptionEnabled(context.Context) error         { f.rec("AdoptionEnabled"); return nil }
func (f *fake) SelectsServiceAccounts()                       { f.rec("SelectsServiceAccounts") }
func (f *fake) BootstrapAuthenticator(context.Context) (auth.Authenticator, error) {
	f.rec("BootstrapAuthenticator")
	return nil, nil
}
func (f *fake) Adopt(context.Context, compute.AdoptRequest) (compute.AdoptResult, error) {
	f.rec("Adopt")
	return compute.AdoptResult{}, nil
}
func (f *fake) ListenerRequirements(context.Context) ([]compute.ListenerRequirement, error) {
	f.rec("ListenerRequirements")
	return nil, nil
}

// subset returns f as a driver with only the abilities in mask (plain, not
// traced), built with the same combinations New uses.
func subset(f *fake, mask int) compute.Driver {
	all := abilities{f, f, f, f, f, f}
	a := abilities{}
	if mask&1 != 0 {
		a.closer = all.closer
	}
	if mask&2 != 0 {
		a.scoper = all.scoper
	}
	if mask&4 != 0 {
		a.adopter = all.adopter
	}
	if mask&8 != 0 {
		a.saSelector = all.saSelector
	}
	if mask&16 != 0 {
		a.bootstrap = all.bootstrap
	}
	if mask&32 != 0 {
		a.listeners = all.listeners
	}
	return assemble(f, a)
}

// has lists, by name, which optional abilities d shows to a type assertion.
func has(d compute.Driver) map[string]bool {
	_, closer := d.(io.Closer)
	_, scoper := d.(compute.WorkspaceScoper)
	_, adopter := d.(compute.Adopter)
	_, sa := d.(compute.ServiceAccountSelector)
	_, boot := d.(compute.BootstrapAuthenticatorProvider)
	_, lis := d.(compute.ListenerRequirer)
	return map[string]bool{"Closer": closer, "WorkspaceScoper": scoper, "Adopter": adopter,
		"ServiceAccountSelector": sa, "BootstrapAuthenticatorProvider": boot, "ListenerRequirer": lis}
}

func recordSpans(t *testing.T) (*tracetest.SpanRecorder, *sdktrace.TracerProvider) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetTracerProvider(prev) })
	return rec, tp
}

// TestEveryAbilityCombinationPreserved: for each of the 2^6 combinations
// of optional abilities, the wrapped driver shows exactly the abilities of
// the driver it wraps, and each ability's calls reach the driver as child
// spans of the caller's span.
func TestEveryAbilityCombinationPreserved(t *testing.T) {
	if numAbilities != 6 {
		t.Fatalf("numAbilities = %d: update subset and has with the new ability", numAbilities)
	}
	rec, tp := recordSpans(t)
	for mask := range 1 << numAbilities {
		f := &fake{}
		inner := subset(f, mask)
		want := has(inner)
		n := 0
		for _, v := range want {
			if v {
				n++
			}
		}
		if n != popcount(mask) {
			t.Fatalf("mask %b: fake shows %v", mask, want)
		}
		d := New(inner, "fake")
		got := has(d)
		for k, v := range want {
			if got[k] != v {
				t.Errorf("mask %06b: wrapped %s = %v, driver has it = %v", mask, k, got[k], v)
			}
		}
		ctx, parent := tp.Tracer("test").Start(t.Context(), "rpc")
		var wantSpans []string
		if s, ok := d.(compute.WorkspaceScoper); ok {
			_ = s.EnsureWorkspace(ctx, "w")
			_ = s.DeleteWorkspace(ctx, "w")
			wantSpans = append(wantSpans, "compute.EnsureWorkspace", "compute.DeleteWorkspace")
		}
		if a, ok := d.(compute.Adopter); ok {
			_ = a.AdoptionEnabled(ctx)
			_, _ = a.Adopt(ctx, compute.AdoptRequest{})
			wantSpans = append(wantSpans, "compute.AdoptionEnabled", "compute.Adopt")
		}
		if b, ok := d.(compute.BootstrapAuthenticatorProvider); ok {
			_, _ = b.BootstrapAuthenticator(ctx)
			wantSpans = append(wantSpans, "compute.BootstrapAuthenticator")
		}
		if l, ok := d.(compute.ListenerRequirer); ok {
			_, _ = l.ListenerRequirements(ctx)
			wantSpans = append(wantSpans, "compute.ListenerRequirements")
		}
		if s, ok := d.(compute.ServiceAccountSelector); ok {
			s.SelectsServiceAccounts()
		}
		if c, ok := d.(io.Closer); ok {
			_ = c.Close()
		}
		parent.End()
		children := map[string]bool{}
		for _, s := range rec.Ended() {
			if s.Parent().SpanID() == parent.SpanContext().SpanID() {
				children[s.Name()] = true
			}
		}
		for _, name := range wantSpans {
			if !children[name] {
				t.Errorf("mask %06b: no %s child span of the caller's span (got %v)", mask, name, children)
			}
		}
		if len(f.calls) != len(wantSpans)+popcount(mask&(1|8)) {
			t.Errorf("mask %06b: driver saw calls %v, want %d", mask, f.calls, len(wantSpans)+popcount(mask&(1|8)))
		}
	}
}

func popcount(m int) int {
	n := 0
	for ; m != 0; m &= m - 1 {
		n++
	}
	return n
}

// TestCoreSpans: every Driver method but Watch is a child span of the
// caller's, named compute.<Method>, with the driver's name; an error
// marks the span Error with its code and the error reaches the caller.
func TestCoreSpans(t *testing.T) {
	rec, tp := recordSpans(t)
	f := &fake{}
	d := New(f, "fake")
	ctx, parent := tp.Tracer("test").Start(t.Context(), "rpc")
	_, _ = d.Capabilities(ctx)
	_ = d.ValidateCreate(ctx, compute.Sandbox{})
	_ = d.Create(ctx, compute.Sandbox{})
	_, getErr := d.Get(ctx, compute.Ref{ID: "x"})
	_, _ = d.List(ctx)
	_ = d.Stop(ctx, compute.Ref{ID: "x"})
	_ = d.Start(ctx, compute.Ref{ID: "x"})
	_, _ = d.Delete(ctx, compute.Ref{ID: "x"})
	_, _, _ = d.Watch(ctx)
	parent.End()
	if errdefs.Code(getErr).String() != "NotFound" {
		t.Errorf("Get error = %v, want the driver's NotFound", getErr)
	}
	spans := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		spans[s.Name()] = s
	}
	for _, m := range []string{"Capabilities", "ValidateCreate", "Create", "Get", "List", "Stop", "Start", "Delete"} {
		s := spans["compute."+m]
		if s == nil {
			t.Errorf("no compute.%s span", m)
			continue
		}
		if s.Parent().SpanID() != parent.SpanContext().SpanID() {
			t.Errorf("compute.%s parent = %v, want the caller's span", m, s.Parent().SpanID())
		}
		var driver string
		for _, a := range s.Attributes() {
			if a.Key == AttrDriver {
				driver = a.Value.AsString()
			}
		}
		if driver != "fake" {
			t.Errorf("compute.%s %s = %q, want fake", m, AttrDriver, driver)
		}
		wantCode := "Unset"
		if m == "Get" {
			wantCode = "Error"
		}
		if s.Status().Code.String() != wantCode {
			t.Errorf("compute.%s status = %v, want %s", m, s.Status(), wantCode)
		}
	}
	if s := spans["compute.Get"]; s != nil && s.Status().Description != "compute error: NotFound" {
		t.Errorf("compute.Get status description = %q", s.Status().Description)
	}
	if spans["compute.Watch"] != nil {
		t.Error("Watch made a span; it should not (the stream outlives any caller span)")
	}
	if len(f.calls) != 9 {
		t.Errorf("driver saw %v, want all 9 calls", f.calls)
	}
}
