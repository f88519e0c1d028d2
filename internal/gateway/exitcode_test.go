package gateway

import (
	"context"
	"io"
	"testing"
	"time"
)

func TestExitCodes(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want int
	}{
		{"unknown flag", []string{"--bogus"}, nil, 2},
		{"stray argument", []string{"serve-please"}, nil, 2},
		{"driver serve without flags", []string{"driver", "serve"}, nil, 2},
		{"port not a number", []string{"--port", "abc", "--disable-tls"}, nil, 2},
		{"port out of range", []string{"--port", "0", "--disable-tls"}, nil, 2},
		{"unknown log level", []string{"--log-level", "loud", "--disable-tls"}, nil, 2},
		{"negative ttl", []string{"--ssh-session-ttl-secs", "-1", "--disable-tls"}, nil, 2},
		{"port out of range from the environment", []string{"--disable-tls"}, map[string]string{"OPENSHELL_SERVER_PORT": "0"}, 1},
		{"conflicting flags", []string{"--disable-tls", "--tls-client-ca", "/nonexistent/ca.crt"}, nil, 1},
		{"setting not implemented", []string{"--disable-tls", "--server-san", "gw.example"}, nil, 1},
		{"loopback service http off loopback", []string{"--disable-tls", "--bind-address", "0.0.0.0", "--enable-loopback-service-http"}, nil, 1},
		{"help", []string{"--help"}, nil, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("XDG_CONFIG_HOME", t.TempDir())
			t.Setenv("XDG_STATE_HOME", t.TempDir())
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second) // a start-up that wrongly succeeds serves until then
			defer cancel()
			err := Run(ctx, tt.args, io.Discard, io.Discard)
			if err == nil {
				t.Fatalf("Run(%q) succeeded", tt.args)
			}
			if got := ExitCode(err); got != tt.want {
				t.Fatalf("ExitCode(Run(%q)) = %d (%v), want %d", tt.args, got, err, tt.want)
			}
		})
	}
}
