package telemetry

import (
	"maps"
	"testing"
)

// TestSupervisorEnv: only with the table; the tuning variables are
// forwarded under the OPENSHELL_ prefix, headers, certificate paths and
// OTEL_SERVICE_NAME are not; IsSupervisorEnv names exactly what it sets.
func TestSupervisorEnv(t *testing.T) {
	environ := []string{
		"OTEL_EXPORTER_OTLP_ENDPOINT=http://c:4317", "OTEL_BSP_SCHEDULE_DELAY=100", "OTEL_TRACES_SAMPLER=always_on",
		"OTEL_EXPORTER_OTLP_HEADERS=authorization=Bearer secret", "OTEL_EXPORTER_OTLP_CERTIFICATE=/etc/ca.pem",
		"OTEL_SERVICE_NAME=gw", "PATH=/bin",
	}
	if env := SupervisorEnv(nil, environ); env != nil {
		t.Errorf("SupervisorEnv(no table) = %v, want nil", env)
	}
	got := SupervisorEnv(&Config{Endpoint: "http://otel:4317", ServiceName: "gw"}, environ)
	want := map[string]string{
		"OPENSHELL_OTLP_ENDPOINT": "http://otel:4317", "OPENSHELL_OTLP_SERVICE_NAME": "gw-sandbox",
		"OPENSHELL_OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OPENSHELL_OTEL_BSP_SCHEDULE_DELAY": "100",
		"OPENSHELL_OTEL_TRACES_SAMPLER": "always_on",
	}
	if !maps.Equal(got, want) {
		t.Errorf("SupervisorEnv = %v, want %v", got, want)
	}
	for k := range got {
		if !IsSupervisorEnv(k) {
			t.Errorf("IsSupervisorEnv(%s) = false", k)
		}
	}
	for _, k := range []string{"OTEL_BSP_SCHEDULE_DELAY", "OPENSHELL_OTEL_EXPORTER_OTLP_HEADERS", "OPENSHELL_ENDPOINT", "PATH"} {
		if IsSupervisorEnv(k) {
			t.Errorf("IsSupervisorEnv(%s) = true", k)
		}
	}
	if n := SupervisorEnv(&Config{}, nil)["OPENSHELL_OTLP_SERVICE_NAME"]; n != "openshell-sandbox" {
		t.Errorf("default supervisor service name = %q", n)
	}
}
