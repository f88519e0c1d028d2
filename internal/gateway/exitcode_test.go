package gateway

import (
	"io"
	"testing"
)

func TestExitCodes(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want int
	}{
		{"unknown flag", []string{"--bogus"}, 2},
		{"stray argument", []string{"serve-please"}, 2},
		{"driver serve without flags", []string{"driver", "serve"}, 2},
		{"invalid configuration", []string{"--port", "0", "--disable-tls"}, 1},
		{"help", []string{"--help"}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("XDG_CONFIG_HOME", t.TempDir())
			err := Run(t.Context(), tt.args, io.Discard, io.Discard)
			if err == nil {
				t.Fatalf("Run(%q) succeeded", tt.args)
			}
			if got := ExitCode(err); got != tt.want {
				t.Fatalf("ExitCode(Run(%q)) = %d (%v), want %d", tt.args, got, err, tt.want)
			}
		})
	}
}
