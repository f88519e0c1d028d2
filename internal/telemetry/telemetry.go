// Package telemetry exports the gateway's (and, with the gateway's settings,
// the supervisors') OpenTelemetry traces over OTLP/gRPC.
//
// The [openshell.gateway.otlp] table is the only on-switch: without it
// Setup returns a no-op provider whatever OTEL_* variables say. With it,
// the SDK's OTEL_* variables tune the exporter (endpoint when the table
// has none, headers, timeout, certificates, batch sizes, resource
// attributes); the protocol is always gRPC. Telemetry never stops the
// gateway: a malformed endpoint is logged and export disabled, a batch the
// collector does not take is dropped (no retry), and export errors are
// logged at debug level.
//
// Setup also installs the provider and the W3C trace-context propagator as
// the process-wide OpenTelemetry globals, so that loops and wrappers in
// other packages start spans with otel.Tracer. Provider.Shutdown flushes
// what is buffered.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/openshell-go/openshell/internal/version"
)

// DefaultServiceName is service.name when neither the table nor
// OTEL_SERVICE_NAME gives one.
const DefaultServiceName = "openshell-gateway"

// Config is the [openshell.gateway.otlp] table; a nil *Config is "off".
type Config struct {
	// Endpoint is the collector, http://host:port (plaintext) or
	// https://host:port (TLS); empty = OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
	// OTEL_EXPORTER_OTLP_ENDPOINT, then the SDK default localhost:4317.
	Endpoint string
	// ServiceName is service.name; empty = OTEL_SERVICE_NAME or
	// DefaultServiceName.
	ServiceName string
}

// Provider is the gateway's tracer provider.
type Provider struct {
	trace.TracerProvider
	sdk *sdktrace.TracerProvider
	// Enabled reports whether spans are exported.
	Enabled bool
}

// Shutdown flushes buffered spans and stops the exporter; a no-op when
// export is off. Errors are the collector's and are only worth logging.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil || p.sdk == nil {
		return nil
	}
	return p.sdk.Shutdown(ctx)
}

// ForceFlush exports what is buffered now.
func (p *Provider) ForceFlush(ctx context.Context) error {
	if p == nil || p.sdk == nil {
		return nil
	}
	return p.sdk.ForceFlush(ctx)
}

// Propagator is the W3C trace-context propagator the gateway uses.
var Propagator propagation.TextMapPropagator = propagation.TraceContext{}

// LookupEnv reads an environment variable (os.LookupEnv in production).
type LookupEnv func(string) (string, bool)

// Setup builds the provider for cfg and installs it as the global one. It
// never fails: problems are logged and leave export off.
func Setup(ctx context.Context, cfg *Config, log *slog.Logger, lookupEnv LookupEnv, opts ...sdktrace.TracerProviderOption) *Provider {
	return setup(ctx, cfg, log, lookupEnv, nil, opts)
}

func setup(ctx context.Context, cfg *Config, log *slog.Logger, lookupEnv LookupEnv, expOpts []otlptracegrpc.Option, opts []sdktrace.TracerProviderOption) *Provider {
	otel.SetTextMapPropagator(Propagator)
	off := &Provider{TracerProvider: noop.NewTracerProvider()}
	if cfg == nil {
		otel.SetTracerProvider(off.TracerProvider)
		return off
	}
	log = log.With("component", "telemetry")
	p, err := build(ctx, cfg, log, lookupEnv, expOpts, opts...)
	if err != nil {
		log.Error("OpenTelemetry trace export disabled", "err", err)
		otel.SetTracerProvider(off.TracerProvider)
		return off
	}
	otel.SetTracerProvider(p.TracerProvider)
	return p
}

