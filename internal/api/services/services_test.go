package services_test

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/api/apitest"
	"github.com/openshell-go/openshell/internal/api/services"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/store"
)

func newService(t *testing.T, f *apitest.Fixture, oidc bool) *services.Service {
	t.Helper()
	return services.New(services.Options{
		Sandboxes: f.Engine, Store: f.Store, Authz: f.Authz(oidc),
		URLs: services.URLs{Domains: []string{"openshell.localhost"}, Scheme: "http", Port: 17670},
	})
}

// TestAuthorization runs the service RPCs as each kind of principal on an
// OIDC gateway against team-a's sandbox: members act, everyone else finds
// nothing (list: PermissionDenied, as for ListSandboxes).
func TestAuthorization(t *testing.T) {
	f := apitest.NewFixture(t)
	svc := newService(t, f, true)
	ctx := apitest.As(t.Context(), apitest.OIDCRoot)
	if _, err := svc.ExposeService(ctx, &openshellv1.ExposeServiceRequest{Sandbox: "sb", Service: "web", TargetPort: 8080, Workspace: "team-a"}); err != nil {
		t.Fatal(err)
	}
	calls := []apitest.Call{
		{Name: "ExposeService", Do: func(ctx context.Context) error {
			_, err := svc.ExposeService(ctx, &openshellv1.ExposeServiceRequest{Sandbox: "sb", Service: "api", TargetPort: 9000, Workspace: "team-a"})
			return err
		}},
		{Name: "GetService", Do: func(ctx context.Context) error {
			_, err := svc.GetService(ctx, &openshellv1.GetServiceRequest{Sandbox: "sb", Service: "web", Workspace: "team-a"})
			return err
		}},
		{Name: "ListServices", Do: func(ctx context.Context) error {
			_, err := svc.ListServices(ctx, &openshellv1.ListServicesRequest{Workspace: "team-a"})
			return err
		}},
		{Name: "ListServices sandbox", Do: func(ctx context.Context) error {
			_, err := svc.ListServices(ctx, &openshellv1.ListServicesRequest{Sandbox: "sb", Workspace: "team-a"})
			return err
		}},
		{Name: "ListServices all", Do: func(ctx context.Context) error {
			_, err := svc.ListServices(ctx, &openshellv1.ListServicesRequest{AllWorkspaces: true})
			return err
		}},
		{Name: "DeleteService", Do: func(ctx context.Context) error {
			_, err := svc.DeleteService(ctx, &openshellv1.DeleteServiceRequest{Sandbox: "sb", Service: "missing", Workspace: "team-a"})
			return err
		}},
	}
	ok, nf, denied := codes.OK, codes.NotFound, codes.PermissionDenied
	apitest.Matrix(t, calls, []apitest.Case{
		{Name: "local dev", P: apitest.LocalDev, Want: []codes.Code{ok, ok, ok, ok, ok, ok}},
		{Name: "platform admin", P: apitest.OIDCRoot, Want: []codes.Code{ok, ok, ok, ok, ok, ok}},
		{Name: "workspace user", P: apitest.OIDCUser("ua"), Want: []codes.Code{ok, ok, ok, ok, denied, ok}},
		{Name: "workspace admin", P: apitest.OIDCUser("aa"), Want: []codes.Code{ok, ok, ok, ok, denied, ok}},
		{Name: "non-member", P: apitest.OIDCUser("stranger"), Want: []codes.Code{nf, nf, denied, nf, denied, nf}},
		{Name: "no subject", P: apitest.NoSubject, Want: []codes.Code{nf, nf, denied, nf, denied, nf}},
		{Name: "sandbox principal", P: apitest.Sandbox(f.SandboxA), Want: []codes.Code{nf, nf, denied, nf, denied, nf}},
	})
}

