package cli

import (
	"context"
	"strings"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// providerFake answers the provider RPCs; leak makes it return a credential
// value, as a faulty or hostile gateway could.
type providerFake struct {
	openshellv1.UnimplementedOpenShellServer
	leak string

	mu      sync.Mutex
	created []*openshellv1.CreateProviderRequest
	updated []*openshellv1.UpdateProviderRequest
}

func (f *providerFake) provider(name string) *datamodelv1.Provider {
	return &datamodelv1.Provider{
		Metadata:    &datamodelv1.ObjectMeta{Name: name, Id: "id-" + name, Workspace: "default"},
		Type:        "openai",
		Credentials: map[string]string{"OPENAI_API_KEY": f.leak},
		Config:      map[string]string{"region": "eu"},
	}
}

func (f *providerFake) CreateProvider(_ context.Context, r *openshellv1.CreateProviderRequest) (*openshellv1.ProviderResponse, error) {
	f.mu.Lock()
	f.created = append(f.created, proto.Clone(r).(*openshellv1.CreateProviderRequest))
	f.mu.Unlock()
	return &openshellv1.ProviderResponse{Provider: f.provider(r.GetProvider().GetMetadata().GetName())}, nil
}

func (f *providerFake) UpdateProvider(_ context.Context, r *openshellv1.UpdateProviderRequest) (*openshellv1.ProviderResponse, error) {
	f.mu.Lock()
	f.updated = append(f.updated, proto.Clone(r).(*openshellv1.UpdateProviderRequest))
	f.mu.Unlock()
	return &openshellv1.ProviderResponse{Provider: f.provider(r.GetProvider().GetMetadata().GetName())}, nil
}

func (f *providerFake) GetProvider(_ context.Context, r *openshellv1.GetProviderRequest) (*openshellv1.ProviderResponse, error) {
	return &openshellv1.ProviderResponse{Provider: f.provider(r.GetName())}, nil
}

func (f *providerFake) ListProviders(context.Context, *openshellv1.ListProvidersRequest) (*openshellv1.ListProvidersResponse, error) {
	return &openshellv1.ListProvidersResponse{Providers: []*datamodelv1.Provider{f.provider("a"), f.provider("b")}}, nil
}

func (f *providerFake) ListSandboxProviders(context.Context, *openshellv1.ListSandboxProvidersRequest) (*openshellv1.ListSandboxProvidersResponse, error) {
	return &openshellv1.ListSandboxProvidersResponse{Providers: []*datamodelv1.Provider{f.provider("a")}}, nil
}

// TestProviderCredentialFlags: --credential KEY=VALUE and a bare KEY read
// from the CLI's environment reach the request; mistakes are usage errors
// that never echo a value and send nothing.
func TestProviderCredentialFlags(t *testing.T) {
	f := &providerFake{leak: "REDACTED"}
	ep := serveOpenShell(t, f)
	tt := newTester(t)
	tt.env["GITHUB_TOKEN"] = "ghp-from-env"
	tt.env["lower_key"] = "lower-from-env"

	r := tt.run("--gateway-endpoint", ep, "provider", "create", "gh", "--type", "github",
		"--credential", "GITHUB_TOKEN", "--credential", "lower_key", "--credential", "EXTRA=a=b", "--config", "org=acme")
	if r.err != nil || r.stdout != "Created provider gh\n" {
		t.Fatalf("create = %q %v", r.stdout, r.err)
	}
	want := &openshellv1.CreateProviderRequest{Provider: &datamodelv1.Provider{
		Metadata:    &datamodelv1.ObjectMeta{Name: "gh"},
		Type:        "github",
		Credentials: map[string]string{"GITHUB_TOKEN": "ghp-from-env", "lower_key": "lower-from-env", "EXTRA": "a=b"},
		Config:      map[string]string{"org": "acme"},
	}}
	if len(f.created) != 1 || !proto.Equal(f.created[0], want) {
		t.Errorf("request = %v, want %v", f.created, want)
	}

	for _, tc := range []struct {
		args    []string
		wantErr string
		never   string
	}{
		{[]string{"--credential", "MISSING_VAR"}, "--credential MISSING_VAR: environment variable MISSING_VAR is not set", ""},
		{[]string{"--credential", "sk-typed-value-123"}, "invalid --credential (#1, not shown)", "sk-typed-value-123"},
		{[]string{"--credential", "=sk-typed-value-123"}, "the key is empty", "sk-typed-value-123"},
		{[]string{"--credential", "K=sk-one", "--credential", "K=sk-two"}, "--credential K given more than once", "sk-"},
		{[]string{"--credential", "GITHUB_TOKEN", "--name", "other"}, "give the provider name once", ""},
	} {
		args := append([]string{"--gateway-endpoint", ep, "provider", "create", "gh", "--type", "github"}, tc.args...)
		r := tt.run(args...)
		if r.err == nil || r.code() != 2 || !strings.Contains(r.err.Error(), tc.wantErr) {
			t.Errorf("%v: err = %v (code %d), want usage error containing %q", tc.args, r.err, r.code(), tc.wantErr)
			continue
		}
		if tc.never != "" && strings.Contains(r.err.Error()+r.stdout+r.stderr, tc.never) {
			t.Errorf("%v: the error echoes the value: %v", tc.args, r.err)
		}
	}
	if r := tt.run("--gateway-endpoint", ep, "provider", "create", "gh"); r.code() != 2 || !strings.Contains(r.err.Error(), "--type is required") {
		t.Errorf("create without --type = %v", r.err)
	}
	if len(f.created) != 1 {
		t.Errorf("usage errors reached the gateway: %d creates", len(f.created))
	}

	r = tt.run("--gateway-endpoint", ep, "provider", "update", "gh", "--credential", "GITHUB_TOKEN", "--config", "org=")
	if r.err != nil || r.stdout != "Updated provider gh\n" {
		t.Fatalf("update = %q %v", r.stdout, r.err)
	}
	wantU := &openshellv1.UpdateProviderRequest{Provider: &datamodelv1.Provider{
		Metadata:    &datamodelv1.ObjectMeta{Name: "gh"},
		Credentials: map[string]string{"GITHUB_TOKEN": "ghp-from-env"},
		Config:      map[string]string{"org": ""},
	}}
	if len(f.updated) != 1 || !proto.Equal(f.updated[0], wantU) {
		t.Errorf("update request = %v, want %v", f.updated, wantU)
	}
	if r := tt.run("--gateway-endpoint", ep, "provider", "update", "gh"); r.code() != 2 || !strings.Contains(r.err.Error(), "nothing to update") {
		t.Errorf("update with nothing = %v", r.err)
	}
}

// TestProviderOutputNeverPrintsValues: even when the gateway returns a
// credential value, no output format prints it.
func TestProviderOutputNeverPrintsValues(t *testing.T) {
	const leaked = "sk-leaked-by-gateway-9d3e"
	ep := serveOpenShell(t, &providerFake{leak: leaked})
	tt := newTester(t)
	tt.env["OPENAI_API_KEY"] = "sk-given"
	for _, args := range [][]string{
		{"provider", "get", "a"},
		{"provider", "get", "a", "-o", "json"},
		{"provider", "get", "a", "-o", "yaml"},
		{"provider", "list"},
		{"provider", "list", "-o", "json"},
		{"provider", "list", "-o", "yaml"},
		{"provider", "create", "a", "--type", "openai", "--credential", "OPENAI_API_KEY", "-o", "json"},
		{"provider", "update", "a", "--credential", "OPENAI_API_KEY", "-o", "yaml"},
		{"sandbox", "provider", "list", "sb", "-o", "json"},
		{"sandbox", "provider", "list", "sb"},
	} {
		r := tt.run(append([]string{"--gateway-endpoint", ep}, args...)...)
		if r.err != nil {
			t.Errorf("%v: %v", args, r.err)
			continue
		}
		all := r.stdout + r.stderr
		if strings.Contains(all, leaked) || strings.Contains(all, "sk-given") {
			t.Errorf("%v printed a credential value:\n%s", args, all)
		}
		if !strings.Contains(all, "OPENAI_API_KEY") {
			t.Errorf("%v does not name the credential key:\n%s", args, all)
		}
	}
}
