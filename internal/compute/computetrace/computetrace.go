// Package computetrace wraps a compute.Driver so that each call into it is
// an OpenTelemetry span (from the global tracer provider) under the
// caller's span: the gateway's in-process drivers (process, docker,
// kubernetes) show up as children of the RPC or background operation that
// called them.
//
// The wrapper has exactly the optional abilities (compute.WorkspaceScoper,
// compute.Adopter, compute.ServiceAccountSelector,
// compute.BootstrapAuthenticatorProvider, compute.ListenerRequirer,
// io.Closer) of the driver it wraps, so callers that discover abilities by
// type assertion see the same driver. A new optional ability must be added
// to gen.go and to detect, or the wrapper hides it.
package computetrace

//go:generate go run gen.go

import (
	"context"
	"io"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/errdefs"
)

const scope = "github.com/openshell-go/openshell/internal/compute/computetrace"

// AttrDriver names the driver on each span.
const AttrDriver = "openshell.compute.driver"

// New wraps d (named name) so that every call is a span named
// "compute.<Method>" (kind INTERNAL, attribute openshell.compute.driver)
// under the caller's span. Sandbox ids, names and specs are not recorded;
// an error sets the span's status to Error with its errdefs code. Watch is
// not a span (the stream lives as long as the caller; the lifecycle engine
// traces each event), nor are Close and the ServiceAccountSelector marker.
func New(d compute.Driver, name string) compute.Driver {
	t := &tracer{name: name}
	a := abilities{}
	if c, ok := d.(io.Closer); ok {
		a.closer = c
	}
	if s, ok := d.(compute.WorkspaceScoper); ok {
		a.scoper = scoper{t, s}
	}
	if ad, ok := d.(compute.Adopter); ok {
		a.adopter = adopter{t, ad}
	}
	if s, ok := d.(compute.ServiceAccountSelector); ok {
		a.saSelector = s
	}
	if b, ok := d.(compute.BootstrapAuthenticatorProvider); ok {
		a.bootstrap = bootstrap{t, b}
	}
	if l, ok := d.(compute.ListenerRequirer); ok {
		a.listeners = listeners{t, l}
	}
	return assemble(core{t, d}, a)
}

// abilities holds the optional interfaces a wrapper has; nil = absent.
type abilities struct {
	closer     io.Closer
	scoper     compute.WorkspaceScoper
	adopter    compute.Adopter
	saSelector compute.ServiceAccountSelector
	bootstrap  compute.BootstrapAuthenticatorProvider
	listeners  compute.ListenerRequirer
}

func (a abilities) mask() int {
	m := 0
	for i, present := range []bool{a.closer != nil, a.scoper != nil, a.adopter != nil, a.saSelector != nil, a.bootstrap != nil, a.listeners != nil} {
		if present {
			m |= 1 << i
		}
	}
	return m
}

type tracer struct{ name string }

func (t *tracer) start(ctx context.Context, method string) (context.Context, trace.Span) {
	return otel.Tracer(scope).Start(ctx, "compute."+method, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(attribute.String(AttrDriver, t.name)))
}

func end(span trace.Span, err error) {
	if err != nil {
		span.SetStatus(otelcodes.Error, "compute error: "+errdefs.Code(err).String())
	}
	span.End()
}

type core struct {
	t *tracer
	d compute.Driver
}

func (c core) Capabilities(ctx context.Context) (r compute.Capabilities, err error) {
	ctx, sp := c.t.start(ctx, "Capabilities")
	defer func() { end(sp, err) }()
	return c.d.Capabilities(ctx)
}

func (c core) ValidateCreate(ctx context.Context, sb compute.Sandbox) (err error) {
	ctx, sp := c.t.start(ctx, "ValidateCreate")
	defer func() { end(sp, err) }()
	return c.d.ValidateCreate(ctx, sb)
}

func (c core) Create(ctx context.Context, sb compute.Sandbox) (err error) {
	ctx, sp := c.t.start(ctx, "Create")
	defer func() { end(sp, err) }()
	return c.d.Create(ctx, sb)
}

func (c core) Get(ctx context.Context, ref compute.Ref) (r compute.Sandbox, err error) {
	ctx, sp := c.t.start(ctx, "Get")
	defer func() { end(sp, err) }()
	return c.d.Get(ctx, ref)
}

func (c core) List(ctx context.Context) (r []compute.Sandbox, err error) {
	ctx, sp := c.t.start(ctx, "List")
	defer func() { end(sp, err) }()
	return c.d.List(ctx)
}

func (c core) Stop(ctx context.Context, ref compute.Ref) (err error) {
	ctx, sp := c.t.start(ctx, "Stop")
	defer func() { end(sp, err) }()
	return c.d.Stop(ctx, ref)
}

func (c core) Start(ctx context.Context, ref compute.Ref) (err error) {
	ctx, sp := c.t.start(ctx, "Start")
	defer func() { end(sp, err) }()
	return c.d.Start(ctx, ref)
}

func (c core) Delete(ctx context.Context, ref compute.Ref) (ok bool, err error) {
	ctx, sp := c.t.start(ctx, "Delete")
	defer func() { end(sp, err) }()
	return c.d.Delete(ctx, ref)
}

func (c core) Watch(ctx context.Context) (<-chan compute.Event, func() error, error) {
	return c.d.Watch(ctx)
}

type scoper struct {
	t *tracer
	s compute.WorkspaceScoper
}

func (s scoper) EnsureWorkspace(ctx context.Context, ws string) (err error) {
	ctx, sp := s.t.start(ctx, "EnsureWorkspace")
	defer func() { end(sp, err) }()
	return s.s.EnsureWorkspace(ctx, ws)
}

func (s scoper) DeleteWorkspace(ctx context.Context, ws string) (err error) {
	ctx, sp := s.t.start(ctx, "DeleteWorkspace")
	defer func() { end(sp, err) }()
	return s.s.DeleteWorkspace(ctx, ws)
}

type adopter struct {
	t *tracer
	a compute.Adopter
}

func (a adopter) AdoptionEnabled(ctx context.Context) (err error) {
	ctx, sp := a.t.start(ctx, "AdoptionEnabled")
	defer func() { end(sp, err) }()
	return a.a.AdoptionEnabled(ctx)
}

func (a adopter) Adopt(ctx context.Context, req compute.AdoptRequest) (r compute.AdoptResult, err error) {
	ctx, sp := a.t.start(ctx, "Adopt")
	defer func() { end(sp, err) }()
	return a.a.Adopt(ctx, req)
}

type bootstrap struct {
	t *tracer
	b compute.BootstrapAuthenticatorProvider
}

func (b bootstrap) BootstrapAuthenticator(ctx context.Context) (r auth.Authenticator, err error) {
	ctx, sp := b.t.start(ctx, "BootstrapAuthenticator")
	defer func() { end(sp, err) }()
	return b.b.BootstrapAuthenticator(ctx)
}

type listeners struct {
	t *tracer
	l compute.ListenerRequirer
}

func (l listeners) ListenerRequirements(ctx context.Context) (r []compute.ListenerRequirement, err error) {
	ctx, sp := l.t.start(ctx, "ListenerRequirements")
	defer func() { end(sp, err) }()
	return l.l.ListenerRequirements(ctx)
}
