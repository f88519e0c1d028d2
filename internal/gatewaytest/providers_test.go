package gatewaytest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/citest"
	"github.com/openshell-go/openshell/internal/securityevent"
)

// TestProviderPlaceholderInSandbox: a provider created through the real
// gateway is named by a sandbox create; inside the sandbox, the main
// process and an exec see the credential key with a placeholder, never
// the value; the gateway's database files do not hold the value and its
// key-encryption key file is 0600.
func TestProviderPlaceholderInSandbox(t *testing.T) {
	g := Start(t, Options{})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	const secret = "ghp_e2e-secret-value-4711"
	_, err := c.CreateProvider(ctx, &openshellv1.CreateProviderRequest{Provider: &datamodelv1.Provider{
		Metadata: &datamodelv1.ObjectMeta{Name: "gh"}, Type: "github",
		Credentials: map[string]string{"GITHUB_TOKEN": secret},
	}})
	if err != nil {
		t.Fatalf("CreateProvider: %v", err)
	}
	if _, err := c.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: "prov", Spec: &openshellv1.SandboxSpec{
		Providers: []string{"gh"},
		Command:   []string{"sh", "-c", "env > /sandbox/main.env; sleep infinity"},
	}}); err != nil {
		t.Fatalf("CreateSandbox naming provider gh: %v", err)
	}
	sb := WaitPhase(ctx, t, c, "prov", openshellv1.SandboxPhase_SANDBOX_PHASE_READY, time.Minute)
	id := sb.GetMetadata().GetId()

	const want = "GITHUB_TOKEN=openshell:resolve:env:GITHUB_TOKEN"
	out, errOut, code, err := Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: []string{"env"}})
	if err != nil || code != 0 {
		t.Fatalf("exec env = %d, %v (stderr %q)", code, err, errOut)
	}
	if !strings.Contains(out, want+"\n") {
		t.Errorf("exec env lacks %q:\n%s", want, out)
	}
	if strings.Contains(out, secret) {
		t.Error("exec env shows the credential value")
	}
	var mainEnv string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		mainEnv, _, code, err = Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: []string{"cat", "/sandbox/main.env"}})
		if err == nil && code == 0 && mainEnv != "" {
			break
		}
	}
	if !strings.Contains(mainEnv, want+"\n") || strings.Contains(mainEnv, secret) {
		t.Errorf("main process environment lacks %q or shows the value:\n%s", want, mainEnv)
	}

	files, _ := filepath.Glob(filepath.Join(g.StateDir, "openshell.db*"))
	if len(files) == 0 {
		t.Fatal("no database files under the state directory")
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte(secret)) {
			t.Errorf("%s holds the credential value in plaintext", filepath.Base(f))
		}
	}
	fi, err := os.Stat(filepath.Join(g.StateDir, "credentials.kek"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("credentials.kek mode = %04o, want 0600", fi.Mode().Perm())
	}
}

