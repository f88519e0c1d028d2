package inference_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/testing/protocmp"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	inferencev1 "github.com/openshell-go/openshell/api/openshell/inference/v1"
	"github.com/openshell-go/openshell/internal/api/apitest"
	"github.com/openshell-go/openshell/internal/api/inference"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/store"
)

func newService(e *apitest.Env, oidc bool) *inference.Service {
	return inference.New(inference.Options{Store: e.Store, Providers: e.Providers, Authz: e.Authz(oidc)})
}

func createProvider(t testing.TB, e *apitest.Env, ws, name, typ string, creds, cfg map[string]string) {
	t.Helper()
	p := &datamodelv1.Provider{Metadata: &datamodelv1.ObjectMeta{Name: name}, Type: typ, Credentials: creds, Config: cfg}
	if _, err := e.Providers.Create(t.Context(), ws, p); err != nil {
		t.Fatalf("create provider %s: %v", name, err)
	}
}

// TestAuthorization: route writes need the workspace's admin role, reads
// its user role; the bundle is served to sandbox principals only.
func TestAuthorization(t *testing.T) {
	f := apitest.NewFixture(t)
	svc := newService(f.Env, true)
	for _, ws := range []string{"team-a", "team-b"} {
		createProvider(t, f.Env, ws, "oa", "openai", map[string]string{"OPENAI_API_KEY": "sk-secret"}, nil)
	}
	calls := []apitest.Call{
		{Name: "SetInferenceRoute", Do: func(ctx context.Context) error {
			_, err := svc.SetInferenceRoute(ctx, &inferencev1.SetInferenceRouteRequest{Workspace: "team-a", ProviderName: "oa", ModelId: "m", NoVerify: true})
			return err
		}},
		{Name: "GetInferenceRoute", Do: func(ctx context.Context) error {
			_, err := svc.GetInferenceRoute(ctx, &inferencev1.GetInferenceRouteRequest{Workspace: "team-a"})
			if errdefs.Code(err) == codes.NotFound {
				return nil // authorized; the route may not exist yet
			}
			return err
		}},
		{Name: "DeleteInferenceRoute", Do: func(ctx context.Context) error {
			_, err := svc.DeleteInferenceRoute(ctx, &inferencev1.DeleteInferenceRouteRequest{Workspace: "team-a", RouteName: "sandbox-system"})
			return err
		}},
		{Name: "GetInferenceBundle", Do: func(ctx context.Context) error {
			_, err := svc.GetInferenceBundle(ctx, &inferencev1.GetInferenceBundleRequest{})
			return err
		}},
	}
	const (
		ok = codes.OK
		pd = codes.PermissionDenied
	)
	apitest.Matrix(t, calls, []apitest.Case{
		{Name: "local dev", P: apitest.LocalDev, Want: []codes.Code{ok, ok, ok, pd}},
		{Name: "platform admin", P: apitest.OIDCRoot, Want: []codes.Code{ok, ok, ok, pd}},
		{Name: "workspace admin", P: apitest.OIDCUser("aa"), Want: []codes.Code{ok, ok, ok, pd}},
		{Name: "workspace user", P: apitest.OIDCUser("ua"), Want: []codes.Code{pd, ok, pd, pd}},
		{Name: "non-member", P: apitest.OIDCUser("stranger"), Want: []codes.Code{pd, pd, pd, pd}},
		{Name: "no subject", P: apitest.NoSubject, Want: []codes.Code{pd, pd, pd, pd}},
		{Name: "sandbox", P: apitest.Sandbox(f.SandboxA), Want: []codes.Code{pd, pd, pd, ok}},
	})
}

