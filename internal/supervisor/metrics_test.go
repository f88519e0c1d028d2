package supervisor_test

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/openshell-go/openshell/internal/relay/relaytest"
	"github.com/openshell-go/openshell/internal/supervisor"
)

// A supervisor started with a metrics listener serves Prometheus metrics
// there, the egress decision counters among them.
func TestMetricsListener(t *testing.T) {
	// A free loopback port (the supervisor listens on the address given).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	gw := relaytest.Start(t, relaytest.Options{})
	startSupervisor(t, gw, "sb-metrics", func(c *supervisor.Config) { c.MetricsListen = addr })
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET /metrics = %d %s", resp.StatusCode, body)
	}
	for _, want := range []string{
		`openshell_sandbox_egress_decisions_total{decision="deny",kind="connect",policy=""} 0`,
		`openshell_sandbox_egress_decisions_total{decision="deny",kind="http",policy=""} 0`,
		"go_goroutines ",
		"process_open_fds ",
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q:\n%s", want, body)
		}
	}
}

// The metrics listener takes loopback addresses unless told otherwise,
// and --metrics-allow-remote alone does nothing, so it is refused.
func TestMetricsListenFlags(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--metrics-listen", "0.0.0.0:9464"}, "is not a loopback address"},
		{[]string{"--metrics-listen", ":9464"}, "is not a loopback address"},
		{[]string{"--metrics-listen", "10.1.2.3:9464"}, "add --metrics-allow-remote"},
		{[]string{"--metrics-listen", "example.com:9464"}, "must be an IP address or localhost"},
		{[]string{"--metrics-listen", "127.0.0.1"}, "want host:port"},
		{[]string{"--metrics-allow-remote"}, "--metrics-allow-remote needs --metrics-listen"},
	} {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var stderr bytes.Buffer
			err := supervisor.Run(t.Context(), tt.args, io.Discard, &stderr)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Run(%q) = %v, want an error containing %q", tt.args, err, tt.want)
			}
		})
	}
	// Config.Validate applies the same check (Serve's callers).
	for _, tt := range []struct {
		listen string
		remote bool
		ok     bool
	}{
		{"127.0.0.1:9464", false, true},
		{"[::1]:9464", false, true},
		{"localhost:9464", false, true},
		{"10.1.2.3:9464", true, true},
		{"10.1.2.3:9464", false, false},
		{"", true, false},
	} {
		c := supervisor.Config{Endpoint: "unix:///gw.sock", SandboxID: "sb", MetricsListen: tt.listen, MetricsAllowRemote: tt.remote}
		if err := c.Validate(); (err == nil) != tt.ok {
			t.Errorf("Validate(MetricsListen %q, MetricsAllowRemote %v) = %v, want ok %v", tt.listen, tt.remote, err, tt.ok)
		}
	}
}
