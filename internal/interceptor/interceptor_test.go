package interceptor

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/testing/protocmp"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

const secretValue = "sk-very-secret-value-0123456789"

func providerReq() *openshellv1.CreateProviderRequest {
	return &openshellv1.CreateProviderRequest{Provider: &datamodelv1.Provider{
		Metadata:    &datamodelv1.ObjectMeta{Name: "anthropic", Labels: map[string]string{"team": "infra"}},
		Type:        "anthropic",
		Credentials: map[string]string{"ANTHROPIC_API_KEY": secretValue},
	}}
}

// noSecret fails when the secret reached the interceptor in any form.
func noSecret(t *testing.T, f *fake) {
	t.Helper()
	evs, raws := f.evaluations(t)
	for i, raw := range raws {
		if bytes.Contains(raw, []byte(secretValue)) || bytes.Contains(raw, []byte("ANTHROPIC_API_KEY")) {
			t.Errorf("evaluation %d carried the secret credential on the wire", i)
		}
		js, _ := protojson.Marshal(evs[i])
		if strings.Contains(string(js), "credentials") {
			t.Errorf("evaluation %d names the credentials field: %s", i, js)
		}
	}
}

// TestModifyRenamesLabel: a modify_operation binding renames a label; the
// handler gets the renamed label and the untouched credential; a later
// validate binding of another interceptor sees the modified operation;
// neither interceptor ever sees the credential.
func TestModifyRenamesLabel(t *testing.T) {
	mod := startFake(t, manifest("", bind("rename-team", rpcCreateProvider, "", ModifyOperation)), "allow",
		`[{"op":"move","from":"/provider/metadata/labels/team","path":"/provider/metadata/labels/owner"}]`)
	val := startFake(t, manifest("", bind("check", rpcCreateProvider, "", Validate)), "allow", "")
	c1, c2 := config("rename", mod), config("audit", val)
	c1.Order, c2.Order = 1, 2
	rt := start(t, c2, c1)
	client, _, api := serve(t, rt)

	resp, err := client.CreateProvider(t.Context(), providerReq())
	if err != nil {
		t.Fatalf("CreateProvider: %v", err)
	}
	want := providerReq()
	want.Provider.Metadata.Labels = map[string]string{"owner": "infra"}
	got := api.received()
	if len(got) != 1 {
		t.Fatalf("handler called %d times, want 1", len(got))
	}
	if diff := cmp.Diff(want, got[0], protocmp.Transform()); diff != "" {
		t.Errorf("handler request (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want.Provider, resp.GetProvider(), protocmp.Transform()); diff != "" {
		t.Errorf("response (-want +got):\n%s", diff)
	}

	mevs, _ := mod.evaluations(t)
	if len(mevs) != 1 || mevs[0].GetModifyOperation() == nil {
		t.Fatalf("modify interceptor got %v, want one modify_operation evaluation", mevs)
	}
	ev := mevs[0]
	if ev.GetInterceptorName() != "rename" || ev.GetBindingId() != "rename-team" || ev.GetService() != "openshell.v1.OpenShell" || ev.GetMethod() != "CreateProvider" {
		t.Errorf("evaluation header = %q %q %q %q", ev.GetInterceptorName(), ev.GetBindingId(), ev.GetService(), ev.GetMethod())
	}
	if diff := cmp.Diff(map[string]string{"kind": "user", "subject": "alice", "roles": "openshell-user"}, ev.GetPrincipal()); diff != "" {
		t.Errorf("principal (-want +got):\n%s", diff)
	}
	labels := ev.GetModifyOperation().GetProposedOperation().GetFields()["provider"].GetStructValue().GetFields()["metadata"].GetStructValue().GetFields()["labels"].GetStructValue().GetFields()
	if labels["team"].GetStringValue() != "infra" {
		t.Errorf("modify saw labels %v, want team=infra", labels)
	}
	vevs, _ := val.evaluations(t)
	if len(vevs) != 1 || vevs[0].GetValidate() == nil {
		t.Fatalf("validate interceptor got %v, want one validate evaluation", vevs)
	}
	vlabels := vevs[0].GetValidate().GetProposedOperation().GetFields()["provider"].GetStructValue().GetFields()["metadata"].GetStructValue().GetFields()["labels"].GetStructValue().GetFields()
	if _, ok := vlabels["owner"]; !ok || len(vlabels) != 1 {
		t.Errorf("validate saw labels %v, want only owner (the modified operation)", vlabels)
	}
	if vevs[0].GetValidate().CurrentState != nil {
		t.Errorf("validate current_state = %v, want absent", vevs[0].GetValidate().CurrentState)
	}
	noSecret(t, mod)
	noSecret(t, val)
}

// TestValidateVeto: a validate binding refuses a create with its code and
// reason; the handler never runs.
func TestValidateVeto(t *testing.T) {
	f := startFake(t, manifest("", bind("veto", rpcCreateProvider, "", Validate)), "deny", "")
	client, _, api := serve(t, start(t, config("policy", f)))
	_, err := client.CreateProvider(t.Context(), providerReq())
	if status.Code(err) != codes.FailedPrecondition || status.Convert(err).Message() != "providers of this type are vetoed by policy" {
		t.Fatalf("CreateProvider = %v, want FailedPrecondition with the interceptor's reason", err)
	}
	if n := len(api.received()); n != 0 {
		t.Errorf("handler ran %d times after a veto", n)
	}
	noSecret(t, f)
}

// TestDenyWithoutCode: a denial without status_code is PermissionDenied;
// in modify_operation it stops the call too.
func TestDenyWithoutCode(t *testing.T) {
	f := startFake(t, manifest("", bind("no", rpcCreateProvider, "", ModifyOperation)), "deny-plain", "")
	client, _, api := serve(t, start(t, config("policy", f)))
	_, err := client.CreateProvider(t.Context(), providerReq())
	if status.Code(err) != codes.PermissionDenied || status.Convert(err).Message() != "not today" {
		t.Fatalf("CreateProvider = %v, want PermissionDenied \"not today\"", err)
	}
	if n := len(api.received()); n != 0 {
		t.Errorf("handler ran %d times after a denial", n)
	}
}

// TestPostCommitObserves: post_commit sees the committed response without
// secrets; a failing observer does not change the response (headers and
// trailers included), is counted as an observation failure and gets the
// standard fail-open warning and counter.
func TestPostCommitObserves(t *testing.T) {
	for _, tc := range []struct {
		behavior     string
		wantFailures float64
	}{{"allow", 0}, {"deny-post", 1}, {"crash", 1}} {
		t.Run(tc.behavior, func(t *testing.T) {
			f := startFake(t, manifest("", bind("observe", rpcCreateProvider, "fail_open", PostCommit)), tc.behavior, "")
			reg := prometheus.NewRegistry()
			var logs lockedBuffer
			rt, err := Start(t.Context(), Options{Configs: []Config{config("observer", f)}, Logger: slog.New(slog.NewTextHandler(&logs, nil)), Metrics: reg})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(rt.Close)
			client, _, api := serve(t, rt)
			var header, trailer metadata.MD
			resp, err := client.CreateProvider(t.Context(), providerReq(), grpc.Header(&header), grpc.Trailer(&trailer))
			if err != nil {
				t.Fatalf("CreateProvider: %v", err)
			}
			if len(header.Get("x-handler-header")) != 1 || len(trailer.Get("x-handler-trailer")) != 1 {
				t.Errorf("handler's header %v / trailer %v did not reach the caller", header, trailer)
			}
			if resp.GetProvider().GetCredentials()["ANTHROPIC_API_KEY"] != secretValue || len(api.received()) != 1 {
				t.Errorf("committed response changed or handler not run: %v", resp)
			}
			evs, _ := f.evaluations(t)
			if len(evs) != 1 || evs[0].GetPostCommit() == nil {
				t.Fatalf("observer got %v, want one post_commit evaluation", evs)
			}
			name := evs[0].GetPostCommit().GetCommittedResponse().GetFields()["provider"].GetStructValue().GetFields()["metadata"].GetStructValue().GetFields()["name"].GetStringValue()
			if name != "anthropic" {
				t.Errorf("committed_response provider name = %q, want anthropic", name)
			}
			noSecret(t, f)
			got := testutil.ToFloat64(rt.metrics.postCommitFailures.WithLabelValues("observer", "observe"))
			if got != tc.wantFailures {
				t.Errorf("openshell_gateway_interceptor_post_commit_observation_failures_total = %v, want %v", got, tc.wantFailures)
			}
			// A binding failure is also the standard fail-open warning and
			// counter.
			if got := testutil.ToFloat64(rt.metrics.failOpen.WithLabelValues("observer", "observe", "post_commit")); got != tc.wantFailures {
				t.Errorf("openshell_gateway_interceptor_fail_open_total = %v, want %v", got, tc.wantFailures)
			}
			out := logs.String()
			if warned := strings.Contains(out, `level=WARN msg="interceptor failed; fail_open lets the call through"`) && strings.Contains(out, "interceptor=observer binding=observe phase=post_commit"); warned != (tc.wantFailures > 0) {
				t.Errorf("fail-open warning logged = %v, want %v:\n%s", warned, tc.wantFailures > 0, out)
			}
		})
	}
}

// TestFailurePolicies: a crashing or slow interceptor lets the call through
// under fail_open and refuses it before dispatch under fail_closed.
func TestFailurePolicies(t *testing.T) {
	for _, behavior := range []string{"crash", "slow"} {
		for _, policy := range []FailurePolicy{FailOpen, FailClosed} {
			t.Run(behavior+"/"+string(policy), func(t *testing.T) {
				f := startFake(t, manifest(string(policy), bind("b", rpcCreateProvider, "", Validate)), behavior, "")
				c := config("flaky", f)
				c.Timeout = 200 * time.Millisecond
				client, _, api := serve(t, start(t, c))
				begin := time.Now()
				_, err := client.CreateProvider(t.Context(), providerReq())
				if policy == FailOpen {
					if err != nil || len(api.received()) != 1 {
						t.Fatalf("fail_open: CreateProvider = %v, handler runs %d, want success once", err, len(api.received()))
					}
				} else {
					if status.Code(err) != codes.Unavailable || len(api.received()) != 0 {
						t.Fatalf("fail_closed: CreateProvider = %v, handler runs %d, want Unavailable and no dispatch", err, len(api.received()))
					}
					if !strings.Contains(err.Error(), `interceptor "flaky" binding "b" failed`) {
						t.Errorf("fail_closed message = %q", err)
					}
				}
				if behavior == "slow" && time.Since(begin) > 3*time.Second {
					t.Errorf("slow interceptor held the call %v; timeout is 200ms", time.Since(begin))
				}
			})
		}
	}
}

// TestInvalidModification: a patch list with one bad operation is refused
// as a whole (fail_closed) or rolled back as a whole (fail_open).
func TestInvalidModification(t *testing.T) {
	cases := []struct {
		name    string
		patches string
	}{
		{"unknown field", `[{"op":"add","path":"/provider/metadata/labels/x","value":"1"},{"op":"add","path":"/provider/noSuchField","value":1}]`},
		{"wrong type", `[{"op":"add","path":"/provider/metadata/labels/x","value":"1"},{"op":"replace","path":"/provider/type","value":3}]`},
		{"secret field", `[{"op":"add","path":"/provider/metadata/labels/x","value":"1"},{"op":"replace","path":"/provider/credentials/ANTHROPIC_API_KEY","value":"leak"}]`},
		{"object holding a secret", `[{"op":"add","path":"/provider/metadata/labels/x","value":"1"},{"op":"replace","path":"/provider","value":{"type":"x"}}]`},
		{"secret as move source", `[{"op":"move","from":"/provider/credentials","path":"/provider/config"}]`},
		{"root", `[{"op":"replace","path":"","value":{}}]`},
		{"missing path", `[{"op":"add","path":"/provider/metadata/labels/x","value":"1"},{"op":"remove","path":"/provider/metadata/labels/none"}]`},
	}
	for _, tc := range cases {
		for _, policy := range []FailurePolicy{FailOpen, FailClosed} {
			t.Run(tc.name+"/"+string(policy), func(t *testing.T) {
				f := startFake(t, manifest(string(policy), bind("m", rpcCreateProvider, "", ModifyOperation)), "allow", tc.patches)
				client, _, api := serve(t, start(t, config("mod", f)))
				_, err := client.CreateProvider(t.Context(), providerReq())
				if policy == FailClosed {
					if status.Code(err) != codes.InvalidArgument || len(api.received()) != 0 {
						t.Fatalf("CreateProvider = %v, handler runs %d; want InvalidArgument before dispatch", err, len(api.received()))
					}
					return
				}
				if err != nil {
					t.Fatalf("CreateProvider: %v", err)
				}
				got := api.received()
				if len(got) != 1 {
					t.Fatalf("handler runs = %d, want 1", len(got))
				}
				if diff := cmp.Diff(providerReq(), got[0], protocmp.Transform()); diff != "" {
					t.Errorf("fail_open did not restore the pre-binding request (-want +got):\n%s", diff)
				}
			})
		}
	}
}

// TestSecretPathAllowedBeside: a patch next to a secret (a sibling field of
// an object that holds one) is allowed and the secret survives.
func TestSecretPathAllowedBeside(t *testing.T) {
	f := startFake(t, manifest("", bind("m", rpcCreateProvider, "", ModifyOperation)), "allow",
		`[{"op":"add","path":"/provider/config","value":{"region":"eu"}}]`)
	client, _, api := serve(t, start(t, config("mod", f)))
	if _, err := client.CreateProvider(t.Context(), providerReq()); err != nil {
		t.Fatal(err)
	}
	want := providerReq()
	want.Provider.Config = map[string]string{"region": "eu"}
	if diff := cmp.Diff(want, api.received()[0], protocmp.Transform()); diff != "" {
		t.Errorf("handler request (-want +got):\n%s", diff)
	}
	noSecret(t, f)
}

// TestUnboundMethodsPass: a method without bindings never reaches the
// interceptor.
func TestUnboundMethodsPass(t *testing.T) {
	f := startFake(t, manifest("", bind("b", rpcCreateProvider, "", Validate)), "deny", "")
	client, _, api := serve(t, start(t, config("p", f)))
	if _, err := client.UpdateConfig(context.Background(), &openshellv1.UpdateConfigRequest{Name: "s"}); err != nil {
		t.Fatal(err)
	}
	if evs, _ := f.evaluations(t); len(evs) != 0 || len(api.received()) != 1 {
		t.Errorf("interceptor saw %d evaluations for an unbound method", len(evs))
	}
}

// TestPatchNamingTwoOneofMembers: a candidate whose ProtoJSON names two
// members of one oneof group is invalid; fail_closed refuses the call.
func TestPatchNamingTwoOneofMembers(t *testing.T) {
	f := startFake(t, manifest("fail_closed", bind("m", rpcUpdateConfig, "", ModifyOperation)), "allow",
		`[{"op":"add","path":"/mergeOperations/0/removeEndpoint","value":{"ruleName":"x"}}]`)
	client, _, api := serve(t, start(t, config("p", f)))
	req := &openshellv1.UpdateConfigRequest{Name: "sb", MergeOperations: []*openshellv1.PolicyMergeOperation{
		{Operation: &openshellv1.PolicyMergeOperation_RemoveRule{RemoveRule: &openshellv1.RemoveNetworkRule{RuleName: "r"}}},
	}}
	_, err := client.UpdateConfig(t.Context(), req)
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "oneof") || len(api.received()) != 0 {
		t.Fatalf("UpdateConfig = %v (handler runs %d), want InvalidArgument naming the oneof before dispatch", err, len(api.received()))
	}
}

