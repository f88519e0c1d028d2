package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/pelletier/go-toml/v2"

	"github.com/openshell-go/openshell/internal/config"
	"github.com/openshell-go/openshell/internal/telemetry"
)

// tracingFlushTimeout bounds the span flush on the way out.
const tracingFlushTimeout = 5 * time.Second

// setupTracing turns OTLP trace export on when [openshell.gateway.otlp]
// is present; it never fails the start.
func setupTracing(ctx context.Context, cfg *config.Config, logger *slog.Logger) *telemetry.Provider {
	var tc *telemetry.Config
	if cfg.OTLP != nil {
		tc = &telemetry.Config{Endpoint: cfg.OTLP.Endpoint, ServiceName: cfg.OTLP.ServiceName}
	}
	return telemetry.Setup(ctx, tc, logger, os.LookupEnv)
}

// flushTracing exports the spans still buffered, within tracingFlushTimeout.
func flushTracing(p *telemetry.Provider, logger *slog.Logger) {
	if !p.Enabled {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), tracingFlushTimeout)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		logger.Warn("OpenTelemetry spans not flushed", "err", err)
	}
}

// setupDriverTracing turns OTLP export on for `driver serve` when the
// gateway.toml it was given has [openshell.gateway.otlp]: the same
// collector, service name "<service_name or openshell>-driver-<name>", and
// the gateway's W3C trace context continued from each call's metadata.
func setupDriverTracing(ctx context.Context, cfgFile, name string, logger *slog.Logger) *telemetry.Provider {
	var tc *telemetry.Config
	if cfgFile != "" {
		o, err := fileOTLP(cfgFile)
		if err != nil {
			logger.Error("OpenTelemetry trace export disabled", "err", err)
		} else if o != nil {
			tc = &telemetry.Config{Endpoint: o.Endpoint, ServiceName: "openshell-driver-" + name}
			if o.ServiceName != "" {
				tc.ServiceName = o.ServiceName + "-driver-" + name
			}
		}
	}
	return telemetry.Setup(ctx, tc, logger, os.LookupEnv)
}

func fileOTLP(path string) (*config.OTLP, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("driver config: %w", err)
	}
	var doc struct {
		OpenShell struct {
			Gateway struct {
				OTLP *struct {
					Endpoint    string `toml:"endpoint"`
					ServiceName string `toml:"service_name"`
				} `toml:"otlp"`
			} `toml:"gateway"`
		} `toml:"openshell"`
	}
	if err := toml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("driver config %s: %w", path, err)
	}
	o := doc.OpenShell.Gateway.OTLP
	if o == nil {
		return nil, nil
	}
	return &config.OTLP{Endpoint: o.Endpoint, ServiceName: o.ServiceName}, nil
}

// supervisorOTLPEnv is what the drivers add to each supervisor's
// environment so that it exports to the same collector: nothing without
// [openshell.gateway.otlp].
func supervisorOTLPEnv(cfg *config.Config) map[string]string {
	if cfg.OTLP == nil {
		return nil
	}
	return telemetry.SupervisorEnv(&telemetry.Config{Endpoint: cfg.OTLP.Endpoint, ServiceName: cfg.OTLP.ServiceName}, os.Environ())
}

// fileSupervisorOTLPEnv is supervisorOTLPEnv for `driver serve --config`:
// nothing without a file or without its [openshell.gateway.otlp] (an
// unreadable file is reported by setupDriverTracing).
func fileSupervisorOTLPEnv(cfgFile string) map[string]string {
	if cfgFile == "" {
		return nil
	}
	o, err := fileOTLP(cfgFile)
	if err != nil || o == nil {
		return nil
	}
	return telemetry.SupervisorEnv(&telemetry.Config{Endpoint: o.Endpoint, ServiceName: o.ServiceName}, os.Environ())
}
