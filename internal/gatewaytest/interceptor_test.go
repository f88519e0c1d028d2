package gatewaytest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	gipb "github.com/openshell-go/openshell/api/openshell/gateway_interceptor/v1"
	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

var fakeIC = builtOnce{prefix: "fakeic-", pkg: "./internal/interceptor/testdata/fakeinterceptor", name: "fakeinterceptor"}

// fakeInterceptor builds internal/interceptor/testdata/fakeinterceptor once.
func fakeInterceptor(t *testing.T) string {
	t.Helper()
	return fakeIC.get(t)
}

// runInterceptor starts the fake with a manifest and behavior; it returns
// its http:// endpoint and its record file.
func runInterceptor(t *testing.T, manifest *gipb.InterceptorManifest, behavior, patches string, extra ...string) (string, string) {
	t.Helper()
	m, err := protojson.Marshal(manifest)
	if err != nil {
		t.Fatal(err)
	}
	rec := filepath.Join(TempDir(t), "record.jsonl")
	cmd := exec.Command(fakeInterceptor(t), append([]string{"-manifest", string(m), "-behavior", behavior, "-patches", patches, "-record", rec}, extra...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("fakeinterceptor did not start: %v", err)
	}
	return "http://" + strings.TrimSpace(strings.TrimPrefix(line, "listening ")), rec
}

func interceptorConfig(t *testing.T, name, endpoint string) string {
	t.Helper()
	return writeConfig(t, fmt.Sprintf("[[openshell.gateway.interceptors]]\nname = %q\ngrpc_endpoint = %q\nallow_insecure_transport = true\ntimeout = \"5s\"\n", name, endpoint))
}

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(TempDir(t), "gateway.toml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func recorded(t *testing.T, rec string) []*gipb.InterceptorEvaluation {
	t.Helper()
	b, err := os.ReadFile(rec)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var evs []*gipb.InterceptorEvaluation
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if l == "" {
			continue
		}
		var line struct {
			JSON json.RawMessage `json:"json"`
		}
		if err := json.Unmarshal([]byte(l), &line); err != nil {
			t.Fatal(err)
		}
		ev := &gipb.InterceptorEvaluation{}
		if err := protojson.Unmarshal(line.JSON, ev); err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
	}
	return evs
}

const createProviderRPC = "openshell.v1.OpenShell/CreateProvider"

func binding(id string, policy string, phases ...gipb.GatewayInterceptorPhase) *gipb.InterceptorBinding {
	return &gipb.InterceptorBinding{Id: id, Selector: &gipb.InterceptorSelector{Rpc: createProviderRPC}, Phases: phases, FailurePolicy: policy}
}

func newProvider(name string) *openshellv1.CreateProviderRequest {
	return &openshellv1.CreateProviderRequest{Provider: &datamodelv1.Provider{
		Metadata: &datamodelv1.ObjectMeta{Name: name, Labels: map[string]string{"team": "infra"}},
		Type:     "github", Credentials: map[string]string{"GITHUB_TOKEN": "ghp_interceptor-e2e-secret"},
	}}
}

