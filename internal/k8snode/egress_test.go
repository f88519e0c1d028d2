package k8snode_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/gatewaytest"
)

// serveOn starts an HTTP server answering body on listen until the test
// ends and returns its port.
func serveOn(t *testing.T, listen, body string) int {
	t.Helper()
	l, err := net.Listen("tcp", listen)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, body) }), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return l.Addr().(*net.TCPAddr).Port
}

// TestGatewayEgressInPod: in a real pod the agent's traffic goes through
// the supervisor's egress proxy: a server on the node that the policy
// allows (host, port, allowed_ips, the busybox binary) answers through it,
// one on another port of the same host is refused by the proxy, and a
// direct connection that skips the proxy is refused by the fence.
func TestGatewayEgressInPod(t *testing.T) {
	g := startPodGateway(t, "")
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()

	ip := g.c.Node.IP
	allowed := serveOn(t, net.JoinHostPort(ip, "0"), "allowed upstream")
	other := serveOn(t, net.JoinHostPort(ip, "0"), "other upstream")

	const name = "egress"
	created, err := c.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: name, Spec: &openshellv1.SandboxSpec{
		Command: []string{"sleep", "infinity"},
		Policy: &sandboxv1.SandboxPolicy{
			Version: 1,
			Filesystem: &sandboxv1.FilesystemPolicy{
				IncludeWorkdir: true,
				ReadOnly:       []string{"/bin", "/etc"},
				ReadWrite:      []string{"/tmp"},
			},
			Landlock: &sandboxv1.LandlockPolicy{Compatibility: "best_effort"},
			NetworkPolicies: map[string]*sandboxv1.NetworkPolicyRule{
				"node": {
					Endpoints: []*sandboxv1.NetworkEndpoint{{Host: ip, Port: uint32(allowed), AllowedIps: []string{ip}}},
					Binaries:  []*sandboxv1.NetworkBinary{{Path: "/bin/busybox"}},
				},
			},
		},
	}})
	if err != nil {
		t.Fatalf("CreateSandbox: %v", err)
	}
	id := created.GetSandbox().GetMetadata().GetId()
	t.Cleanup(func() { logPod(t, g.c, g.ns, name) })
	gatewaytest.WaitPhase(ctx, t, c, name, openshellv1.SandboxPhase_SANDBOX_PHASE_READY, 3*time.Minute)
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := c.GetSandboxPolicyStatus(ctx, &openshellv1.GetSandboxPolicyStatusRequest{Name: name, Version: 1})
		if err == nil && st.GetRevision().GetStatus() == openshellv1.PolicyStatus_POLICY_STATUS_LOADED {
			break
		}
		if err == nil && st.GetRevision().GetStatus() == openshellv1.PolicyStatus_POLICY_STATUS_FAILED {
			t.Fatalf("policy FAILED in the pod: %s", st.GetRevision().GetLoadError())
		}
		if time.Now().After(deadline) {
			t.Fatalf("policy not LOADED after 30 s: %v, %v", st, err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	sh := func(script string) (string, string, int32) {
		t.Helper()
		stdout, stderr, code, err := gatewaytest.Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: []string{"sh", "-c", script}})
		if err != nil {
			t.Fatalf("exec %q: %v", script, err)
		}
		return stdout, stderr, code
	}
	url := func(port int) string { return "http://" + net.JoinHostPort(ip, strconv.Itoa(port)) + "/" }

	if out, errOut, code := sh(`echo "$http_proxy"; wget -q -O- ` + url(allowed)); code != 0 || !strings.HasSuffix(out, "allowed upstream") {
		t.Errorf("wget of the allowed server = %q %q (exit %d), want its answer through the proxy", out, errOut, code)
	}
	if out, errOut, code := sh(`wget -q -O- ` + url(other)); code == 0 || strings.Contains(out, "other upstream") {
		t.Errorf("wget of a port the policy does not allow = %q %q (exit %d), want refused", out, errOut, code)
	}
	if out, errOut, code := sh(`http_proxy= wget -q -T 3 -O- ` + url(allowed)); code == 0 || strings.Contains(out, "allowed upstream") {
		t.Errorf("wget around the proxy = %q %q (exit %d), want refused by the fence", out, errOut, code)
	}
}