// TestPostCommitOnlyAfterSuccess: a failed handler is not observed and its
// error reaches the caller unchanged.
func TestPostCommitOnlyAfterSuccess(t *testing.T) {
	f := startFake(t, manifest("fail_open", bind("o", rpcUpdateConfig, "", PostCommit)), "allow", "")
	client, _, _ := serve(t, start(t, config("p", f)))
	if _, err := client.UpdateConfig(t.Context(), &openshellv1.UpdateConfigRequest{Name: "fail"}); status.Code(err) != codes.NotFound {
		t.Fatalf("UpdateConfig = %v, want the handler's NotFound", err)
	}
	if evs, _ := f.evaluations(t); len(evs) != 0 {
		t.Errorf("post_commit observed a failed call: %v", evs)
	}
	if _, err := client.UpdateConfig(t.Context(), &openshellv1.UpdateConfigRequest{Name: "ok"}); err != nil {
		t.Fatal(err)
	}
	evs, _ := f.evaluations(t)
	if len(evs) != 1 || evs[0].GetPostCommit().GetCommittedResponse().GetFields()["version"].GetNumberValue() != 7 {
		t.Errorf("post_commit evaluations = %v, want one with version 7", evs)
	}
}

// TestSubmitPolicyAnalysisInterceptable: an interceptor can refuse policy
// proposals sent by a supervisor while permitting telemetry-only
// submissions (denial summaries, no proposed chunks).
func TestSubmitPolicyAnalysisInterceptable(t *testing.T) {
	f := startFake(t, manifest("", bind("proposals", "openshell.v1.OpenShell/SubmitPolicyAnalysis", "", Validate)), "deny-proposals", "")
	client, _, api := serve(t, start(t, config("p", f)))
	_, err := client.SubmitPolicyAnalysis(t.Context(), &openshellv1.SubmitPolicyAnalysisRequest{Name: "sb", ProposedChunks: []*openshellv1.PolicyChunk{{RuleName: "allow-example"}}})
	if status.Code(err) != codes.FailedPrecondition || len(api.received()) != 0 {
		t.Fatalf("SubmitPolicyAnalysis with a proposal = %v (handler runs %d), want the veto", err, len(api.received()))
	}
	telemetry := &openshellv1.SubmitPolicyAnalysisRequest{Name: "sb", Summaries: []*openshellv1.DenialSummary{{Host: "example.com", Port: 443}}}
	if _, err := client.SubmitPolicyAnalysis(t.Context(), telemetry); err != nil || len(api.received()) != 1 {
		t.Fatalf("telemetry-only SubmitPolicyAnalysis = %v (handler runs %d), want it dispatched", err, len(api.received()))
	}
	if evs, _ := f.evaluations(t); len(evs) != 2 {
		t.Errorf("interceptor saw %d evaluations, want both submissions", len(evs))
	}
}