// TestGatewayInterceptorModifies: the real gateway, configured with an
// interceptor that renames a label, stores the renamed label; the
// interceptor sees the authenticated caller and never the credential; a
// post_commit binding observes the stored provider.
func TestGatewayInterceptorModifies(t *testing.T) {
	ep, rec := runInterceptor(t, &gipb.InterceptorManifest{Name: "labels", Bindings: []*gipb.InterceptorBinding{
		binding("rename", "", gipb.GatewayInterceptorPhase_GATEWAY_INTERCEPTOR_PHASE_MODIFY_OPERATION),
		binding("observe", "fail_open", gipb.GatewayInterceptorPhase_GATEWAY_INTERCEPTOR_PHASE_POST_COMMIT),
	}}, "allow", `[{"op":"move","from":"/provider/metadata/labels/team","path":"/provider/metadata/labels/owner"}]`)
	g := Start(t, Options{ExtraArgs: []string{"--config", interceptorConfig(t, "labels", ep)}})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if _, err := c.CreateProvider(ctx, newProvider("gh")); err != nil {
		t.Fatalf("CreateProvider: %v", err)
	}
	got, err := c.GetProvider(ctx, &openshellv1.GetProviderRequest{Name: "gh"})
	if err != nil {
		t.Fatalf("GetProvider: %v", err)
	}
	if l := got.GetProvider().GetMetadata().GetLabels(); l["owner"] != "infra" || l["team"] != "" {
		t.Errorf("stored labels = %v, want owner=infra only", l)
	}
	evs := recorded(t, rec)
	if len(evs) != 2 || evs[0].GetModifyOperation() == nil || evs[1].GetPostCommit() == nil {
		t.Fatalf("interceptor got %d evaluations %v, want modify_operation then post_commit", len(evs), evs)
	}
	if evs[0].GetPrincipal()["kind"] != "user" || evs[0].GetPrincipal()["subject"] == "" {
		t.Errorf("principal = %v, want the authenticated user", evs[0].GetPrincipal())
	}
	b, _ := os.ReadFile(rec)
	if strings.Contains(string(b), "ghp_interceptor-e2e-secret") || strings.Contains(string(b), "GITHUB_TOKEN") {
		t.Error("the credential reached the interceptor")
	}
	if !strings.Contains(g.Logs(), "gateway interceptors initialized") {
		t.Error("gateway log lacks the interceptor start-up line")
	}
	if !strings.Contains(g.Logs(), "interceptor uses a plaintext endpoint") {
		t.Error("gateway log lacks the allow_insecure_transport warning")
	}
}

// TestGatewayInterceptorVetoes: a validate veto answers FailedPrecondition
// with the interceptor's reason and nothing is stored.
func TestGatewayInterceptorVetoes(t *testing.T) {
	ep, _ := runInterceptor(t, &gipb.InterceptorManifest{Name: "veto", Bindings: []*gipb.InterceptorBinding{
		binding("veto", "", gipb.GatewayInterceptorPhase_GATEWAY_INTERCEPTOR_PHASE_VALIDATE),
	}}, "deny", "[]")
	g := Start(t, Options{ExtraArgs: []string{"--config", interceptorConfig(t, "veto", ep)}})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	_, err := c.CreateProvider(ctx, newProvider("gh"))
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "vetoed by policy") {
		t.Fatalf("CreateProvider = %v, want FailedPrecondition with the veto reason", err)
	}
	if _, err := c.GetProvider(ctx, &openshellv1.GetProviderRequest{Name: "gh"}); status.Code(err) != codes.NotFound {
		t.Errorf("GetProvider after a veto = %v, want NotFound", err)
	}
}

// TestGatewayRefusesInvalidInterceptor: a manifest binding a read RPC
// stops the gateway at start-up with a message naming the interceptor.
func TestGatewayRefusesInvalidInterceptor(t *testing.T) {
	ep, _ := runInterceptor(t, &gipb.InterceptorManifest{Name: "bad", Bindings: []*gipb.InterceptorBinding{
		{Id: "read", Selector: &gipb.InterceptorSelector{Rpc: "openshell.v1.OpenShell/GetProvider"}, Phases: []gipb.GatewayInterceptorPhase{gipb.GatewayInterceptorPhase_GATEWAY_INTERCEPTOR_PHASE_VALIDATE}},
	}}, "allow", "[]")
	dir := TempDir(t)
	cmd := exec.Command(filepath.Join(BinDir(t), "openshell-gateway"), "--disable-tls", "--port", strconv.Itoa(freePort(t)), "--bind-address", "127.0.0.1",
		"--db-url", "sqlite:"+filepath.Join(dir, "openshell.db"), "--state-dir", dir, "--config", interceptorConfig(t, "bad", ep))
	cmd.Env = append(os.Environ(), "XDG_CONFIG_HOME="+filepath.Join(dir, "config"))
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if err == nil || !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("gateway = %v, want exit status 1\n%s", err, out)
	}
	want := `interceptor "bad": binding "read": rpc "openshell.v1.OpenShell/GetProvider" is not interceptable`
	if !strings.Contains(string(out), want) {
		t.Errorf("gateway output lacks %q:\n%s", want, out)
	}
}

