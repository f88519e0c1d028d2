package gatewaytest

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/citest"
)

// TestEgressProxy: a real gateway and supervisor; the sandbox's network
// namespace has loopback only and the supervisor's egress proxy is its
// way out. Upstream is a loopback server of this test in the host's
// namespace; the test-only resolver override maps allowed.test and
// other.egress.test to 127.0.0.1, which the policy names in allowed_ips. curl
// reaches the allowed host through forward HTTP and CONNECT (200); another
// host (403), the allowed host on another port (403), wget (another
// binary, 403) and a direct connection to the upstream's port (no route
// out) fail; destinations a rule allows but that are cloud metadata
// (address or name), link-local, private or unique-local (by the
// resolver's answer, also a private address next to an allowed one) get
// 403 from the SSRF guard, with its reason; every
// decision is in the sandbox's log stream and in openshell logs. Then live reload: allow, a FAILED version that keeps the
// previous rules, and back to deny, each within 2 s.
func TestEgressProxy(t *testing.T) {
	curl, port, portN := egressUpstream(t)

	g := Start(t, Options{Env: []string{"OPENSHELL_EGRESS_TEST_HOSTS=allowed.test=127.0.0.1,other.egress.test=127.0.0.1,internal.egress.test=127.0.0.1," +
		"linklocal.egress.test=169.254.169.254,private.egress.test=10.1.2.3,ula.egress.test=fd00::1," +
		// Two answers for one name: the allowed loopback address first,
		// then a private one (a rebinding answer); the whole answer is
		// checked, not only the address that would be dialed first.
		"mixed.egress.test=127.0.0.1,mixed.egress.test=10.1.2.3"}})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	pol := egressPolicy(map[string]*sandboxv1.NetworkPolicyRule{
		"upstream": {
			Endpoints: []*sandboxv1.NetworkEndpoint{
				{Host: "allowed.test", Port: portN, AllowedIps: []string{"127.0.0.1"}},
				// Allowed by name, but it resolves to loopback and
				// allowed_ips does not say so: the SSRF guard refuses it.
				{Host: "internal.egress.test", Port: portN},
				{Host: "mixed.egress.test", Port: portN, AllowedIps: []string{"127.0.0.1"}},
			},
			Binaries: []*sandboxv1.NetworkBinary{{Path: curl}},
		},
		// Destinations the policy allows by name or address but that
		// are (or resolve to) cloud metadata, link-local, private or
		// unique-local addresses without allowed_ips: the SSRF guard,
		// not a missing rule, must refuse each of them.
		"internal": {
			Endpoints: []*sandboxv1.NetworkEndpoint{
				{Host: "169.254.169.254", Port: 80},
				{Host: "metadata.google.internal", Port: 80},
				{Host: "linklocal.egress.test", Port: portN},
				{Host: "private.egress.test", Port: portN},
				{Host: "ula.egress.test", Port: portN},
			},
			Binaries: []*sandboxv1.NetworkBinary{{Path: curl}},
		},
		// A binary the agent itself writes into the workspace.
		"copied": {
			Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "allowed.test", Port: portN, AllowedIps: []string{"127.0.0.1"}}},
			Binaries:  []*sandboxv1.NetworkBinary{{Path: "/sandbox/bin/client"}},
		},
	})
	id := createEgressSandbox(ctx, t, c, "egress", &openshellv1.SandboxSpec{Command: []string{"sleep", "infinity"}, Policy: pol})
	waitEgressLoaded(ctx, t, c, "egress", "the proxy enforces host, port, allowed_ips and binaries")

	sh := func(script string) (string, int32) {
		t.Helper()
		out, errOut, code, err := Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: []string{"sh", "-c", script}})
		if err != nil {
			t.Fatalf("exec %q: %v (stderr %q)", script, err, errOut)
		}
		return strings.TrimSpace(out), code
	}
	if out, _ := sh("env | grep -i _proxy= | sort"); !strings.Contains(out, "HTTPS_PROXY=http://127.0.0.1:3128") || !strings.Contains(out, "http_proxy=http://127.0.0.1:3128") ||
		!strings.Contains(out, "ALL_PROXY=http://127.0.0.1:3128") || !strings.Contains(out, "NO_PROXY=localhost,127.0.0.1,::1") {
		t.Errorf("proxy environment of an agent process:\n%s", out)
	}
	target := "http://allowed.test:" + port + "/"
	if out, _ := sh(curl + " -s -w ' %{http_code}' '" + target + "?token=query-secret'"); out != "upstream saw allowed.test:"+port+" 200" {
		t.Errorf("curl through the proxy (forward HTTP) = %q, want the upstream's 200", out)
	}
	if out, _ := sh(curl + " -s -p -o /dev/null -w '%{http_code}' " + target); out != "200" {
		t.Errorf("curl through the proxy (CONNECT) = %q, want 200", out)
	}
	if out, _ := sh(curl + " -s -o /dev/null -w '%{http_code}' http://other.egress.test:" + port + "/"); out != "403" {
		t.Errorf("curl to another host = %q, want 403", out)
	}
	wget, err := exec.LookPath("wget")
	if err == nil {
		wget, err = filepath.EvalSymlinks(wget)
	}
	switch {
	case err == nil:
		if out, code := sh(wget + " -q -O - " + target); code == 0 || strings.Contains(out, "upstream saw") {
			t.Errorf("wget (not in the rule's binaries) got through: exit %d, %q", code, out)
		}
	case citest.CI():
		t.Errorf("wget not found (CI=true; test/install-deps.sh installs it): %v", err)
	default:
		t.Logf("wget not installed: the other-binary case is not run")
	}
	if out, code := sh(curl + " -s --noproxy '*' --max-time 5 -o /dev/null -w '%{http_code}' http://127.0.0.1:" + port + "/"); code == 0 || out != "000" {
		t.Errorf("direct connection to the upstream's port = exit %d %q, want a failure (loopback only)", code, out)
	}
	if out, code := sh(curl + " -s --noproxy '*' --max-time 5 -o /dev/null -w '%{http_code}' http://192.0.2.1/"); code == 0 || out != "000" {
		t.Errorf("direct connection to an outside address = exit %d %q, want a failure (no route)", code, out)
	}
	if out, code := sh(curl + " -s -o /dev/null -w '%{http_code}' http://internal.egress.test:" + port + "/"); out != "403" {
		t.Errorf("allowed name resolving to loopback without allowed_ips = exit %d %q, want 403 (SSRF guard)", code, out)
	}
	// The allowed host on a port no endpoint names.
	wrongPort := strconv.Itoa(int(portN%65535) + 1)
	if out, code := sh(curl + " -s --max-time 10 -o /dev/null -w '%{http_code}' http://allowed.test:" + wrongPort + "/"); out != "403" {
		t.Errorf("allowed host on another port = exit %d %q, want 403", code, out)
	}
	for _, u := range []string{"http://169.254.169.254/latest/meta-data/", "http://metadata.google.internal/computeMetadata/v1/",
		"http://mixed.egress.test:" + port + "/", "http://linklocal.egress.test:" + port + "/", "http://private.egress.test:" + port + "/", "http://ula.egress.test:" + port + "/"} {
		if out, code := sh(curl + " -s --max-time 10 -o /dev/null -w '%{http_code}' " + u); out != "403" {
			t.Errorf("%s = exit %d %q, want 403 (SSRF guard)", u, code, out)
		}
	}
	// Trust on first use: the workspace copy of curl is allowed by path;
	// once replaced by different content at that path it is denied.
	if out, _ := sh("mkdir -p /sandbox/bin && cp " + curl + " /sandbox/bin/client && /sandbox/bin/client -s -o /dev/null -w '%{http_code}' " + target); out != "200" {
		t.Errorf("workspace binary allowed by path, first use = %q, want 200", out)
	}
	if out, _ := sh("cp " + curl + " /sandbox/bin/client.new && echo changed >> /sandbox/bin/client.new && mv /sandbox/bin/client.new /sandbox/bin/client && " +
		"/sandbox/bin/client -s -o /dev/null -w '%{http_code}' " + target); out != "403" {
		t.Errorf("replaced workspace binary at the allowed path = %q, want 403", out)
	}

	// UDP (DNS included) has no way out: no route, and the proxy speaks
	// HTTP only.
	helper := g.InstallHelper(t, id)
	if out, code := sh(helper + " udp 192.0.2.1:53"); code == 0 || !strings.Contains(out, "network is unreachable") {
		t.Errorf("direct UDP send to an outside address: exit %d %q, want network unreachable", code, out)
	}

	// The decisions are in the sandbox's log stream.
	want := map[string]func(f map[string]string) bool{
		"allow": func(f map[string]string) bool {
			return f["decision"] == "allow" && f["host"] == "allowed.test" && f["ip"] == "127.0.0.1" && f["port"] == port &&
				f["policy"] == "upstream" && f["binary"] == curl && f["pid"] != "" && f["pid"] != "0"
		},
		"deny internal address": func(f map[string]string) bool {
			return f["decision"] == "deny" && f["host"] == "internal.egress.test" && f["policy"] == "upstream" &&
				f["reason"] == "address 127.0.0.1 is internal (loopback, link-local, private or reserved) and not in the endpoint's allowed_ips"
		},
		"deny wrong port": func(f map[string]string) bool {
			return f["decision"] == "deny" && f["host"] == "allowed.test" && f["port"] == wrongPort &&
				f["reason"] == "endpoint allowed.test:"+wrongPort+" is not allowed by any policy"
		},
		"deny metadata address": func(f map[string]string) bool {
			return f["decision"] == "deny" && f["host"] == "169.254.169.254" && f["policy"] == "internal" &&
				f["reason"] == "address 169.254.169.254 is internal (loopback, link-local, private or reserved) and not in the endpoint's allowed_ips"
		},
		"deny metadata name": func(f map[string]string) bool {
			return f["decision"] == "deny" && f["host"] == "metadata.google.internal" && f["policy"] == "internal" &&
				f["reason"] == "host metadata.google.internal is a cloud metadata service"
		},
		"deny name resolving to loopback and private": func(f map[string]string) bool {
			return f["decision"] == "deny" && f["host"] == "mixed.egress.test" && f["policy"] == "upstream" &&
				f["reason"] == "address 10.1.2.3 is internal (loopback, link-local, private or reserved) and not in the endpoint's allowed_ips"
		},
		"deny name resolving to link-local": func(f map[string]string) bool {
			return f["decision"] == "deny" && f["host"] == "linklocal.egress.test" && f["policy"] == "internal" &&
				f["reason"] == "address 169.254.169.254 is internal (loopback, link-local, private or reserved) and not in the endpoint's allowed_ips"
		},
		"deny name resolving to private": func(f map[string]string) bool {
			return f["decision"] == "deny" && f["host"] == "private.egress.test" && f["policy"] == "internal" &&
				f["reason"] == "address 10.1.2.3 is internal (loopback, link-local, private or reserved) and not in the endpoint's allowed_ips"
		},
		"deny name resolving to unique-local": func(f map[string]string) bool {
			return f["decision"] == "deny" && f["host"] == "ula.egress.test" && f["policy"] == "internal" &&
				f["reason"] == "address fd00::1 is internal (loopback, link-local, private or reserved) and not in the endpoint's allowed_ips"
		},
		"deny replaced binary": func(f map[string]string) bool {
			return f["decision"] == "deny" && f["binary"] == "/sandbox/bin/client" && strings.Contains(f["reason"], "binary /sandbox/bin/client changed since its first use")
		},
		"deny other host": func(f map[string]string) bool {
			return f["decision"] == "deny" && f["host"] == "other.egress.test" && f["binary"] == curl &&
				f["reason"] == "endpoint other.egress.test:"+port+" is not allowed by any policy"
		},
	}
	if wget != "" && err == nil {
		// Denied for its binary, not for anything else.
		want["deny wget"] = func(f map[string]string) bool {
			return f["decision"] == "deny" && f["binary"] == wget && f["host"] == "allowed.test" &&
				strings.HasPrefix(f["reason"], "binary '"+wget+"' not allowed in policy ")
		}
	}
	waitEgressEvents(ctx, t, c, id, want)
	// openshell logs shows them.
	logs := newCLI(t, g).ok("logs", "egress", "--source", "sandbox")
	for _, w := range []string{"openshell_sandbox::egress: egress allow ", "binary=" + curl + " ", "host=allowed.test ",
		"openshell_sandbox::egress: egress deny ", "host=other.egress.test ", "reason=endpoint other.egress.test:" + port + " is not allowed by any policy"} {
		if !strings.Contains(logs, w) {
			t.Errorf("openshell logs egress lacks %q:\n%s", w, logs)
		}
	}
	if strings.Contains(logs, "query-secret") {
		t.Errorf("openshell logs shows the query string:\n%s", logs)
	}

	// Live reload: a new version is polled, swapped in for new
	// connections and reported within 2 s; a version the proxy cannot
	// enforce is FAILED and the previous rules stay in force.
	otherURL := "http://other.egress.test:" + port + "/"
	curlOther := func() string {
		out, _ := sh(curl + " -s -o /dev/null -w '%{http_code}' " + otherURL)
		return out
	}
	update := func(p *sandboxv1.SandboxPolicy, want openshellv1.PolicyStatus) *openshellv1.SandboxPolicyRevision {
		t.Helper()
		up, err := c.UpdateConfig(ctx, &openshellv1.UpdateConfigRequest{Name: "egress", Policy: p})
		if err != nil {
			t.Fatalf("UpdateConfig: %v", err)
		}
		start := time.Now()
		for {
			st, err := c.GetSandboxPolicyStatus(ctx, &openshellv1.GetSandboxPolicyStatusRequest{Name: "egress", Version: up.GetVersion()})
			if err == nil && st.GetRevision().GetStatus() == want {
				t.Logf("version %d %v after %v", up.GetVersion(), want, time.Since(start))
				return st.GetRevision()
			}
			if time.Since(start) > 2*time.Second {
				t.Fatalf("version %d not %v within 2s: %v, %v", up.GetVersion(), want, st.GetRevision(), err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	allowOther := proto.Clone(pol).(*sandboxv1.SandboxPolicy)
	allowOther.NetworkPolicies["other"] = &sandboxv1.NetworkPolicyRule{
		Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "*.egress.test", Port: portN, AllowedIps: []string{"127.0.0.1"}}},
		Binaries:  []*sandboxv1.NetworkBinary{{Path: "/usr/**"}},
	}
	update(allowOther, openshellv1.PolicyStatus_POLICY_STATUS_LOADED)
	if got := curlOther(); got != "200" {
		t.Errorf("after the reload allowing *.egress.test: curl other.egress.test = %q, want 200", got)
	}
	l7 := proto.Clone(pol).(*sandboxv1.SandboxPolicy)
	l7.NetworkPolicies["other"] = &sandboxv1.NetworkPolicyRule{
		Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "other.egress.test", Port: portN, Tls: "terminate", AllowedIps: []string{"127.0.0.1"}}},
		Binaries:  []*sandboxv1.NetworkBinary{{Path: curl}},
	}
	rev := update(l7, openshellv1.PolicyStatus_POLICY_STATUS_FAILED)
	if !strings.Contains(rev.GetLoadError(), `rule "other" endpoint "other.egress.test" asks for tls "terminate" without protocol rest (only REST requests are inspected)`) ||
		!strings.Contains(rev.GetLoadError(), "the previous network rules stay in force") {
		t.Errorf("FAILED reload reason = %q", rev.GetLoadError())
	}
	if got := curlOther(); got != "200" {
		t.Errorf("after a FAILED reload: curl other.egress.test = %q, want 200 (the previous rules stay)", got)
	}
	update(pol, openshellv1.PolicyStatus_POLICY_STATUS_LOADED)
	if got := curlOther(); got != "403" {
		t.Errorf("after the reload back to the first rules: curl other.egress.test = %q, want 403", got)
	}
}

