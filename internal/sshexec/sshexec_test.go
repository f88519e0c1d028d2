package sshexec

import (
	"errors"
	"testing"

	"github.com/openshell-go/openshell/internal/errdefs"
)

func TestBuildCommand(t *testing.T) {
	tests := []struct {
		name    string
		argv    []string
		env     map[string]string
		workdir string
		want    string
	}{
		{"plain", []string{"echo", "hi"}, nil, "", "echo hi"},
		{"quoting", []string{"sh", "-c", "echo $HOME; it's"}, nil, "", `sh -c 'echo $HOME; it'\''s'`},
		{"empty arg", []string{"printf", ""}, nil, "", "printf ''"},
		{"sorted env", []string{"env"}, map[string]string{"B": "2", "A": "x y", "_c1": ""}, "", "A='x y' B=2 _c1='' env"},
		{"workdir", []string{"pwd"}, map[string]string{"K": "v"}, "/work space", "cd '/work space' && K=v pwd"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := BuildCommand(tt.argv, tt.env, tt.workdir)
			if err != nil || got != tt.want {
				t.Errorf("BuildCommand() = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestBuildCommandRejectsBadEnvKeys(t *testing.T) {
	for _, k := range []string{"", "1A", "A-B", "A B", "A=B", "É"} {
		_, err := BuildCommand([]string{"true"}, map[string]string{k: "v"}, "")
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("BuildCommand(env key %q) = %v, want InvalidArgument", k, err)
		}
	}
}
