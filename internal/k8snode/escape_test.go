package k8snode_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/gatewaytest"
	"github.com/openshell-go/openshell/internal/k8stest"
	"github.com/openshell-go/openshell/internal/supervisor/isolation/isolationtest"
)

// escapeImage is an agent image built on this machine: busybox, the static
// escape helper (plus a setuid-root copy) under /opt/escape, and a file
// under /secret that the sandbox's policy does not name.
const escapeImage = "docker.io/openshell-test/escape:local"

// TestGatewayEscapesInPod runs the isolation escape attempts as the agent
// of a sandbox whose supervisor runs in a real pod (created through the
// gateway on the kubernetes driver, with the driver's pod spec: root with
// a few capabilities, no_new_privs, the runtime's seccomp profile): each
// attempt must be refused by the kernel, and the agent runs as uid 1000
// with no capabilities, no_new_privs and a seccomp filter.
func TestGatewayEscapesInPod(t *testing.T) {
	g := startPodGateway(t, "")
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()

	esc, err := os.ReadFile(isolationtest.EscapeBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	files, err := k8stest.BusyboxFiles()
	if err != nil {
		t.Fatal(err)
	}
	files = append(files,
		k8stest.ImageFile{Path: "opt/escape/escape", Mode: 0o755, Data: esc},
		k8stest.ImageFile{Path: "opt/escape/escape-suid", Mode: 0o4755, Data: esc},
		k8stest.ImageFile{Path: "opt/escape/data", Mode: 0o644, Data: []byte("tools\n")},
		k8stest.ImageFile{Path: "secret/key", Mode: 0o644, Data: []byte("secret\n")},
	)
	if err := g.c.Node.ImportImage(ctx, k8stest.Image{Name: escapeImage, Files: files, Cmd: []string{"/bin/sh"}}); err != nil {
		t.Fatal(err)
	}

	c := g.Client()
	const name = "escape"
	created, err := c.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: name, Spec: &openshellv1.SandboxSpec{
		Command:  []string{"sleep", "infinity"},
		Template: &openshellv1.SandboxTemplate{Image: escapeImage},
		Policy: &sandboxv1.SandboxPolicy{
			Version: 1,
			Filesystem: &sandboxv1.FilesystemPolicy{
				IncludeWorkdir: true,
				ReadOnly:       []string{"/bin", "/etc", "/opt/escape"},
				ReadWrite:      []string{"/tmp"},
			},
			Landlock: &sandboxv1.LandlockPolicy{Compatibility: "hard_requirement"},
		},
	}})
	if err != nil {
		t.Fatalf("CreateSandbox: %v", err)
	}
	id := created.GetSandbox().GetMetadata().GetId()
	t.Cleanup(func() { logPod(t, g.c, g.ns, name) })
	gatewaytest.WaitPhase(ctx, t, c, name, openshellv1.SandboxPhase_SANDBOX_PHASE_READY, 3*time.Minute)

	type result struct {
		stdout, stderr string
		code           int32
	}
	run := func(t *testing.T, argv ...string) result {
		t.Helper()
		stdout, stderr, code, err := gatewaytest.Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: argv})
		if err != nil {
			t.Fatalf("exec %v: %v", argv, err)
		}
		return result{stdout, stderr, code}
	}

	// The supervisor is the container's PID 1; the agent sees it.
	if got := run(t, "sh", "-c", "tr '\\0' ' ' < /proc/1/cmdline"); !strings.Contains(got.stdout, "openshell-sandbox") {
		t.Fatalf("PID 1 in the pod = %q %q, want the supervisor", got.stdout, got.stderr)
	}

	t.Run("status", func(t *testing.T) {
		got := run(t, "/opt/escape/escape", "status")
		for _, w := range []string{
			"Uid: 1000 1000 1000 1000", "Gid: 1000 1000 1000 1000",
			"CapInh: 0000000000000000", "CapPrm: 0000000000000000", "CapEff: 0000000000000000",
			"CapBnd: 0000000000000000", "CapAmb: 0000000000000000", "NoNewPrivs: 1", "Seccomp: 2",
		} {
			if !strings.Contains(got.stdout, w) {
				t.Errorf("agent status lacks %q:\n%s", w, got.stdout)
			}
		}
	})
	for _, tt := range []struct {
		name string
		argv []string
	}{
		{"mount", []string{"mount", "/sandbox"}},
		{"ptrace the supervisor", []string{"ptrace", "1"}},
		{"signal the supervisor", []string{"signal0", "1"}},
		{"kill the supervisor", []string{"kill", "1"}},
		{"unshare -n", []string{"unshare-net"}},
		{"unshare a user namespace", []string{"unshare-user"}},
		{"clone a user namespace", []string{"clone-userns"}},
		{"setns into the supervisor's network", []string{"setns"}},
		{"raw socket", []string{"raw-socket"}},
		{"packet socket", []string{"packet-socket"}},
		{"load a module", []string{"init-module"}},
		{"bpf", []string{"bpf"}},
		{"keyctl", []string{"keyctl"}},
		{"write /proc/sys", []string{"write", "/proc/sys/kernel/hostname"}},
		{"write outside read_write", []string{"write", "/secret/new"}},
		{"write into read_only", []string{"write", "/opt/escape/new"}},
		{"read outside read_only", []string{"read", "/secret/key"}},
		{"read the supervisor's environment", []string{"read", "/proc/1/environ"}},
		{"read the projected token", []string{"read", "/var/run/secrets/openshell/token"}},
		{"read the client key", []string{"read", "/etc/openshell-tls/client/tls.key"}},
		// Past the egress proxy, straight to the gateway on the node.
		{"connect to the node directly", []string{"connect", strings.TrimPrefix(g.Endpoint, "https://")}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := run(t, append([]string{"/opt/escape/escape"}, tt.argv...)...)
			if got.code != 1 || !strings.HasPrefix(got.stdout, "denied: ") {
				t.Errorf("%v = %d %q %q, want denied", tt.argv, got.code, got.stdout, got.stderr)
			}
		})
	}
	t.Run("setuid-root binary", func(t *testing.T) {
		if got := run(t, "/opt/escape/escape-suid", "euid"); got.code != 1 || got.stdout != "denied: euid 1000\n" {
			t.Errorf("setuid-root copy = %d %q, want it to run as euid 1000", got.code, got.stdout)
		}
	})
	t.Run("read_only is readable", func(t *testing.T) {
		if got := run(t, "cat", "/opt/escape/data"); got.stdout != "tools\n" {
			t.Errorf("read = %d %q %q", got.code, got.stdout, got.stderr)
		}
	})
	t.Run("read_write is writable", func(t *testing.T) {
		if got := run(t, "sh", "-c", "echo hi > /tmp/f && cat /tmp/f"); got.code != 0 || got.stdout != "hi\n" {
			t.Errorf("write = %d %q %q", got.code, got.stdout, got.stderr)
		}
	})
	t.Run("supervisor still alive", func(t *testing.T) {
		if got := run(t, "echo", "alive"); got.stdout != "alive\n" {
			t.Errorf("exec after the escape attempts = %q", got.stdout)
		}
	})
}
