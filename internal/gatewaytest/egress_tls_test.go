package gatewaytest

import (
	"context"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// TestEgressTLSTerminate: a real gateway and supervisor, curl in the
// sandbox and a loopback HTTPS upstream of this test (its CA given to the
// supervisor through the test-only OPENSHELL_EGRESS_TEST_CA_FILE). An
// endpoint with protocol: rest and tls: terminate is reported LOADED; curl,
// trusting the bundle named by the agent's CA variables, gets the
// upstream's 200 for GET through CONNECT and OpenShell's 403 for POST
// (never forwarded); curl trusting only the system roots fails the
// handshake (no uninspected fallback). Python (the system's python3,
// urllib and ssl, allowed by the rule's binaries too) does the same: its
// default context trusts the sandbox CA through SSL_CERT_FILE, a context
// built from REQUESTS_CA_BUNDLE alone (what Python requests does) trusts
// it too, the bundle is a copy of the sandbox's system bundle plus the
// sandbox CA, and Python without those variables fails verification.
func TestEgressTLSTerminate(t *testing.T) {
	curl := requireCurl(t)
	python := requirePython(t)
	upstream, seen, port, portN := recordingUpstream(t, true)
	// Readable by the supervisor, which may run under other ids in a user
	// namespace of its own (t.TempDir's parent is private).
	caDir, err := os.MkdirTemp("", "egress-tls-ca-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(caDir) })
	if err := os.Chmod(caDir, 0o755); err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(caDir, "upstream-ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: upstream.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}

	// httptest's certificate names example.com.
	g := Start(t, Options{Env: []string{"OPENSHELL_EGRESS_TEST_HOSTS=example.com=127.0.0.1", "OPENSHELL_EGRESS_TEST_CA_FILE=" + caFile}})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	pol := egressPolicy(map[string]*sandboxv1.NetworkPolicyRule{
		"api": {
			Endpoints: []*sandboxv1.NetworkEndpoint{
				{Host: "example.com", Port: portN, AllowedIps: []string{"127.0.0.1"}, Protocol: "rest", Tls: "terminate", Enforcement: "enforce", Access: "read-only"},
			},
			Binaries: []*sandboxv1.NetworkBinary{{Path: curl}, {Path: python}},
		},
	})
	id := createEgressSandbox(ctx, t, c, "tls", &openshellv1.SandboxSpec{Command: []string{"sleep", "infinity"}, Policy: pol})
	waitEgressLoaded(ctx, t, c, "tls", "tls terminate on a rest endpoint is enforced")
	sh := func(script string) (string, string) {
		t.Helper()
		out, errOut, _, err := Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: []string{"sh", "-c", script}})
		if err != nil {
			t.Fatalf("exec %q: %v (stderr %q)", script, err, errOut)
		}
		return strings.TrimSpace(out), errOut
	}
	api := "https://example.com:" + port
	if out, errOut := sh(`test "$SSL_CERT_FILE" = "$CURL_CA_BUNDLE" && test "$SSL_CERT_FILE" = "$REQUESTS_CA_BUNDLE" && test "$SSL_CERT_FILE" = "$NODE_EXTRA_CA_CERTS" && grep -c 'BEGIN CERTIFICATE' "$SSL_CERT_FILE"`); out == "" || out == "0" {
		t.Fatalf("the agent's CA bundle: %q %q", out, errOut)
	}
	if out, errOut := sh(curl + " -s -w ' %{http_code}' '" + api + "/repos/x?token=query-secret'"); out != "upstream GET /repos/x 200" {
		t.Errorf("GET = %q (stderr %q), want the upstream's 200", out, errOut)
	}
	select {
	case got := <-seen:
		if got != "GET example.com:"+port+" /repos/x" {
			t.Errorf("upstream saw %q", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream received no request")
	}
	if out, _ := sh(curl + " -s -X POST -d data -w ' %{http_code}' " + api + "/repos/x"); !strings.HasSuffix(out, " 403") ||
		!strings.Contains(out, `"detail":"POST /repos/x not permitted by policy"`) {
		t.Errorf("POST = %q, want OpenShell's JSON 403", out)
	}
	// Trusting only the system roots: the sandbox CA's leaf is refused.
	if out, _ := sh("env -u SSL_CERT_FILE -u CURL_CA_BUNDLE " + curl + " -s -o /dev/null -w '%{http_code}' " + api + "/repos/x; echo \" exit=$?\""); !strings.Contains(out, "exit=60") && !strings.Contains(out, "exit=77") {
		t.Errorf("curl without the sandbox CA = %q, want a certificate failure (exit 60)", out)
	}
	select {
	case got := <-seen:
		t.Errorf("upstream saw %q after the denials", got)
	default:
	}

	// Python inside the sandbox: urllib through HTTPS_PROXY (CONNECT), TLS
	// verified by the ssl module against what the agent's environment
	// names. It prints the status (or the HTTP error's status and body,
	// or the exception's name and reason).
	py := func(env, ctxExpr, method string) string {
		t.Helper()
		script := `import os, ssl, sys, urllib.error, urllib.request
ctx = ` + ctxExpr + `
req = urllib.request.Request(sys.argv[1], method=sys.argv[2], data=b"data" if sys.argv[2] == "POST" else None)
try:
    r = urllib.request.urlopen(req, context=ctx, timeout=20)
    print(r.status, r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode())
except Exception as e:
    print(type(e).__name__, getattr(e, "reason", e))
`
		out, errOut := sh(env + python + " -c '" + strings.ReplaceAll(script, "'", `'\''`) + "' " + api + "/repos/py " + method)
		if errOut != "" {
			t.Logf("python stderr: %s", errOut)
		}
		return out
	}
	if out := py("", "ssl.create_default_context()", "GET"); out != "200 upstream GET /repos/py" {
		t.Errorf("python GET (default context, SSL_CERT_FILE) = %q, want the upstream's 200", out)
	}
	select {
	case got := <-seen:
		if got != "GET example.com:"+port+" /repos/py" {
			t.Errorf("upstream saw %q", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream received no request from python")
	}
	if out := py("env -u SSL_CERT_FILE -u CURL_CA_BUNDLE ", `ssl.create_default_context(cafile=os.environ["REQUESTS_CA_BUNDLE"])`, "GET"); out != "200 upstream GET /repos/py" {
		t.Errorf("python GET (REQUESTS_CA_BUNDLE only) = %q, want the upstream's 200", out)
	}
	<-seen
	if out := py("", "ssl.create_default_context()", "POST"); !strings.HasPrefix(out, "403 ") ||
		!strings.Contains(out, `"detail":"POST /repos/py not permitted by policy"`) {
		t.Errorf("python POST = %q, want OpenShell's JSON 403", out)
	}
	if out := py("env -u SSL_CERT_FILE -u REQUESTS_CA_BUNDLE -u CURL_CA_BUNDLE -u NODE_EXTRA_CA_CERTS ", "ssl.create_default_context()", "GET"); !strings.Contains(out, "CERTIFICATE_VERIFY_FAILED") {
		t.Errorf("python without the sandbox CA = %q, want CERTIFICATE_VERIFY_FAILED", out)
	}
	// The bundle is the system bundle of the sandbox's filesystem plus
	// the sandbox CA, so other hosts' certificates still verify.
	if out, errOut := sh(`sys=$(grep -c 'BEGIN CERTIFICATE' /etc/ssl/certs/ca-certificates.crt) && b=$(grep -c 'BEGIN CERTIFICATE' "$REQUESTS_CA_BUNDLE") && ` +
		`head -c "$(wc -c < /etc/ssl/certs/ca-certificates.crt)" "$REQUESTS_CA_BUNDLE" | cmp -s - /etc/ssl/certs/ca-certificates.crt && echo "$sys $b"`); func() bool {
		var sys, b int
		_, err := fmt.Sscan(out, &sys, &b)
		return err != nil || sys == 0 || b != sys+1
	}() {
		t.Errorf("the agent's bundle is not the system bundle plus the sandbox CA: %q %q", out, errOut)
	}
	select {
	case got := <-seen:
		t.Errorf("upstream saw %q after python's denials", got)
	default:
	}
}