// TestUnixSocketEndpoint: a unix:// endpoint works without
// allow_insecure_transport.
func TestUnixSocketEndpoint(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "ic.sock")
	f := startFake(t, manifest("", bind("v", rpcCreateProvider, "", Validate)), "deny", "", "-unix", sock)
	if f.endpoint != "unix://"+sock {
		t.Fatalf("endpoint = %q", f.endpoint)
	}
	c := config("local", f)
	c.AllowInsecureTransport = false
	client, _, _ := serve(t, start(t, c))
	if _, err := client.CreateProvider(t.Context(), providerReq()); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("CreateProvider = %v, want the veto over the Unix socket", err)
	}
}

// TestHTTPSEndpoint: an https:// endpoint verified against
// tls_ca_cert_path works; the pinned CA keeps hostname verification (a
// name the certificate does not carry fails); without the CA the
// handshake fails at start-up.
func TestHTTPSEndpoint(t *testing.T) {
	dir := t.TempDir()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fake interceptor"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPath, keyPath := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	f := startFake(t, manifest("", bind("v", rpcCreateProvider, "", Validate)), "deny", "", "-tls-cert", certPath, "-tls-key", keyPath)
	c := config("tls", f)
	c.Endpoint, c.AllowInsecureTransport, c.TLSCACertPath = "https://"+strings.TrimPrefix(f.endpoint, "http://"), false, certPath
	client, _, _ := serve(t, start(t, c))
	if _, err := client.CreateProvider(t.Context(), providerReq()); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("CreateProvider = %v, want the veto over TLS", err)
	}
	// The pinned CA does not replace hostname verification: the
	// certificate names 127.0.0.1 only, so localhost is refused.
	byName := c
	byName.Endpoint = "https://localhost:" + f.endpoint[strings.LastIndex(f.endpoint, ":")+1:]
	if _, err := Start(t.Context(), Options{Configs: []Config{byName}}); err == nil || !strings.Contains(err.Error(), "describe") {
		t.Errorf("Start with the CA but another host name = %v, want a describe (handshake) error", err)
	}
	c.TLSCACertPath = ""
	if _, err := Start(t.Context(), Options{Configs: []Config{c}}); err == nil || !strings.Contains(err.Error(), "describe") {
		t.Errorf("Start without the CA = %v, want a describe (handshake) error", err)
	}
}