// egressUpstream returns curl's resolved path (the test fails under
// CI=true without it) and the port of a loopback upstream in the host's
// namespace that answers "upstream saw <Host>"; it stops with the test.
func egressUpstream(t *testing.T) (curl, port string, portN uint32) {
	t.Helper()
	curl = requireCurl(t)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "upstream saw %s", r.Host)
	}))
	t.Cleanup(upstream.Close)
	port, portN = upstreamPort(upstream)
	return curl, port, portN
}

// TestEgressProxyAfterGatewayRestart: the supervisor's egress proxy
// reaches upstream through the process driver's host dialer. A gateway
// killed and started again re-attaches the running supervisor, whose
// inherited dialer channel died with the old gateway: the agent's
// request through the proxy must succeed again (the supervisor reconnects
// to the dialer socket the new gateway serves). Both kinds of sandbox:
// one without an image (curl from the host system) and a dir: image one
// (sbhelper get, a static binary, in its workspace).
func TestEgressProxyAfterGatewayRestart(t *testing.T) {
	curl, port, portN := egressUpstream(t)
	t.Run("host", func(t *testing.T) {
		egressAfterRestart(t, "", curl, port, portN, []string{"sh", "-c", curl + " -s --max-time 10 -w ' %{http_code}' http://allowed.test:" + port + "/"},
			"upstream saw allowed.test:"+port+" 200")
	})
	t.Run("image", func(t *testing.T) {
		egressAfterRestart(t, busyboxRootfs(t), helperInWorkspace, port, portN, []string{helperInWorkspace, "get", "http://allowed.test:" + port + "/"},
			"upstream saw allowed.test:"+port)
	})
}