// TestBundleIsTheCallersWorkspace: a sandbox receives the routes of its
// own workspace, resolved with the real credential, and nothing of
// another workspace.
func TestBundleIsTheCallersWorkspace(t *testing.T) {
	f := apitest.NewFixture(t)
	svc := newService(f.Env, true)
	createProvider(t, f.Env, "team-a", "oa", "openai", map[string]string{"OPENAI_API_KEY": "sk-team-a"}, map[string]string{"OPENAI_BASE_URL": "http://127.0.0.1:9/v1"})
	createProvider(t, f.Env, "team-b", "an", "anthropic", map[string]string{"ANTHROPIC_API_KEY": "ak-team-b"}, nil)
	admin := apitest.As(t.Context(), apitest.OIDCRoot)
	if _, err := svc.SetInferenceRoute(admin, &inferencev1.SetInferenceRouteRequest{Workspace: "team-a", ProviderName: "oa", ModelId: "gpt-a", TimeoutSecs: 7, NoVerify: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.SetInferenceRoute(admin, &inferencev1.SetInferenceRouteRequest{Workspace: "team-b", RouteName: "sandbox-system", ProviderName: "an", ModelId: "claude-b", NoVerify: true}); err != nil {
		t.Fatal(err)
	}
	got, err := svc.GetInferenceBundle(apitest.As(t.Context(), apitest.Sandbox(f.SandboxA)), &inferencev1.GetInferenceBundleRequest{})
	if err != nil {
		t.Fatal(err)
	}
	want := []*inferencev1.ResolvedRoute{{
		Name: "inference.local", BaseUrl: "http://127.0.0.1:9/v1", ApiKey: "sk-team-a", ModelId: "gpt-a", ProviderType: "openai", TimeoutSecs: 7,
		Protocols: []string{"openai_chat_completions", "openai_completions", "openai_responses", "openai_embeddings", "model_discovery"},
	}}
	if diff := cmp.Diff(want, got.GetRoutes(), protocmp.Transform()); diff != "" {
		t.Errorf("team-a bundle (-want +got):\n%s", diff)
	}
	gotB, err := svc.GetInferenceBundle(apitest.As(t.Context(), apitest.Sandbox(f.SandboxB)), &inferencev1.GetInferenceBundleRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(gotB.GetRoutes()) != 1 || gotB.GetRoutes()[0].GetName() != "sandbox-system" || gotB.GetRoutes()[0].GetApiKey() != "ak-team-b" {
		t.Errorf("team-b bundle = %v, want only its sandbox-system route", gotB.GetRoutes())
	}
	if got.GetRevision() == gotB.GetRevision() || got.GetRevision() == "" {
		t.Errorf("revisions %q and %q of different bundles", got.GetRevision(), gotB.GetRevision())
	}
}

// TestBundleRevisionFollowsChanges: the revision is stable while nothing
// changes and moves on a model change, a credential rotation and a
// deleted route (then the bundle is empty).
func TestBundleRevisionFollowsChanges(t *testing.T) {
	f := apitest.NewFixture(t)
	svc := newService(f.Env, true)
	createProvider(t, f.Env, "team-a", "oa", "openai", map[string]string{"OPENAI_API_KEY": "sk-1"}, nil)
	admin := apitest.As(t.Context(), apitest.OIDCRoot)
	sbx := apitest.As(t.Context(), apitest.Sandbox(f.SandboxA))
	bundle := func() *inferencev1.GetInferenceBundleResponse {
		t.Helper()
		b, err := svc.GetInferenceBundle(sbx, &inferencev1.GetInferenceBundleRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	set := func(model string) {
		t.Helper()
		if _, err := svc.SetInferenceRoute(admin, &inferencev1.SetInferenceRouteRequest{Workspace: "team-a", ProviderName: "oa", ModelId: model, NoVerify: true}); err != nil {
			t.Fatal(err)
		}
	}
	empty := bundle()
	if len(empty.GetRoutes()) != 0 {
		t.Fatalf("bundle without routes = %v", empty.GetRoutes())
	}
	set("m1")
	b1 := bundle()
	if b1.GetRevision() != bundle().GetRevision() {
		t.Error("revision changed with nothing changed")
	}
	set("m2")
	b2 := bundle()
	if b2.GetRevision() == b1.GetRevision() || b2.GetRoutes()[0].GetModelId() != "m2" {
		t.Errorf("after a model change: revision %s (was %s), model %s", b2.GetRevision(), b1.GetRevision(), b2.GetRoutes()[0].GetModelId())
	}
	if _, err := f.Providers.Update(t.Context(), "team-a", &datamodelv1.Provider{Metadata: &datamodelv1.ObjectMeta{Name: "oa"}, Credentials: map[string]string{"OPENAI_API_KEY": "sk-2"}}, nil); err != nil {
		t.Fatal(err)
	}
	b3 := bundle()
	if b3.GetRevision() == b2.GetRevision() || b3.GetRoutes()[0].GetApiKey() != "sk-2" {
		t.Errorf("after a rotation: revision %s (was %s)", b3.GetRevision(), b2.GetRevision())
	}
	if _, err := svc.DeleteInferenceRoute(admin, &inferencev1.DeleteInferenceRouteRequest{Workspace: "team-a"}); err != nil {
		t.Fatal(err)
	}
	if b := bundle(); len(b.GetRoutes()) != 0 || b.GetRevision() != empty.GetRevision() {
		t.Errorf("after delete: %v, revision %s", b.GetRoutes(), b.GetRevision())
	}
}

// TestRouteLifecycle: set creates version 1 and counts up, get reads it
// back, delete reports whether a route was removed; OpenShell's texts for
// the refusals.
func TestRouteLifecycle(t *testing.T) {
	e := apitest.NewEnv(t)
	svc := newService(e, false)
	ctx := apitest.As(t.Context(), apitest.LocalDev)
	createProvider(t, e, "default", "oa", "openai", map[string]string{"OPENAI_API_KEY": "sk-1"}, nil)
	createProvider(t, e, "default", "gh", "github", map[string]string{"GITHUB_TOKEN": "ghp-secret"}, nil)
	createProvider(t, e, "default", "vx", "google-vertex-ai", map[string]string{"GOOGLE_VERTEX_AI_TOKEN": "ya29"}, nil)

	_, err := svc.GetInferenceRoute(ctx, &inferencev1.GetInferenceRouteRequest{})
	apitest.WantErr(t, "get before set", err, codes.NotFound, "inference route 'inference.local' is not configured in workspace 'default'; run 'openshell inference set --provider <name> --model <id>'")
	for i, want := range []uint64{1, 2} {
		resp, err := svc.SetInferenceRoute(ctx, &inferencev1.SetInferenceRouteRequest{ProviderName: "oa", ModelId: "m", TimeoutSecs: uint64(i), NoVerify: true})
		if err != nil {
			t.Fatal(err)
		}
		w := &inferencev1.SetInferenceRouteResponse{ProviderName: "oa", ModelId: "m", Version: want, RouteName: "inference.local", TimeoutSecs: uint64(i), Workspace: "default"}
		if diff := cmp.Diff(w, resp, protocmp.Transform()); diff != "" {
			t.Errorf("set #%d (-want +got):\n%s", i, diff)
		}
	}
	got, err := svc.GetInferenceRoute(ctx, &inferencev1.GetInferenceRouteRequest{RouteName: "inference.local"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(&inferencev1.GetInferenceRouteResponse{ProviderName: "oa", ModelId: "m", Version: 2, RouteName: "inference.local", TimeoutSecs: 1, Workspace: "default"}, got, protocmp.Transform()); diff != "" {
		t.Errorf("get (-want +got):\n%s", diff)
	}

	for _, tc := range []struct {
		name string
		req  *inferencev1.SetInferenceRouteRequest
		code codes.Code
		msg  string
	}{
		{"no provider", &inferencev1.SetInferenceRouteRequest{ModelId: "m"}, codes.InvalidArgument, "provider_name is required"},
		{"no model", &inferencev1.SetInferenceRouteRequest{ProviderName: "oa", ModelId: " "}, codes.InvalidArgument, "model_id is required"},
		{"bad route name", &inferencev1.SetInferenceRouteRequest{RouteName: "x", ProviderName: "oa", ModelId: "m"}, codes.InvalidArgument, "unknown route_name 'x'"},
		{"missing provider", &inferencev1.SetInferenceRouteRequest{ProviderName: "nope", ModelId: "m"}, codes.FailedPrecondition, "provider 'nope' not found in workspace 'default'"},
		{"unsupported type", &inferencev1.SetInferenceRouteRequest{ProviderName: "gh", ModelId: "m", NoVerify: true}, codes.InvalidArgument, "provider 'gh' has unsupported type 'github' for cluster inference"},
		{"vertex without project", &inferencev1.SetInferenceRouteRequest{ProviderName: "vx", ModelId: "claude-x", NoVerify: true}, codes.FailedPrecondition, "Vertex AI provider requires VERTEX_AI_PROJECT_ID config"},
	} {
		_, err := svc.SetInferenceRoute(ctx, tc.req)
		apitest.WantErr(t, tc.name, err, tc.code, tc.msg)
		if err != nil && strings.Contains(err.Error(), "ghp-secret") {
			t.Errorf("%s: error names a credential: %v", tc.name, err)
		}
	}

	del, err := svc.DeleteInferenceRoute(ctx, &inferencev1.DeleteInferenceRouteRequest{})
	if err != nil || !del.GetDeleted() {
		t.Fatalf("delete = %v, %v, want deleted", del, err)
	}
	del, err = svc.DeleteInferenceRoute(ctx, &inferencev1.DeleteInferenceRouteRequest{})
	if err != nil || del.GetDeleted() {
		t.Fatalf("second delete = %v, %v, want not deleted", del, err)
	}
	if _, err := svc.GetInferenceRoute(ctx, &inferencev1.GetInferenceRouteRequest{}); errdefs.Code(err) != codes.NotFound {
		t.Errorf("get after delete: %v", err)
	}
}

// TestBundleDropsUnusableRoutes: a route whose provider was deleted, or
// whose credential expired, is left out of the bundle (the revision
// changes, so supervisors drop the key they had) instead of failing it.
func TestBundleDropsUnusableRoutes(t *testing.T) {
	f := apitest.NewFixture(t)
	svc := newService(f.Env, true)
	createProvider(t, f.Env, "team-a", "oa", "openai", map[string]string{"OPENAI_API_KEY": "sk-1"}, nil)
	createProvider(t, f.Env, "team-a", "an", "anthropic", map[string]string{"ANTHROPIC_API_KEY": "ak-1"}, nil)
	admin := apitest.As(t.Context(), apitest.OIDCRoot)
	for _, req := range []*inferencev1.SetInferenceRouteRequest{
		{Workspace: "team-a", ProviderName: "oa", ModelId: "m", NoVerify: true},
		{Workspace: "team-a", RouteName: "sandbox-system", ProviderName: "an", ModelId: "c", NoVerify: true},
	} {
		if _, err := svc.SetInferenceRoute(admin, req); err != nil {
			t.Fatal(err)
		}
	}
	sbx := apitest.As(t.Context(), apitest.Sandbox(f.SandboxA))
	names := func() []string {
		t.Helper()
		b, err := svc.GetInferenceBundle(sbx, &inferencev1.GetInferenceBundleRequest{})
		if err != nil {
			t.Fatalf("bundle: %v", err)
		}
		var out []string
		for _, r := range b.GetRoutes() {
			out = append(out, r.GetName())
		}
		return out
	}
	if got := names(); !cmp.Equal(got, []string{"inference.local", "sandbox-system"}) {
		t.Fatalf("bundle = %v", got)
	}
	if _, err := f.Providers.Delete(t.Context(), "team-a", "oa", func(context.Context) ([]string, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	if got := names(); !cmp.Equal(got, []string{"sandbox-system"}) {
		t.Errorf("bundle after the provider's delete = %v, want only sandbox-system", got)
	}
	past := time.Now().Add(-time.Minute).UnixMilli()
	if _, err := f.Providers.Update(t.Context(), "team-a", &datamodelv1.Provider{Metadata: &datamodelv1.ObjectMeta{Name: "an"}}, map[string]int64{"ANTHROPIC_API_KEY": past}); err != nil {
		t.Fatal(err)
	}
	if got := names(); len(got) != 0 {
		t.Errorf("bundle after the credential expired = %v, want none", got)
	}
}

// TestConcurrentSetIsCAS: concurrent sets of one route never lose an
// update silently: each either lands (with its own version) or answers
// Aborted.
func TestConcurrentSetIsCAS(t *testing.T) {
	e := apitest.NewEnv(t)
	svc := newService(e, false)
	ctx := apitest.As(t.Context(), apitest.LocalDev)
	createProvider(t, e, "default", "oa", "openai", map[string]string{"OPENAI_API_KEY": "sk-1"}, nil)
	if _, err := svc.SetInferenceRoute(ctx, &inferencev1.SetInferenceRouteRequest{ProviderName: "oa", ModelId: "m0", NoVerify: true}); err != nil {
		t.Fatal(err)
	}
	const n = 8
	var wg sync.WaitGroup
	versions := make(chan uint64, n)
	var aborted, other int
	var mu sync.Mutex
	for i := range n {
		wg.Go(func() {
			resp, err := svc.SetInferenceRoute(ctx, &inferencev1.SetInferenceRouteRequest{ProviderName: "oa", ModelId: "m" + string(rune('a'+i)), NoVerify: true})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				versions <- resp.GetVersion()
			case errdefs.Code(err) == codes.Aborted:
				aborted++
			default:
				other++
				t.Errorf("set: %v", err)
			}
		})
	}
	wg.Wait()
	close(versions)
	seen := map[uint64]bool{}
	for v := range versions {
		if seen[v] {
			t.Errorf("version %d handed out twice: an update was lost", v)
		}
		seen[v] = true
	}
	got, err := svc.GetInferenceRoute(ctx, &inferencev1.GetInferenceRouteRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got.GetVersion() != uint64(1+len(seen)) {
		t.Errorf("final version %d after %d successful updates (and %d aborted)", got.GetVersion(), len(seen), aborted)
	}
	// A stale version (the row changed after it was read) is Aborted at
	// the store: the service writes with UpdateCAS on the version read.
	r := &inferencev1.InferenceRoute{}
	if err := e.Store.GetByName(t.Context(), store.TypeInferenceRoute, "default", "inference.local", r); err != nil {
		t.Fatal(err)
	}
	_, err = e.Store.UpdateCAS(t.Context(), store.TypeInferenceRoute, r.GetMetadata().GetId(), r.GetMetadata().GetResourceVersion()-1, &inferencev1.InferenceRoute{}, nil)
	if errdefs.Code(err) != codes.Aborted {
		t.Errorf("stale CAS = %v, want Aborted", err)
	}
}

// TestVerify: without no_verify the endpoint is probed with the real
// credential; a success is reported as the validated endpoint, a rejected
// key is FailedPrecondition that never echoes the key.
func TestVerify(t *testing.T) {
	var gotAuth, gotModel string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotAuth = r.Header.Get("Authorization")
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		gotModel, _ = body["model"].(string)
		if gotAuth != "Bearer sk-good" {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error":"invalid api key ` + strings.TrimPrefix(gotAuth, "Bearer ") + `"}`))
			return
		}
		if r.URL.Path != "/v1/chat/completions" {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		_, _ = w.Write([]byte(`{"choices":[]}`))
	}))
	defer srv.Close()
	e := apitest.NewEnv(t)
	svc := newService(e, false)
	ctx := apitest.As(t.Context(), apitest.LocalDev)
	createProvider(t, e, "default", "good", "openai", map[string]string{"OPENAI_API_KEY": "sk-good"}, map[string]string{"OPENAI_BASE_URL": srv.URL + "/v1"})
	createProvider(t, e, "default", "bad", "openai", map[string]string{"OPENAI_API_KEY": "sk-wrong"}, map[string]string{"OPENAI_BASE_URL": srv.URL + "/v1"})
	resp, err := svc.SetInferenceRoute(ctx, &inferencev1.SetInferenceRouteRequest{ProviderName: "good", ModelId: "gpt-v"})
	if err != nil {
		t.Fatal(err)
	}
	want := []*inferencev1.ValidatedEndpoint{{Url: srv.URL + "/v1/chat/completions", Protocol: "openai_chat_completions"}}
	if diff := cmp.Diff(want, resp.GetValidatedEndpoints(), protocmp.Transform()); diff != "" || !resp.GetValidationPerformed() || gotModel != "gpt-v" {
		t.Errorf("validated (-want +got):\n%s performed=%v model=%q", diff, resp.GetValidationPerformed(), gotModel)
	}
	_, err = svc.SetInferenceRoute(ctx, &inferencev1.SetInferenceRouteRequest{ProviderName: "bad", ModelId: "gpt-v"})
	apitest.WantErr(t, "bad key", err, codes.FailedPrecondition, "failed to verify inference endpoint for provider 'bad' and model 'gpt-v'")
	apitest.WantErr(t, "bad key", err, codes.FailedPrecondition, "upstream rejected credentials with upstream returned HTTP 401")
	if strings.Contains(err.Error(), "sk-wrong") {
		t.Errorf("verification error echoes the key: %v", err)
	}
	// A failed verification stores nothing.
	got, err := svc.GetInferenceRoute(ctx, &inferencev1.GetInferenceRouteRequest{})
	if err != nil || got.GetProviderName() != "good" {
		t.Errorf("route after failed verify = %v, %v, want the verified one", got, err)
	}
}

// TestVerifyDoesNotFollowRedirects: a probe answered with a redirect is a
// failed verification; the key never reaches the redirect's target.
func TestVerifyDoesNotFollowRedirects(t *testing.T) {
	var leaked atomic.Bool
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		leaked.Store(r.Header.Get("X-Api-Key") != "" || r.Header.Get("Authorization") != "")
	}))
	defer other.Close()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+"/steal", http.StatusTemporaryRedirect)
	}))
	defer srv.Close()
	e := apitest.NewEnv(t)
	svc := newService(e, false)
	createProvider(t, e, "default", "an", "anthropic", map[string]string{"ANTHROPIC_API_KEY": "ak-redirect"}, map[string]string{"ANTHROPIC_BASE_URL": srv.URL + "/v1"})
	_, err := svc.SetInferenceRoute(apitest.As(t.Context(), apitest.LocalDev), &inferencev1.SetInferenceRouteRequest{ProviderName: "an", ModelId: "claude-x"})
	apitest.WantErr(t, "redirected probe", err, codes.FailedPrecondition, "upstream returned an unexpected response with upstream returned HTTP 307")
	if leaked.Load() {
		t.Error("the probe followed the redirect with the key")
	}
}