func build(ctx context.Context, cfg *Config, log *slog.Logger, lookupEnv LookupEnv, extra []otlptracegrpc.Option, opts ...sdktrace.TracerProviderOption) (*Provider, error) {
	endpoint, source := cfg.Endpoint, "[openshell.gateway.otlp] endpoint"
	for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"} {
		if endpoint != "" {
			break
		}
		if v, ok := lookupEnv(k); ok && v != "" {
			endpoint, source = v, k
		}
	}
	for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if v, ok := lookupEnv(k); ok && v != "" && v != "grpc" {
			log.Warn("only OTLP over gRPC is supported; exporting over gRPC", "variable", k, "value", v)
			break
		}
	}
	expOpts := append([]otlptracegrpc.Option{otlptracegrpc.WithRetry(otlptracegrpc.RetryConfig{Enabled: false})}, extra...)
	if endpoint != "" {
		if err := checkEndpoint(endpoint); err != nil {
			return nil, fmt.Errorf("%s: %w", source, err)
		}
		expOpts = append(expOpts, otlptracegrpc.WithEndpointURL(endpoint))
	}
	exp, err := otlptracegrpc.New(ctx, expOpts...)
	if err != nil {
		return nil, fmt.Errorf("otlp exporter: %w", err)
	}
	res, err := resource.New(ctx, resource.WithFromEnv(), resource.WithTelemetrySDK(),
		resource.WithAttributes(attribute.String("service.version", version.Version)))
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		log.Warn("OpenTelemetry resource", "err", err)
	}
	name := cfg.ServiceName
	if name == "" {
		if v, ok := lookupEnv("OTEL_SERVICE_NAME"); ok && v != "" {
			name = v
		} else {
			name = DefaultServiceName
		}
	}
	res, err = resource.Merge(res, resource.NewSchemaless(attribute.String("service.name", name)))
	if err != nil {
		return nil, fmt.Errorf("otlp resource: %w", err)
	}
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Debug("OpenTelemetry export failed; batch dropped", "err", err)
	}))
	sdk := sdktrace.NewTracerProvider(append([]sdktrace.TracerProviderOption{
		sdktrace.WithBatcher(exp), sdktrace.WithResource(res),
	}, opts...)...)
	log.Info("OpenTelemetry trace export on", "endpoint", redactEndpoint(endpoint), "service_name", name)
	return &Provider{TracerProvider: sdk, sdk: sdk, Enabled: true}, nil
}

// checkEndpoint accepts http(s)://host:port[/] only.
func checkEndpoint(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("malformed endpoint %q", redactEndpoint(s))
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("endpoint %q: want http://host:port or https://host:port", redactEndpoint(s))
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil || host == "" || port == "" {
		return fmt.Errorf("endpoint %q: want http://host:port or https://host:port", redactEndpoint(s))
	}
	if u.Path != "" && u.Path != "/" {
		return fmt.Errorf("endpoint %q: OTLP/gRPC takes no path", redactEndpoint(s))
	}
	return nil
}

// redactEndpoint drops user info and query from an endpoint for logs.
func redactEndpoint(s string) string {
	if s == "" {
		return "localhost:4317 (SDK default)"
	}
	u, err := url.Parse(s)
	if err != nil {
		if i := strings.IndexAny(s, "@?"); i >= 0 {
			return s[:i] + "…"
		}
		return s
	}
	u.User, u.RawQuery = nil, ""
	return u.String()
}

// StartOperation starts the span of a background operation (a reconcile
// pass, a watch event, a refresh) from the global tracer provider; call
// end with the operation's error, if any. Without a caller span it is a
// root span.
func StartOperation(ctx context.Context, name string) (context.Context, func(error)) {
	ctx, span := otel.Tracer(clientScope).Start(ctx, name, trace.WithSpanKind(trace.SpanKindInternal))
	return ctx, func(err error) {
		if err != nil {
			span.SetStatus(otelcodes.Error, "operation failed")
		}
		span.End()
	}
}

// TracerFor returns the provider for a server's per-RPC spans: nil when
// export is off, so that the server skips span work altogether.
func (p *Provider) TracerFor() trace.TracerProvider {
	if p == nil || !p.Enabled {
		return nil
	}
	return p.TracerProvider
}
