package gatewaytest

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// readySandbox creates a sandbox running cmd and waits for READY.
func readySandbox(ctx context.Context, t *testing.T, c openshellv1.OpenShellClient, name string, cmd ...string) *openshellv1.Sandbox {
	t.Helper()
	if len(cmd) == 0 {
		cmd = []string{"sleep", "infinity"}
	}
	if _, err := c.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: name, Spec: &openshellv1.SandboxSpec{Command: cmd}}); err != nil {
		t.Fatalf("CreateSandbox(%s): %v", name, err)
	}
	return WaitPhase(ctx, t, c, name, openshellv1.SandboxPhase_SANDBOX_PHASE_READY, time.Minute)
}

func TestExec(t *testing.T) {
	g := Start(t, Options{})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	sb := readySandbox(ctx, t, c, "exec")
	id := sb.GetMetadata().GetId()
	spew := g.InstallHelper(t, id)

	tests := []struct {
		name             string
		req              *openshellv1.ExecSandboxRequest
		wantOut, wantErr string
		wantCode         int32
		wantOutLen       int
	}{
		{name: "exit 0", req: &openshellv1.ExecSandboxRequest{Command: []string{"true"}}},
		{name: "exit 1", req: &openshellv1.ExecSandboxRequest{Command: []string{"false"}}, wantCode: 1},
		{name: "killed 137", req: &openshellv1.ExecSandboxRequest{Command: []string{"sh", "-c", "kill -9 $$"}}, wantCode: 137, wantErr: "Killed\n"},
		{name: "separation", req: &openshellv1.ExecSandboxRequest{Command: []string{"sh", "-c", "echo a; echo b >&2"}}, wantOut: "a\n", wantErr: "b\n"},
		{name: "quoting", req: &openshellv1.ExecSandboxRequest{Command: []string{"printf", "%s|", "it's", "two words", "$HOME"}}, wantOut: "it's|two words|$HOME|"},
		{name: "stdin", req: &openshellv1.ExecSandboxRequest{Command: []string{"cat"}, Stdin: []byte("piped input")}, wantOut: "piped input"},
		{name: "env", req: &openshellv1.ExecSandboxRequest{Command: []string{"sh", "-c", "printf %s-%s \"$A\" \"$B_2\""}, Environment: map[string]string{"A": "x y", "B_2": "z"}}, wantOut: "x y-z"},
		{name: "workdir", req: &openshellv1.ExecSandboxRequest{Command: []string{"pwd"}, Workdir: "/usr"}, wantOut: "/usr\n"},
		{name: "timeout", req: &openshellv1.ExecSandboxRequest{Command: []string{"sleep", "30"}, TimeoutSeconds: 1}, wantCode: 124},
		{name: "10MB output", req: &openshellv1.ExecSandboxRequest{Command: []string{spew, "spew", "10485760"}}, wantOutLen: 10 << 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.req.SandboxId = id
			out, errOut, code, err := Exec(ctx, t, c, tt.req)
			if err != nil {
				t.Fatalf("Exec: %v", err)
			}
			if code != tt.wantCode {
				t.Errorf("exit = %d, want %d (stderr %q)", code, tt.wantCode, errOut)
			}
			if tt.wantOutLen > 0 {
				if len(out) != tt.wantOutLen || out[:16] != "0123456789abcdef" || out[len(out)-16:] != "0123456789abcdef" {
					t.Errorf("stdout length %d, want %d", len(out), tt.wantOutLen)
				}
				return
			}
			if out != tt.wantOut || errOut != tt.wantErr {
				t.Errorf("stdout %q stderr %q, want %q %q", out, errOut, tt.wantOut, tt.wantErr)
			}
		})
	}

	t.Run("bad input", func(t *testing.T) {
		for _, tc := range []struct {
			req  *openshellv1.ExecSandboxRequest
			code codes.Code
			msg  string
		}{
			{&openshellv1.ExecSandboxRequest{SandboxId: id}, codes.InvalidArgument, "command is required"},
			{&openshellv1.ExecSandboxRequest{SandboxId: id, Command: []string{"true"}, Environment: map[string]string{"1BAD": "x"}}, codes.InvalidArgument, "1BAD"},
			{&openshellv1.ExecSandboxRequest{SandboxId: "no-such-id", Command: []string{"true"}}, codes.NotFound, "sandbox not found"},
		} {
			_, _, _, err := Exec(ctx, t, c, tc.req)
			if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.msg) {
				t.Errorf("Exec(%v) = %v, want %v containing %q", tc.req, err, tc.code, tc.msg)
			}
		}
	})

	t.Run("not ready refused", func(t *testing.T) {
		if _, err := c.StopSandbox(ctx, &openshellv1.StopSandboxRequest{Name: "exec"}); err != nil {
			t.Fatal(err)
		}
		WaitPhase(ctx, t, c, "exec", openshellv1.SandboxPhase_SANDBOX_PHASE_STOPPED, 30*time.Second)
		_, _, _, err := Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: []string{"true"}})
		if status.Code(err) != codes.FailedPrecondition || status.Convert(err).Message() != "sandbox is not ready" {
			t.Fatalf("Exec on stopped sandbox = %v, want FailedPrecondition \"sandbox is not ready\"", err)
		}
	})
}