// TestGatewayInterceptorExtensionToken: the real gateway sends a unix://
// interceptor a gateway-minted extension token (caller_kind gateway) that
// a verifier knowing only the gateway's URL checks through
// /.well-known/openid-configuration (issuer = the token's iss) and its
// jwks_uri, with typ openshell-ext+jwt, the
// exact configured audience and a future exp; the gateway refuses that
// token as a credential, before any interceptor runs; the token is never
// logged.
func TestGatewayInterceptorExtensionToken(t *testing.T) {
	sock := filepath.Join(TempDir(t), "ic.sock")
	_, rec := runInterceptor(t, &gipb.InterceptorManifest{Name: "guard", Bindings: []*gipb.InterceptorBinding{
		binding("v", "", gipb.GatewayInterceptorPhase_GATEWAY_INTERCEPTOR_PHASE_VALIDATE),
	}}, "allow", "[]", "-unix", sock)
	cfg := writeConfig(t, fmt.Sprintf("[[openshell.gateway.interceptors]]\nname = \"guard\"\ngrpc_endpoint = %q\naudience = \"urn:example:e2e-guard\"\ntimeout = \"5s\"\n", "unix://"+sock))
	g := Start(t, Options{ExtraArgs: []string{"--config", cfg}})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if _, err := c.CreateProvider(ctx, newProvider("gh")); err != nil {
		t.Fatalf("CreateProvider: %v", err)
	}
	b, err := os.ReadFile(rec)
	if err != nil {
		t.Fatal(err)
	}
	var line struct {
		Authorization []string `json:"authorization"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(string(b))), &line); err != nil {
		t.Fatalf("record %q: %v", b, err)
	}
	if len(line.Authorization) != 1 || !strings.HasPrefix(line.Authorization[0], "Bearer ") {
		t.Fatalf("interceptor got authorization %q, want one Bearer token", line.Authorization)
	}
	tok := strings.TrimPrefix(line.Authorization[0], "Bearer ")

	// A verifier that knows only the gateway's URL: discovery, then
	// jwks_uri, then the token.
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: g.clientTLS()}}
	var disc struct {
		Issuer  string   `json:"issuer"`
		JWKSURI string   `json:"jwks_uri"`
		Algs    []string `json:"id_token_signing_alg_values_supported"`
	}
	getJSON(t, hc, "https://"+g.Addr+"/.well-known/openid-configuration", &disc)
	if disc.JWKSURI != "https://"+g.Addr+"/.well-known/jwks.json" || len(disc.Algs) != 1 || disc.Algs[0] != "EdDSA" {
		t.Fatalf("discovery = %+v, want jwks_uri https://%s/.well-known/jwks.json and algs [EdDSA]", disc, g.Addr)
	}
	var set jose.JSONWebKeySet
	getJSON(t, hc, disc.JWKSURI, &set)
	parsed, err := jwt.ParseSigned(tok, []jose.SignatureAlgorithm{jose.EdDSA})
	if err != nil {
		t.Fatal(err)
	}
	h := parsed.Headers[0]
	if h.ExtraHeaders[jose.HeaderType] != "openshell-ext+jwt" {
		t.Errorf("typ = %v, want openshell-ext+jwt", h.ExtraHeaders[jose.HeaderType])
	}
	keys := set.Key(h.KeyID)
	if len(keys) != 1 {
		t.Fatalf("JWKS has %d keys for kid %q", len(keys), h.KeyID)
	}
	var claims struct {
		Iss        string `json:"iss"`
		Aud        any    `json:"aud"`
		Exp        int64  `json:"exp"`
		CallerKind string `json:"caller_kind"`
	}
	if err := parsed.Claims(keys[0].Key, &claims); err != nil {
		t.Fatalf("signature does not verify against the gateway JWKS: %v", err)
	}
	if claims.Iss != disc.Issuer || claims.CallerKind != "gateway" {
		t.Errorf("iss = %q, caller_kind = %q, want the discovered issuer %q and gateway", claims.Iss, claims.CallerKind, disc.Issuer)
	}
	if claims.Aud != "urn:example:e2e-guard" {
		t.Errorf("aud = %#v, want exactly urn:example:e2e-guard", claims.Aud)
	}
	if exp := time.Unix(claims.Exp, 0); !exp.After(time.Now()) || exp.After(time.Now().Add(time.Hour)) {
		t.Errorf("exp = %v, want within the next hour", exp)
	}

	// Presented to the gateway (over the mTLS connection it requires), the
	// extension token is refused. Interceptors run after authentication:
	// the refused CreateProvider, a bound RPC, never reaches the interceptor.
	_, err = c.CreateProvider(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok), newProvider("gh2"))
	if status.Code(err) != codes.Unauthenticated || status.Convert(err).Message() != "extension tokens cannot authenticate to the gateway" {
		t.Errorf("CreateProvider with the extension token = %v, want Unauthenticated \"extension tokens cannot authenticate to the gateway\"", err)
	}
	if n := len(recorded(t, rec)); n != 1 {
		t.Errorf("the interceptor saw %d evaluations, want 1: an unauthenticated call reached it", n)
	}
	if strings.Contains(g.Logs(), strings.Split(tok, ".")[2]) {
		t.Error("the extension token appears in the gateway log")
	}
}

// getJSON GETs url with c and decodes the 200 JSON answer into v.
func getJSON(t *testing.T, c *http.Client, url string, v any) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET %s = %d %s, want 200 application/json", url, resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}

// TestGatewayInterceptorSeesSupervisorCaller: the principal map of an
// Evaluate tells who called the intercepted RPC, with OpenShell's keys. A
// real supervisor, authenticated with its gateway-minted sandbox JWT,
// submits a denial through SubmitPolicyAnalysis (interceptable): the
// interceptor sees kind sandbox, the sandbox's id and source
// bootstrap_jwt. The user's CreateSandbox (mTLS client certificate) is
// seen as kind user with provider mtls. The token the interceptor gets is
// the gateway's own (caller_kind gateway) in both cases, as in OpenShell.
func TestGatewayInterceptorSeesSupervisorCaller(t *testing.T) {
	curl, port, _ := egressUpstream(t)
	validate := gipb.GatewayInterceptorPhase_GATEWAY_INTERCEPTOR_PHASE_VALIDATE
	sock := filepath.Join(TempDir(t), "ic.sock")
	_, rec := runInterceptor(t, &gipb.InterceptorManifest{Name: "who", Bindings: []*gipb.InterceptorBinding{
		{Id: "create", Selector: &gipb.InterceptorSelector{Rpc: "openshell.v1.OpenShell/CreateSandbox"}, Phases: []gipb.GatewayInterceptorPhase{validate}},
		{Id: "analysis", Selector: &gipb.InterceptorSelector{Rpc: "openshell.v1.OpenShell/SubmitPolicyAnalysis"}, Phases: []gipb.GatewayInterceptorPhase{validate}},
	}}, "allow", "[]", "-unix", sock)
	g := Start(t, Options{
		ExtraArgs: []string{"--config", writeConfig(t, fmt.Sprintf("[[openshell.gateway.interceptors]]\nname = \"who\"\ngrpc_endpoint = %q\ntimeout = \"5s\"\n", "unix://"+sock))},
		Env:       []string{"OPENSHELL_EGRESS_TEST_HOSTS=denied.who.test=127.0.0.1"},
	})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	pol := egressPolicy(map[string]*sandboxv1.NetworkPolicyRule{
		"unrelated": {Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "unrelated.test", Port: 443}}, Binaries: []*sandboxv1.NetworkBinary{{Path: curl}}},
	})
	id := createEgressSandbox(ctx, t, c, "who", &openshellv1.SandboxSpec{Command: []string{"sleep", "infinity"}, Policy: pol, Environment: fastAdvisor})
	waitEgressLoaded(ctx, t, c, "who", "")
	out, errOut, _, err := Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: []string{curl, "-s", "-o", "/dev/null", "-w", "%{http_code}", "http://denied.who.test:" + port + "/"}})
	if err != nil || strings.TrimSpace(out) != "403" {
		t.Fatalf("curl of a denied host = %q, %v (stderr %q), want 403", out, err, errOut)
	}

	byMethod := map[string]*gipb.InterceptorEvaluation{}
	deadline := time.Now().Add(30 * time.Second)
	for byMethod["SubmitPolicyAnalysis"] == nil && time.Now().Before(deadline) {
		for _, ev := range recorded(t, rec) {
			byMethod[ev.GetMethod()] = ev
		}
		time.Sleep(100 * time.Millisecond)
	}
	sub := byMethod["SubmitPolicyAnalysis"]
	if sub == nil {
		t.Fatalf("the interceptor saw no SubmitPolicyAnalysis within 30s (saw %v)", byMethod)
	}
	if diff := cmp.Diff(map[string]string{"kind": "sandbox", "sandbox_id": id, "source": "bootstrap_jwt"}, sub.GetPrincipal()); diff != "" {
		t.Errorf("SubmitPolicyAnalysis principal (-want +got):\n%s", diff)
	}
	if got := sub.GetValidate().GetProposedOperation().GetFields()["name"].GetStringValue(); got != "who" && got != id {
		t.Errorf("SubmitPolicyAnalysis operation names sandbox %q, want who", got)
	}
	create := byMethod["CreateSandbox"].GetPrincipal()
	if create["kind"] != "user" || create["provider"] != "mtls" || create["subject"] == "" || create["sandbox_id"] != "" {
		t.Errorf("CreateSandbox principal = %v, want kind user, provider mtls, a subject, no sandbox_id", create)
	}
	for _, tok := range recordedTokens(t, rec) {
		parsed, err := jwt.ParseSigned(tok, []jose.SignatureAlgorithm{jose.EdDSA})
		if err != nil {
			t.Fatal(err)
		}
		var claims map[string]any
		if err := parsed.UnsafeClaimsWithoutVerification(&claims); err != nil {
			t.Fatal(err)
		}
		if claims["caller_kind"] != "gateway" || claims["sandbox_id"] != nil {
			t.Errorf("interceptor token claims %v, want caller_kind gateway and no sandbox_id", claims)
		}
	}
}

// recordedTokens returns the bearer token of each Evaluate the fake
// interceptor recorded, failing the test on a call without exactly one.
func recordedTokens(t *testing.T, rec string) []string {
	t.Helper()
	b, err := os.ReadFile(rec)
	if err != nil {
		t.Fatal(err)
	}
	var toks []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var line struct {
			Authorization []string `json:"authorization"`
		}
		if err := json.Unmarshal([]byte(l), &line); err != nil {
			t.Fatal(err)
		}
		if len(line.Authorization) != 1 || !strings.HasPrefix(line.Authorization[0], "Bearer ") {
			t.Fatalf("an Evaluate carried authorization %q, want one bearer token", line.Authorization)
		}
		toks = append(toks, strings.TrimPrefix(line.Authorization[0], "Bearer "))
	}
	return toks
}
