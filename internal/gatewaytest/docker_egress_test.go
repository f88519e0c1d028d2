package gatewaytest

import (
	"context"
	"github.com/docker/docker/api/types/container"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/compute/docker"
)

// TestDockerEgress: a Docker sandbox (network mode none) whose policy has
// network rules reports it LOADED, and its agent reaches an allowed
// loopback-mapped host through the supervisor's proxy (the driver's host
// dialer dials from the host); another host gets 403; a direct
// connection has no route; the agent cannot open the dialer socket's
// directory even with /run in its Landlock read-only paths; after kill -9
// of the gateway and a restart, the re-attached supervisor reaches the
// upstream again through the dialer socket the new gateway serves.
func TestDockerEgress(t *testing.T) {
	_, port, portN := egressUpstream(t)
	env := []string{"OPENSHELL_EGRESS_TEST_HOSTS=allowed.test=127.0.0.1,other.egress.test=127.0.0.1"}
	g, cli, img := dockerGateway(t, Options{Env: env})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	pol := egressPolicy(map[string]*sandboxv1.NetworkPolicyRule{
		"upstream": {
			Endpoints: []*sandboxv1.NetworkEndpoint{
				{Host: "allowed.test", Port: portN, AllowedIps: []string{"127.0.0.1"}},
				{Host: "other.egress.test", Port: portN + 1, AllowedIps: []string{"127.0.0.1"}},
			},
			Binaries: []*sandboxv1.NetworkBinary{{Path: helperInWorkspace}},
		},
	})
	pol.Filesystem.ReadOnly = append(pol.Filesystem.ReadOnly, "/run")
	id := createEgressSandbox(ctx, t, c, "dock-egress", &openshellv1.SandboxSpec{
		Command:  []string{"sleep", "1000000"},
		Template: &openshellv1.SandboxTemplate{Image: img},
		Policy:   pol,
	})
	waitEgressLoaded(ctx, t, c, "dock-egress", "the Docker sandbox's proxy dials through the host dialer")
	helper, err := os.ReadFile(HelperBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	copyInto(t, cli, "openshell-"+id, "/sandbox", ".sbhelper", helper, 0o755)

	sh := func(c openshellv1.OpenShellClient, script string) (string, string, int32) {
		t.Helper()
		out, errOut, code, err := Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: []string{"sh", "-c", script}})
		if err != nil {
			t.Fatalf("exec %q: %v", script, err)
		}
		return strings.TrimSpace(out), strings.TrimSpace(errOut), code
	}
	want := "upstream saw allowed.test:" + port
	get := helperInWorkspace + " get http://allowed.test:" + port + "/"
	if out, errOut, code := sh(c, get); out != want || code != 0 {
		if rc, err := cli.ContainerLogs(ctx, "openshell-"+id, container.LogsOptions{ShowStdout: true, ShowStderr: true}); err == nil {
			b, _ := io.ReadAll(rc)
			t.Logf("container log:\n%s", b)
		}
		t.Fatalf("allowed host through the proxy = exit %d %q (stderr %q), want %q", code, out, errOut, want)
	}
	if out, errOut, code := sh(c, helperInWorkspace+" get http://other.egress.test:"+port+"/"); code == 0 || !strings.Contains(errOut, "403") {
		t.Errorf("denied host through the proxy = exit %d %q (stderr %q), want 403", code, out, errOut)
	}
	if out, errOut, code := sh(c, "http_proxy= HTTP_PROXY= "+helperInWorkspace+" get http://192.0.2.1:"+port+"/"); code == 0 || !strings.Contains(errOut, "network is unreachable") {
		t.Errorf("direct connection from the agent = exit %d %q (stderr %q), want network is unreachable", code, out, errOut)
	}
	if out, errOut, code := sh(c, "ls "+docker.EgressDir+"; cat "+docker.EgressDir+"/dialer.sock"); code == 0 || strings.Count(errOut, "Permission denied") != 2 {
		t.Errorf("agent opening the dialer socket directory = exit %d %q (stderr %q), want Permission denied twice", code, out, errOut)
	}
	if st, err := os.Stat(g.StateDir + "/docker/egress/" + id); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("dialer directory on the host: %v %v, want mode 0700", st, err)
	}

	g.Kill()
	g2, _, _ := dockerGateway(t, Options{StateDir: g.StateDir, TLSDir: g.TLSDir, Port: g.Port, Env: env})
	c2 := g2.Client()
	WaitPhase(ctx, t, c2, "dock-egress", openshellv1.SandboxPhase_SANDBOX_PHASE_READY, time.Minute)
	if out, errOut, code := sh(c2, get); out != want || code != 0 {
		t.Fatalf("allowed host after the gateway restart = exit %d %q (stderr %q), want %q (the re-attached supervisor lost its host dialer)", code, out, errOut, want)
	}
	if _, err := c2.DeleteSandbox(ctx, &openshellv1.DeleteSandboxRequest{Name: "dock-egress"}); err != nil {
		t.Fatal(err)
	}
	waitGone(ctx, t, c2, "dock-egress")
	if _, err := os.Stat(g.StateDir + "/docker/egress/" + id); !os.IsNotExist(err) {
		t.Errorf("dialer directory after delete: %v, want gone", err)
	}
}
