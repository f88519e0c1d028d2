package api

import (
	"testing"

	"google.golang.org/grpc/codes"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/store"
)

// CreateSandbox and AdoptSandbox refuse an unsafe spec.policy with every
// violation at once, and leave no sandbox row behind.
func TestUnsafePolicyIsRefusedBeforeAnythingIsStored(t *testing.T) {
	s, st := newTestService(t, false)
	ctx := as(t.Context(), localDev)
	spec := &openshellv1.SandboxSpec{Policy: &sandboxv1.SandboxPolicy{
		Process:    &sandboxv1.ProcessPolicy{RunAsUser: "root"},
		Filesystem: &sandboxv1.FilesystemPolicy{ReadOnly: []string{"/usr/../etc/shadow"}, ReadWrite: []string{"/"}},
		NetworkPolicies: map[string]*sandboxv1.NetworkPolicyRule{
			"all": {Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "*.com", Port: 443}}},
		},
	}}
	const want = "policy contains unsafe content: " +
		"run_as_user must be 'sandbox' or a numeric UID/GID in range [1, 4294967294], got 'root'; " +
		"path contains '..' traversal component: /usr/../etc/shadow; " +
		"read-write path is overly broad: /; " +
		"network policy 'all': TLD wildcard '*.com' is not allowed; use subdomain wildcards like '*.example.com' instead"
	_, err := s.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: "unsafe", Spec: spec})
	wantErr(t, "CreateSandbox(unsafe policy)", err, codes.InvalidArgument, want)
	_, err = s.AdoptSandbox(ctx, &openshellv1.AdoptSandboxRequest{Name: "unsafe", Spec: spec})
	wantErr(t, "AdoptSandbox(unsafe policy)", err, codes.InvalidArgument, want)
	rows, err := st.List(t.Context(), store.TypeSandbox, store.ListOptions{AllWorkspaces: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 0 {
		t.Errorf("refused creates left %d sandbox rows", len(rows))
	}
}
