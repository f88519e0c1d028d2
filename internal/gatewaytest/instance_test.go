package gatewaytest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// TestSecondGatewayOnStateDirRefused: a second gateway on a state
// directory in use exits 1 naming the first one's pid, and leaves the
// first gateway, its callback socket and its sandboxes alone.
func TestSecondGatewayOnStateDirRefused(t *testing.T) {
	g := Start(t, Options{})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	sb := readySandbox(ctx, t, c, "first")
	id := sb.GetMetadata().GetId()
	pid := supervisorPID(t, g, id)
	sock := filepath.Join(g.StateDir, "run", "gateway.sock")
	sockBefore, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}

	second := exec.Command(filepath.Join(g.BinDir, "openshell-gateway"),
		"--port", strconv.Itoa(freePort(t)), "--bind-address", "127.0.0.1",
		"--db-url", "sqlite:"+filepath.Join(g.StateDir, "openshell.db"), "--state-dir", g.StateDir)
	second.Env = append(os.Environ(), "OPENSHELL_LOCAL_TLS_DIR="+g.TLSDir, "XDG_CONFIG_HOME="+filepath.Join(g.StateDir, "config"))
	out := &syncBuffer{}
	second.Stdout, second.Stderr = out, out
	if err := second.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- second.Wait() }()
	select {
	case err = <-exited:
	case <-time.After(20 * time.Second):
		// It serves: what it does on SIGTERM is what the lock prevents.
		t.Errorf("second gateway on %s still running after 20s, want it refused at start-up", g.StateDir)
		_ = second.Process.Signal(syscall.SIGTERM)
		err = <-exited
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Errorf("second gateway exit = %v, want exit status 1", err)
	}
	want := fmt.Sprintf("is in use by another openshell-gateway (pid %d)", g.cmd.Process.Pid)
	if !strings.Contains(out.String(), want) {
		t.Errorf("second gateway output does not contain %q:\n%s", want, out.String())
	}

	// The first gateway is untouched.
	if st, err := os.Stat(sock); err != nil || !os.SameFile(st, sockBefore) {
		t.Errorf("callback socket %s after the second gateway: %v (same file %v)", sock, err, err == nil && os.SameFile(st, sockBefore))
	}
	if !alive(pid) {
		t.Errorf("supervisor %d of the first gateway's sandbox died", pid)
	}
	stdout, _, code, err := Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: []string{"echo", "still here"}})
	if err != nil || code != 0 || stdout != "still here\n" {
		t.Errorf("exec on the first gateway's sandbox = %q, %d, %v", stdout, code, err)
	}
}

// TestStateDirUnderTmp: a state directory under /tmp works for a sandbox
// without an image, although the sandbox gets a private /tmp: its
// workspace is the one under the state directory.
func TestStateDirUnderTmp(t *testing.T) {
	state, err := os.MkdirTemp("/tmp", "openshell-state-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(state) })
	g := Start(t, Options{StateDir: state})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	sb := readySandbox(ctx, t, c, "tmp-state")
	id := sb.GetMetadata().GetId()
	stdout, stderr, code, err := Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: id,
		Command: []string{"sh", "-c", "echo kept > notes.txt && pwd"}})
	if err != nil || code != 0 {
		t.Fatalf("exec in a sandbox whose state directory is under /tmp = %q %q %d %v", stdout, stderr, code, err)
	}
	data, err := os.ReadFile(filepath.Join(state, "sandboxes", id, "workspace", "notes.txt"))
	if err != nil || string(data) != "kept\n" {
		t.Fatalf("workspace file on the host = %q, %v; want what the sandbox wrote in %s", data, err, strings.TrimSpace(stdout))
	}
}
