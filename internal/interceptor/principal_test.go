package interceptor

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/openshell-go/openshell/internal/auth"
)

// TestPrincipalMap: the caller summary sent in every Evaluate has
// OpenShell's keys and values: users with subject, display name, identity
// provider, roles and scopes; supervisors as kind sandbox with their
// sandbox id and how they authenticated; unknown without a principal.
func TestPrincipalMap(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    *auth.Principal
		want map[string]string
	}{
		{"oidc user", &auth.Principal{Kind: auth.KindUser, Source: auth.SourceOIDC, Subject: "u-1", DisplayName: "Alice", Roles: []string{"openshell-user", "openshell-admin"}, Scopes: []string{"sandbox:read", "sandbox:write"}},
			map[string]string{"kind": "user", "subject": "u-1", "display_name": "Alice", "provider": "oidc", "roles": "openshell-user,openshell-admin", "scopes": "sandbox:read,sandbox:write"}},
		{"mtls user", &auth.Principal{Kind: auth.KindUser, Source: auth.SourceMTLS, Subject: "bob"},
			map[string]string{"kind": "user", "subject": "bob", "provider": "mtls"}},
		{"local dev user", auth.LocalDevPrincipal(),
			map[string]string{"kind": "user", "subject": auth.LocalDevSubject, "display_name": auth.LocalDevSubject, "provider": "local_dev", "roles": auth.DefaultUserRole + "," + auth.DefaultAdminRole, "scopes": auth.ScopeAll}},
		{"supervisor with a sandbox jwt", &auth.Principal{Kind: auth.KindSandbox, Source: auth.SourceSandboxJWT, Subject: "spiffe://openshell/sandbox/sb-1", DisplayName: "spiffe://openshell/sandbox/sb-1", SandboxID: "sb-1"},
			map[string]string{"kind": "sandbox", "sandbox_id": "sb-1", "source": "bootstrap_jwt"}},
		{"supervisor bootstrapping from kubernetes", &auth.Principal{Kind: auth.KindSandbox, Source: auth.SourceK8sSABootstrap, SandboxID: "sb-2"},
			map[string]string{"kind": "sandbox", "sandbox_id": "sb-2", "source": "k8s_service_account"}},
		{"no principal", nil, map[string]string{"kind": "unknown"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			if tc.p != nil {
				ctx = auth.NewContext(ctx, tc.p)
			}
			if diff := cmp.Diff(tc.want, principalMap(ctx)); diff != "" {
				t.Errorf("principalMap() (-want +got):\n%s", diff)
			}
		})
	}
}
