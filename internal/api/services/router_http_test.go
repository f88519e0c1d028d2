package services_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/api/apitest"
	"github.com/openshell-go/openshell/internal/api/services"
	"github.com/openshell-go/openshell/internal/auth"
)

// TestRouterRefusals: the router answers before any relay is opened: an
// unknown host, service or sandbox and a sandbox the caller may not see
// read 404 alike, a sandbox that is not ready 412.
func TestRouterRefusals(t *testing.T) {
	f := apitest.NewFixture(t)
	svc := services.New(services.Options{
		Sandboxes: f.Engine, Store: f.Store, Authz: f.Authz(true),
		URLs: services.URLs{Domains: []string{"openshell.localhost"}, Scheme: "http", Port: 80},
	})
	if _, err := svc.ExposeService(apitest.As(t.Context(), apitest.OIDCRoot), &openshellv1.ExposeServiceRequest{Sandbox: "sb", Service: "web", TargetPort: 8080, Workspace: "team-a"}); err != nil {
		t.Fatal(err)
	}
	r := services.NewRouter(svc, nil)
	t.Cleanup(r.Close)
	tests := []struct {
		name string
		host string
		p    *auth.Principal
		code int
	}{
		{"member, sandbox provisioning", "sb--web--team-a.openshell.localhost", apitest.OIDCUser("ua"), http.StatusPreconditionFailed},
		// A non-member is refused before any lookup: the answer is the
		// same whether the sandbox or the workspace exists.
		{"non-member", "sb--web--team-a.openshell.localhost", apitest.OIDCUser("stranger"), http.StatusForbidden},
		{"non-member, unknown sandbox", "nope--web--team-a.openshell.localhost", apitest.OIDCUser("stranger"), http.StatusForbidden},
		{"non-member, unknown workspace", "sb--web--nowhere.openshell.localhost", apitest.OIDCUser("stranger"), http.StatusForbidden},
		{"sandbox principal", "sb--web--team-a.openshell.localhost", apitest.Sandbox(f.SandboxA), http.StatusNotFound},
		{"unknown service", "sb--api--team-a.openshell.localhost", apitest.OIDCUser("ua"), http.StatusNotFound},
		{"unknown sandbox", "nope--web--team-a.openshell.localhost", apitest.OIDCUser("ua"), http.StatusNotFound},
		{"other workspace", "sb--web--team-b.openshell.localhost", apitest.OIDCRoot, http.StatusNotFound},
		{"not a service host", "example.com", apitest.OIDCRoot, http.StatusNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := httptest.NewRequestWithContext(apitest.As(t.Context(), tt.p), http.MethodGet, "/", nil)
			req.Host = tt.host
			w := httptest.NewRecorder()
			r.ServeHTTP(w, req)
			if w.Code != tt.code || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/plain") {
				t.Errorf("GET %s as %s = %d %q, want %d", tt.host, tt.name, w.Code, w.Body.String(), tt.code)
			}
		})
	}
}
