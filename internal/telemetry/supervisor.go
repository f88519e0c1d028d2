package telemetry

import (
	"context"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"google.golang.org/grpc"
)

// Variables carrying the gateway's OTLP settings to a supervisor. They
// are set by the compute drivers only when the gateway has
// [openshell.gateway.otlp]; the supervisor exports when
// EnvSupervisorServiceName is set and never passes them to agents.
const (
	EnvSupervisorEndpoint    = "OPENSHELL_OTLP_ENDPOINT"
	EnvSupervisorServiceName = "OPENSHELL_OTLP_SERVICE_NAME"
	// EnvSupervisorOTELPrefix prefixes each forwarded OTEL_* tuning
	// variable (OPENSHELL_OTEL_BSP_SCHEDULE_DELAY carries
	// OTEL_BSP_SCHEDULE_DELAY), so the sandbox's own OTEL_* variables stay
	// the agent's.
	EnvSupervisorOTELPrefix = "OPENSHELL_"
)

// forwardedOTEL are the tuning variables forwarded to supervisors
// (exactly, or as a prefix when ending in "_"). Not forwarded: headers
// (they may carry collector credentials, and a sandbox is not trusted
// with them), certificate and key paths (host paths), OTEL_SERVICE_NAME.
var forwardedOTEL = []string{
	"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
	"OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
	"OTEL_EXPORTER_OTLP_COMPRESSION", "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
	"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
	"OTEL_BSP_", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG", "OTEL_RESOURCE_ATTRIBUTES",
}

func forwarded(k string) bool {
	for _, f := range forwardedOTEL {
		if k == f || (strings.HasSuffix(f, "_") && strings.HasPrefix(k, f)) {
			return true
		}
	}
	return false
}

// SupervisorServiceName is the service.name of the supervisors of a
// gateway whose table names serviceName: "<service_name>-sandbox", or
// "openshell-sandbox".
func SupervisorServiceName(serviceName string) string {
	if serviceName == "" {
		return "openshell-sandbox"
	}
	return serviceName + "-sandbox"
}

// SupervisorEnv is the environment a driver adds to each supervisor's so
// that it exports to the gateway's collector: nil when cfg is nil (no
// [openshell.gateway.otlp]). environ is the gateway's environment
// (os.Environ()).
func SupervisorEnv(cfg *Config, environ []string) map[string]string {
	if cfg == nil {
		return nil
	}
	env := map[string]string{
		EnvSupervisorEndpoint:    cfg.Endpoint,
		EnvSupervisorServiceName: SupervisorServiceName(cfg.ServiceName),
	}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok && forwarded(k) {
			env[EnvSupervisorOTELPrefix+k] = v
		}
	}
	return env
}

// IsSupervisorEnv reports whether k is one of the variables
// SupervisorEnv sets (an agent's environment never carries them).
func IsSupervisorEnv(k string) bool {
	return k == EnvSupervisorEndpoint || k == EnvSupervisorServiceName ||
		(strings.HasPrefix(k, EnvSupervisorOTELPrefix+"OTEL_") && forwarded(strings.TrimPrefix(k, EnvSupervisorOTELPrefix)))
}

// SetupSupervisor turns export on in a supervisor when its environment
// has the gateway's settings (SupervisorEnv); otherwise it installs the
// no-op provider. The forwarded OTEL_* values replace the process's own
// while the SDK reads them (the others are hidden), so the sandbox's
// OTEL_* variables, meant for its agent, never configure the supervisor.
// It must run before other goroutines read the environment. dial, when
// not nil, connects to the collector (the process driver's host dialer
// from a private network namespace). Export is best effort: it never
// blocks or fails the supervisor.
func SetupSupervisor(ctx context.Context, log *slog.Logger, dial func(ctx context.Context, addr string) (net.Conn, error)) *Provider {
	name, on := os.LookupEnv(EnvSupervisorServiceName)
	if !on || name == "" {
		return Setup(ctx, nil, log, os.LookupEnv)
	}
	cfg := &Config{Endpoint: os.Getenv(EnvSupervisorEndpoint), ServiceName: name}
	saved := map[string]string{}
	for _, kv := range os.Environ() {
		if k, v, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "OTEL_") {
			saved[k] = v
			_ = os.Unsetenv(k)
		}
	}
	var set []string
	for _, kv := range os.Environ() {
		if k, v, _ := strings.Cut(kv, "="); IsSupervisorEnv(k) && strings.HasPrefix(k, EnvSupervisorOTELPrefix+"OTEL_") {
			ok := strings.TrimPrefix(k, EnvSupervisorOTELPrefix)
			_ = os.Setenv(ok, v)
			set = append(set, ok)
		}
	}
	defer func() {
		for _, k := range set {
			_ = os.Unsetenv(k)
		}
		for k, v := range saved {
			_ = os.Setenv(k, v)
		}
	}()
	var opts []otlptracegrpc.Option
	if dial != nil {
		opts = append(opts, otlptracegrpc.WithDialOption(grpc.WithContextDialer(dial)))
	}
	return setup(ctx, cfg, log, os.LookupEnv, opts, nil)
}

// supervisorFlushTimeout bounds a supervisor's span flush on exit.
const supervisorFlushTimeout = 2 * time.Second

// FlushSupervisor flushes p within supervisorFlushTimeout, logging (not
// returning) a failure.
func FlushSupervisor(p *Provider, log *slog.Logger) {
	if !p.Enabled {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), supervisorFlushTimeout)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		log.Debug("OpenTelemetry spans not flushed", "err", err)
	}
}