// egressAfterRestart runs TestEgressProxyAfterGatewayRestart for one
// sandbox: the image directory rootfs ("": none), the binary the policy
// allows, the agent's fetch command and its wanted output.
func egressAfterRestart(t *testing.T, rootfs, binary, port string, portN uint32, fetchCmd []string, want string) {
	env := []string{"OPENSHELL_EGRESS_TEST_HOSTS=allowed.test=127.0.0.1"}
	g := Start(t, Options{Env: env})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	pol := egressPolicy(map[string]*sandboxv1.NetworkPolicyRule{
		"upstream": {
			Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "allowed.test", Port: portN, AllowedIps: []string{"127.0.0.1"}}},
			Binaries:  []*sandboxv1.NetworkBinary{{Path: binary}},
		},
	})
	spec := &openshellv1.SandboxSpec{Command: []string{"sleep", "infinity"}, Policy: pol}
	if rootfs != "" {
		spec.Command = []string{"/bin/sh", "-c", "sleep 1000000"}
		spec.Template = &openshellv1.SandboxTemplate{Image: "dir:" + rootfs}
	}
	id := createEgressSandbox(ctx, t, c, "egress-restart", spec)
	if rootfs != "" {
		g.InstallHelper(t, id)
	}
	waitEgressLoaded(ctx, t, c, "egress-restart", "")
	fetch := func(c openshellv1.OpenShellClient) (string, string, int32) {
		t.Helper()
		out, errOut, code, err := Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: fetchCmd})
		if err != nil {
			t.Fatalf("exec %q: %v (stderr %q)", fetchCmd, err, errOut)
		}
		return strings.TrimSpace(out), errOut, code
	}
	if out, errOut, code := fetch(c); out != want || code != 0 {
		t.Fatalf("fetch through the proxy before the restart = exit %d %q (stderr %q), want %q", code, out, errOut, want)
	}
	pid := supervisorPID(t, g, id)

	g.Kill()
	g2 := Start(t, Options{StateDir: g.StateDir, TLSDir: g.TLSDir, Port: g.Port, Env: env})
	c2 := g2.Client()
	WaitPhase(ctx, t, c2, "egress-restart", openshellv1.SandboxPhase_SANDBOX_PHASE_READY, time.Minute)
	if got := supervisorPID(t, g2, id); got != pid {
		t.Fatalf("supervisor pid %d after the restart, want the re-attached %d", got, pid)
	}
	if out, errOut, code := fetch(c2); out != want || code != 0 {
		t.Fatalf("fetch through the proxy after the gateway restart = exit %d %q (stderr %q), want %q (the re-attached supervisor lost its host dialer)", code, out, errOut, want)
	}
}