// TestEndpointLifecycle: expose creates one record per sandbox/service,
// exposing again replaces the port and keeps the id, get/list return it
// with its URL, delete removes it once.
func TestEndpointLifecycle(t *testing.T) {
	f := apitest.NewFixture(t)
	svc := newService(t, f, false)
	ctx := t.Context()
	first, err := svc.ExposeService(ctx, &openshellv1.ExposeServiceRequest{Sandbox: "sb", Service: "web", TargetPort: 8080, Workspace: "team-a"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := first.GetUrl(), "http://sb--web--team-a.openshell.localhost:17670/"; got != want {
		t.Errorf("ExposeService URL = %q, want %q", got, want)
	}
	again, err := svc.ExposeService(ctx, &openshellv1.ExposeServiceRequest{Sandbox: "sb", Service: "web", TargetPort: 9090, Workspace: "team-a"})
	if err != nil {
		t.Fatal(err)
	}
	if again.GetEndpoint().GetMetadata().GetId() != first.GetEndpoint().GetMetadata().GetId() {
		t.Errorf("re-expose changed the id: %q -> %q", first.GetEndpoint().GetMetadata().GetId(), again.GetEndpoint().GetMetadata().GetId())
	}
	got, err := svc.GetService(ctx, &openshellv1.GetServiceRequest{Sandbox: "sb", Service: "web", Workspace: "team-a"})
	if err != nil {
		t.Fatal(err)
	}
	ep := got.GetEndpoint()
	if ep.GetTargetPort() != 9090 || ep.GetSandboxId() != f.SandboxA || ep.GetSandboxName() != "sb" || ep.GetServiceName() != "web" || !ep.GetDomain() ||
		ep.GetMetadata().GetName() != "sb--web" || ep.GetMetadata().GetWorkspace() != "team-a" {
		t.Errorf("GetService = %v, want port 9090 of sb/web in team-a", ep)
	}
	if _, err := svc.ExposeService(ctx, &openshellv1.ExposeServiceRequest{Sandbox: "sb", TargetPort: 3000, Workspace: "team-a"}); err != nil {
		t.Fatal(err)
	}
	list, err := svc.ListServices(ctx, &openshellv1.ListServicesRequest{Workspace: "team-a"})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(list.GetServices()); n != 2 {
		t.Fatalf("ListServices = %d endpoints, want 2: %v", n, list)
	}
	recs, err := f.Store.ListScoped(ctx, store.TypeServiceEndpoint, f.SandboxA, 100, 0)
	if err != nil || len(recs) != 2 {
		t.Fatalf("stored records = %d, %v; want 2", len(recs), err)
	}
	other, err := svc.ListServices(ctx, &openshellv1.ListServicesRequest{Workspace: "team-b"})
	if err != nil || len(other.GetServices()) != 0 {
		t.Errorf("ListServices(team-b) = %v, %v; want none", other, err)
	}
	del, err := svc.DeleteService(ctx, &openshellv1.DeleteServiceRequest{Sandbox: "sb", Service: "web", Workspace: "team-a"})
	if err != nil || !del.GetDeleted() {
		t.Fatalf("DeleteService = %v, %v; want deleted", del, err)
	}
	del, err = svc.DeleteService(ctx, &openshellv1.DeleteServiceRequest{Sandbox: "sb", Service: "web", Workspace: "team-a"})
	if err != nil || del.GetDeleted() {
		t.Fatalf("second DeleteService = %v, %v; want not deleted", del, err)
	}
	_, err = svc.GetService(ctx, &openshellv1.GetServiceRequest{Sandbox: "sb", Service: "web", Workspace: "team-a"})
	apitest.WantErr(t, "GetService after delete", err, codes.NotFound, "service endpoint not found")
}

// TestRemovedWithSandbox: deleting the sandbox row removes its endpoints
// in the same transaction.
func TestRemovedWithSandbox(t *testing.T) {
	f := apitest.NewFixture(t)
	svc := newService(t, f, false)
	ctx := t.Context()
	if _, err := svc.ExposeService(ctx, &openshellv1.ExposeServiceRequest{Sandbox: "sb", Service: "web", TargetPort: 8080, Workspace: "team-a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Store.Delete(ctx, store.TypeSandbox, f.SandboxA); err != nil {
		t.Fatal(err)
	}
	recs, err := f.Store.ListScoped(ctx, store.TypeServiceEndpoint, f.SandboxA, 100, 0)
	if err != nil || len(recs) != 0 {
		t.Fatalf("records after sandbox delete = %v, %v; want none", recs, err)
	}
	// No endpoint can be created for a sandbox that is gone.
	_, _, err = f.Store.RecordHit(ctx, store.Record{Type: store.TypeServiceEndpoint, Scope: f.SandboxA, DedupKey: "sb--web", Payload: []byte{}})
	if !errorsIsNotFound(err) {
		t.Fatalf("RecordHit for a deleted sandbox = %v, want NotFound", err)
	}
}

func errorsIsNotFound(err error) bool { return errdefs.Code(err) == codes.NotFound }

// TestValidation checks OpenShell's name and port rules.
func TestValidation(t *testing.T) {
	f := apitest.NewFixture(t)
	svc := newService(t, f, false)
	tests := []struct {
		name string
		req  *openshellv1.ExposeServiceRequest
		msg  string
	}{
		{"no sandbox", &openshellv1.ExposeServiceRequest{Service: "web", TargetPort: 80}, "sandbox is required"},
		{"separator", &openshellv1.ExposeServiceRequest{Sandbox: "sb", Service: "web--api", TargetPort: 80}, "service must not contain '--'"},
		{"uppercase", &openshellv1.ExposeServiceRequest{Sandbox: "sb", Service: "Web", TargetPort: 80}, "service must be a lowercase DNS label"},
		{"leading dash", &openshellv1.ExposeServiceRequest{Sandbox: "sb", Service: "-web", TargetPort: 80}, "service must be a lowercase DNS label"},
		{"too long", &openshellv1.ExposeServiceRequest{Sandbox: "sb", Service: "a23456789012345678901234567890", TargetPort: 80}, "service must be at most 28 characters"},
		{"port zero", &openshellv1.ExposeServiceRequest{Sandbox: "sb", Service: "web"}, "target_port must be in 1..=65535"},
		{"port too big", &openshellv1.ExposeServiceRequest{Sandbox: "sb", Service: "web", TargetPort: 65536}, "target_port must be in 1..=65535"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.req.Workspace = "team-a"
			_, err := svc.ExposeService(t.Context(), tt.req)
			apitest.WantErr(t, "ExposeService", err, codes.InvalidArgument, tt.msg)
		})
	}
	_, err := svc.ExposeService(t.Context(), &openshellv1.ExposeServiceRequest{Sandbox: "nope", Service: "web", TargetPort: 80, Workspace: "team-a"})
	apitest.WantErr(t, "ExposeService(missing sandbox)", err, codes.NotFound, "sandbox \"nope\" not found")
}

// TestURLs checks the URL form: default workspace without a suffix, port
// omitted for the scheme's default, no URL without a domain.
func TestURLs(t *testing.T) {
	tests := []struct {
		u                    services.URLs
		ws, sandbox, service string
		want                 string
	}{
		{services.URLs{Domains: []string{"openshell.localhost"}, Scheme: "http", Port: 17670}, "default", "sb", "web", "http://sb--web.openshell.localhost:17670/"},
		{services.URLs{Domains: []string{"openshell.localhost"}, Scheme: "http", Port: 17670}, "", "sb", "", "http://sb.openshell.localhost:17670/"},
		{services.URLs{Domains: []string{"apps.example.com"}, Scheme: "https", Port: 443}, "default", "sb", "web", "https://sb--web.apps.example.com/"},
		{services.URLs{Domains: []string{"apps.example.com"}, Scheme: "https", Port: 443}, "team", "sb", "", "https://sb----team.apps.example.com/"},
		{services.URLs{Scheme: "https", Port: 443}, "default", "sb", "web", ""},
	}
	for _, tt := range tests {
		if got := tt.u.URL(tt.ws, tt.sandbox, tt.service); got != tt.want {
			t.Errorf("%+v.URL(%q, %q, %q) = %q, want %q", tt.u, tt.ws, tt.sandbox, tt.service, got, tt.want)
		}
	}
}
