package gateway

import (
	"os"

	"github.com/prometheus/client_golang/prometheus"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/config"
	"github.com/openshell-go/openshell/internal/sandboxlog"
	"github.com/openshell-go/openshell/internal/securityevent"
	"github.com/openshell-go/openshell/internal/version"
)

// openSecurityEvents builds the security event log: JSON lines to the
// configured sink, counters on reg, and every event whose subject is a
// sandbox also in that sandbox's gateway log lines (GetSandboxLogs,
// target "security_event"). close closes the sink.
func openSecurityEvents(cfg config.SecurityEvents, logs *sandboxlog.Buffer, reg prometheus.Registerer) (l *securityevent.Log, closeSink func(), err error) {
	opts := securityevent.Options{
		Registerer: reg, Version: version.Version,
		OnSandboxEvent: func(sandboxID string, line []byte, ev securityevent.Event) {
			level := "info"
			if ev.Outcome != securityevent.Success {
				level = "warn"
			}
			logs.Append(&openshellv1.SandboxLogLine{
				SandboxId: sandboxID, TimestampMs: ev.Time.UnixMilli(), Level: level,
				Target: "security_event", Message: string(line), Source: sandboxlog.SourceGateway,
			})
		},
	}
	closeSink = func() {}
	if cfg.Sink != "" {
		sink, err := securityevent.OpenSink(cfg.Sink, cfg.MaxSizeMB, cfg.MaxFiles, os.Stdout)
		if err != nil {
			return nil, nil, err
		}
		opts.Sink, closeSink = sink, func() { _ = sink.Close() }
	}
	if l, err = securityevent.New(opts); err != nil {
		closeSink()
		return nil, nil, err
	}
	return l, closeSink, nil
}