// tlsUpstream starts an HTTPS server on addr (host:port) whose leaf,
// issued by a fresh CA, names hosts; it sends the Authorization header of
// every request on seen. It returns the CA's PEM file, in a directory the
// supervisor can read.
func tlsUpstream(t *testing.T, addr string, hosts []string, seen chan<- string) string {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "e2e upstream CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	leafKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leafDER, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: hosts[0]},
		DNSNames: hosts, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, ca, &leafKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		citest.SkipOrFail(t, "listen %s: %v", addr, err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Host + " " + r.Header.Get("Authorization")
		fmt.Fprint(w, "upstream ok")
	}))
	srv.Listener.Close()
	srv.Listener = ln
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{leafDER}, PrivateKey: leafKey}}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	dir, err := os.MkdirTemp("", "provider-e2e-ca-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}

// TestProviderCredentialResolution: a real gateway, supervisor and
// sandbox; a github provider's token is only a placeholder inside the
// sandbox, and curl sending it in Authorization to api.github.com (mapped
// to a loopback HTTPS upstream on port 443 (needs root or
// CAP_NET_BIND_SERVICE; under CI=true it fails without) through the test-only resolver
// and CA overrides; the TLS tunnel is terminated by the egress proxy)
// reaches the upstream with the real value. The same placeholder to
// another allowed host is 403 credential_endpoint_mismatch, logged without
// placeholder, key or value; an update of the provider reaches the running
// sandbox; an expired credential and a detached provider are refused (500,
// never forwarded).
func TestProviderCredentialResolution(t *testing.T) {
	curl := requireCurl(t)
	gh := make(chan string, 64)
	// Port 443 as the github profile names it, on a loopback address of
	// its own (random, so that concurrent runs do not collide).
	lo := fmt.Sprintf("127.%d.%d.%d", 1+mrand.IntN(254), 1+mrand.IntN(254), 1+mrand.IntN(254))
	caFile := tlsUpstream(t, lo+":443", []string{"api.github.com"}, gh)
	_, otherSeen, otherPort, otherPortN := recordingUpstream(t, false)
	events := filepath.Join(TempDir(t), "events.jsonl")
	g := Start(t, Options{Env: []string{"OPENSHELL_EGRESS_TEST_HOSTS=api.github.com=" + lo + ",other.test=127.0.0.1", "OPENSHELL_EGRESS_TEST_CA_FILE=" + caFile},
		ExtraArgs: []string{"--security-event-sink", events}})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 6*time.Minute)
	defer cancel()
	const secret, rotated = "ghp_e2e-first-4711", "ghp_e2e-rotated-0815"
	if _, err := c.CreateProvider(ctx, &openshellv1.CreateProviderRequest{Provider: &datamodelv1.Provider{
		Metadata: &datamodelv1.ObjectMeta{Name: "gh"}, Type: "github", Credentials: map[string]string{"GITHUB_TOKEN": secret},
	}}); err != nil {
		t.Fatalf("CreateProvider: %v", err)
	}
	pol := egressPolicy(map[string]*sandboxv1.NetworkPolicyRule{
		"github": {Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "api.github.com", Port: 443, AllowedIps: []string{lo},
			Protocol: "rest", Tls: "terminate", Enforcement: "enforce", Access: "full"}},
			Binaries: []*sandboxv1.NetworkBinary{{Path: curl}}},
		"other": {Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "other.test", Port: otherPortN, AllowedIps: []string{"127.0.0.1"}}},
			Binaries: []*sandboxv1.NetworkBinary{{Path: curl}}},
	})
	id := createEgressSandbox(ctx, t, c, "cred", &openshellv1.SandboxSpec{Command: []string{"sleep", "infinity"}, Policy: pol, Providers: []string{"gh"}})
	waitEgressLoaded(ctx, t, c, "cred", "")
	sh := func(script string) string {
		t.Helper()
		out, errOut, _, err := Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: []string{"sh", "-c", script}})
		if err != nil {
			t.Fatalf("exec %q: %v (stderr %q)", script, err, errOut)
		}
		return strings.TrimSpace(out)
	}
	env := sh("env")
	if !strings.Contains(env, "GITHUB_TOKEN=openshell:resolve:env:GITHUB_TOKEN\n") || strings.Contains(env, secret) {
		t.Fatalf("sandbox env lacks the placeholder or shows the value:\n%s", env)
	}
	// github sends the placeholder as a process holds it: after an
	// expiry or a detach new processes no longer get the variable, while a
	// running one still has its placeholder.
	github := func() string {
		return sh(curl + ` -s -w ' %{http_code}' -H "Authorization: Bearer openshell:resolve:env:GITHUB_TOKEN" https://api.github.com/user`)
	}
	drain := func() {
		for {
			select {
			case <-gh:
			default:
				return
			}
		}
	}
	// poll runs github until check accepts its output and what the
	// upstream saw ("" when nothing reached it).
	poll := func(what string, check func(out, saw string) bool) {
		t.Helper()
		var out, saw string
		for deadline := time.Now().Add(75 * time.Second); time.Now().Before(deadline); time.Sleep(time.Second) {
			drain()
			out, saw = github(), ""
			select {
			case saw = <-gh:
			default:
			}
			if check(out, saw) {
				return
			}
		}
		t.Fatalf("%s: last curl %q, upstream saw %q", what, out, saw)
	}

	if out := sh(curl + ` -s -w ' %{http_code}' -H "Authorization: Bearer $GITHUB_TOKEN" https://api.github.com/user`); out != "upstream ok 200" {
		t.Fatalf("curl with the placeholder = %q, want the upstream's 200", out)
	}
	if saw := <-gh; saw != "api.github.com Bearer "+secret {
		t.Errorf("upstream saw %q, want the real token", saw)
	}

	out := sh(curl + ` -s -w ' %{http_code}' -H "Authorization: Bearer $GITHUB_TOKEN" http://other.test:` + otherPort + `/x`)
	if !strings.HasSuffix(out, " 403") || !strings.Contains(out, `"error":"credential_endpoint_mismatch"`) {
		t.Errorf("placeholder to another host = %q, want 403 credential_endpoint_mismatch", out)
	}
	select {
	case got := <-otherSeen:
		t.Errorf("the other host received %q", got)
	default:
	}
	waitEgressEvents(ctx, t, c, id, map[string]func(map[string]string) bool{
		"credential mismatch": func(f map[string]string) bool {
			return f["decision"] == "deny" && f["host"] == "other.test" && strings.Contains(f["reason"], "credential_endpoint_mismatch")
		},
	})
	logs, err := c.GetSandboxLogs(ctx, &openshellv1.GetSandboxLogsRequest{SandboxId: id})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range logs.GetLogs() {
		if s := fmt.Sprint(l.GetMessage(), l.GetFields()); strings.Contains(s, secret) || strings.Contains(s, "openshell:resolve:env") {
			t.Errorf("a sandbox log line carries the value or a placeholder: %s", s)
		}
	}
	// The mismatch is also a Detection Finding in the security event sink.
	finding := waitSandboxEvent(t, events, func(r securityevent.Record) bool {
		return r.FindingInfo != nil && r.FindingInfo.UID == securityevent.FindingCredentialMismatch &&
			r.DstEndpoint != nil && r.DstEndpoint.Hostname == "other.test" && r.Unmapped["sandbox_id"] == id
	})
	if finding.ClassName != "Detection Finding" || finding.Action != "Denied" {
		t.Errorf("credential mismatch finding = %+v", finding)
	}
	if data, err := os.ReadFile(events); err != nil || bytes.Contains(data, []byte(secret)) || bytes.Contains(data, []byte("openshell:resolve:")) {
		t.Errorf("the event sink (err %v) carries the value or a placeholder", err)
	}

	if _, err := c.UpdateProvider(ctx, &openshellv1.UpdateProviderRequest{Provider: &datamodelv1.Provider{
		Metadata: &datamodelv1.ObjectMeta{Name: "gh"}, Credentials: map[string]string{"GITHUB_TOKEN": rotated}}}); err != nil {
		t.Fatalf("UpdateProvider: %v", err)
	}
	poll("after the update", func(out, saw string) bool { return out == "upstream ok 200" && saw == "api.github.com Bearer "+rotated })

	if _, err := c.UpdateProvider(ctx, &openshellv1.UpdateProviderRequest{Provider: &datamodelv1.Provider{Metadata: &datamodelv1.ObjectMeta{Name: "gh"}},
		CredentialExpiresAtMs: map[string]int64{"GITHUB_TOKEN": time.Now().Add(3 * time.Second).UnixMilli()}}); err != nil {
		t.Fatalf("UpdateProvider (expiry): %v", err)
	}
	refused := func(out, saw string) bool {
		return strings.HasSuffix(out, " 500") && strings.Contains(out, "credential_injection_failed") && saw == ""
	}
	poll("after expiry", refused)

	if _, err := c.UpdateProvider(ctx, &openshellv1.UpdateProviderRequest{Provider: &datamodelv1.Provider{Metadata: &datamodelv1.ObjectMeta{Name: "gh"}},
		CredentialExpiresAtMs: map[string]int64{"GITHUB_TOKEN": 0}}); err != nil {
		t.Fatalf("UpdateProvider (expiry removed): %v", err)
	}
	poll("after the expiry was removed", func(out, saw string) bool { return out == "upstream ok 200" && saw == "api.github.com Bearer "+rotated })

	if _, err := c.DetachSandboxProvider(ctx, &openshellv1.DetachSandboxProviderRequest{SandboxName: "cred", ProviderName: "gh"}); err != nil {
		t.Fatalf("DetachSandboxProvider: %v", err)
	}
	poll("after the detach", refused)
}

