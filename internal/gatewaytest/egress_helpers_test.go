package gatewaytest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/citest"
)

// requireCurl returns the resolved path of the host's curl; without one
// the test fails under CI=true and is skipped otherwise.
func requireCurl(t testing.TB) string {
	t.Helper()
	curl, err := exec.LookPath("curl")
	if err == nil {
		curl, err = filepath.EvalSymlinks(curl)
	}
	if err != nil {
		citest.SkipOrFail(t, "curl is required: %v", err)
	}
	return curl
}

// egressPolicy is the sandbox policy the egress tests share: the
// workspace, read-only system directories, best-effort Landlock, the
// sandbox user, and the given network rules.
func egressPolicy(rules map[string]*sandboxv1.NetworkPolicyRule) *sandboxv1.SandboxPolicy {
	return &sandboxv1.SandboxPolicy{
		Version: 1,
		Filesystem: &sandboxv1.FilesystemPolicy{
			IncludeWorkdir: true,
			ReadOnly:       []string{"/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc"},
			ReadWrite:      []string{"/tmp"},
		},
		Landlock:        &sandboxv1.LandlockPolicy{Compatibility: "best_effort"},
		Process:         &sandboxv1.ProcessPolicy{RunAsUser: "sandbox", RunAsGroup: "sandbox"},
		NetworkPolicies: rules,
	}
}

// createEgressSandbox creates sandbox name from spec and returns its id.
func createEgressSandbox(ctx context.Context, t testing.TB, c openshellv1.OpenShellClient, name string, spec *openshellv1.SandboxSpec) string {
	t.Helper()
	created, err := c.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: name, Spec: spec})
	if err != nil {
		t.Fatalf("CreateSandbox: %v", err)
	}
	return created.GetSandbox().GetMetadata().GetId()
}

// waitEgressLoaded waits for sandbox name to be READY and fails the test
// unless its policy version 1 is reported LOADED; why, if not empty, is
// appended to the failure message.
func waitEgressLoaded(ctx context.Context, t testing.TB, c openshellv1.OpenShellClient, name, why string) {
	t.Helper()
	WaitPhase(ctx, t, c, name, openshellv1.SandboxPhase_SANDBOX_PHASE_READY, time.Minute)
	if r := waitPolicyStatus(ctx, t, c, name, 1).GetRevision(); r.GetStatus() != openshellv1.PolicyStatus_POLICY_STATUS_LOADED {
		if why != "" {
			why = ": " + why
		}
		t.Fatalf("policy status = %v (%q), want LOADED%s", r.GetStatus(), r.GetLoadError(), why)
	}
}

// waitEgressEvents polls the sandbox's log stream for up to 30 s until
// every matcher in want has matched an egress decision event, failing the
// test on an event that carries the query string and for every matcher
// left unmatched.
func waitEgressEvents(ctx context.Context, t testing.TB, c openshellv1.OpenShellClient, id string, want map[string]func(f map[string]string) bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for len(want) > 0 && time.Now().Before(deadline) {
		resp, err := c.GetSandboxLogs(ctx, &openshellv1.GetSandboxLogsRequest{SandboxId: id, Sources: []string{"sandbox"}})
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range resp.GetLogs() {
			if l.GetTarget() != "openshell_sandbox::egress" {
				continue
			}
			if strings.Contains(fmt.Sprint(l.GetMessage(), l.GetFields()), "query-secret") {
				t.Fatalf("a decision event carries the query string: %v", l)
			}
			for k, match := range want {
				if match(l.GetFields()) {
					delete(want, k)
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	for k := range want {
		t.Errorf("no %q decision event in GetSandboxLogs", k)
	}
}

// recordingUpstream starts a loopback upstream (HTTPS when tls is set)
// that answers "upstream METHOD PATH" and sends "METHOD HOST PATH" of
// every request it receives on seen. It is closed when the test ends.
func recordingUpstream(t testing.TB, tls bool) (upstream *httptest.Server, seen <-chan string, port string, portN uint32) {
	t.Helper()
	ch := make(chan string, 16)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ch <- r.Method + " " + r.Host + " " + r.URL.Path
		fmt.Fprintf(w, "upstream %s %s", r.Method, r.URL.Path)
	})
	if tls {
		upstream = httptest.NewTLSServer(h)
	} else {
		upstream = httptest.NewServer(h)
	}
	t.Cleanup(upstream.Close)
	port, portN = upstreamPort(upstream)
	return upstream, ch, port, portN
}

// upstreamPort is the port of a loopback test server, as text and number.
func upstreamPort(upstream *httptest.Server) (port string, portN uint32) {
	_, port, _ = net.SplitHostPort(upstream.Listener.Addr().String())
	fmt.Sscan(port, &portN)
	return port, portN
}

// requirePython returns the resolved path of the system's python3
// (/usr/bin/python3: a sandbox's root holds the host's /usr, not a
// per-user installation); without it the test fails under CI=true and is
// skipped otherwise.
func requirePython(t testing.TB) string {
	t.Helper()
	python, err := filepath.EvalSymlinks("/usr/bin/python3")
	if err != nil {
		citest.SkipOrFail(t, "/usr/bin/python3 is required (test/install-deps.sh installs it): %v", err)
	}
	return python
}
