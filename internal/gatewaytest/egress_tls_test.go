package gatewaytest

import (
	"context"
	"encoding/pem"
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
// handshake (no uninspected fallback).
func TestEgressTLSTerminate(t *testing.T) {
	curl := requireCurl(t)
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
			Binaries: []*sandboxv1.NetworkBinary{{Path: curl}},
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
}