// TestProvidersV2ProfileRules: with providers_v2_enabled, a custom
// provider profile (imported through the real gateway) contributes its
// endpoint and binary to the policy of a sandbox whose own policy allows
// nothing; curl, a binary of the profile, reaches the profile's
// (loopback) endpoint with the credential placeholder resolved on plain
// HTTP. With the setting off again the supervisor reloads the sandbox's
// own policy and the request is denied.
func TestProvidersV2ProfileRules(t *testing.T) {
	curl := requireCurl(t)
	seen := make(chan string, 16)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Get("Authorization")
		fmt.Fprint(w, "svc ok")
	}))
	t.Cleanup(up.Close)
	port, portN := upstreamPort(up)
	g := Start(t, Options{Env: []string{"OPENSHELL_EGRESS_TEST_HOSTS=svc.test=127.0.0.1"}})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	setV2 := func(on bool) {
		t.Helper()
		if _, err := c.UpdateConfig(ctx, &openshellv1.UpdateConfigRequest{Global: true, SettingKey: "providers_v2_enabled",
			SettingValue: &sandboxv1.SettingValue{Value: &sandboxv1.SettingValue_BoolValue{BoolValue: on}}}); err != nil {
			t.Fatalf("UpdateConfig(providers_v2_enabled=%v): %v", on, err)
		}
	}
	setV2(true)
	r, err := c.ImportProviderProfiles(ctx, &openshellv1.ImportProviderProfilesRequest{Workspace: "default", Profiles: []*openshellv1.ProviderProfileImportItem{{
		Profile: &openshellv1.ProviderProfile{Id: "svc",
			Credentials: []*openshellv1.ProviderProfileCredential{{Name: "token", EnvVars: []string{"SVC_TOKEN"}}},
			Endpoints:   []*sandboxv1.NetworkEndpoint{{Host: "svc.test", Port: portN, AllowedIps: []string{"127.0.0.1"}, Protocol: "rest", Access: "full", Enforcement: "enforce"}},
			Binaries:    []*sandboxv1.NetworkBinary{{Path: curl}},
		}}}})
	if err != nil || !r.GetImported() {
		t.Fatalf("ImportProviderProfiles = %v, %v", r, err)
	}
	const secret = "svc-e2e-secret-1234"
	if _, err := c.CreateProvider(ctx, &openshellv1.CreateProviderRequest{Provider: &datamodelv1.Provider{
		Metadata: &datamodelv1.ObjectMeta{Name: "svc1"}, Type: "svc", Credentials: map[string]string{"SVC_TOKEN": secret}}}); err != nil {
		t.Fatalf("CreateProvider: %v", err)
	}
	id := createEgressSandbox(ctx, t, c, "v2", &openshellv1.SandboxSpec{Command: []string{"sleep", "infinity"}, Policy: egressPolicy(nil), Providers: []string{"svc1"}})
	waitEgressLoaded(ctx, t, c, "v2", "the composed provider rule is enforced")
	get := func() string {
		out, errOut, _, err := Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: []string{"sh", "-c",
			curl + ` -s -w ' %{http_code}' -H "Authorization: Bearer $SVC_TOKEN" http://svc.test:` + port + `/v1/models`}})
		if err != nil {
			t.Fatalf("exec: %v (%s)", err, errOut)
		}
		return strings.TrimSpace(out)
	}
	if out := get(); out != "svc ok 200" {
		t.Fatalf("curl through the composed rule = %q, want the upstream's 200", out)
	}
	if got := <-seen; got != "Bearer "+secret {
		t.Errorf("upstream saw Authorization %q, want the real value", got)
	}

	setV2(false)
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(time.Second) {
		out := get()
		if strings.HasSuffix(out, " 403") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("with providers_v2_enabled off the request still gets %q", out)
		}
		<-seen
	}
}
