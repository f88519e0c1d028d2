package workspaces_test

import (
	"context"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/api/apitest"
	"github.com/openshell-go/openshell/internal/api/authz"
	"github.com/openshell-go/openshell/internal/api/workspaces"
	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/store"
)

// hookStore runs a one-shot hook just before the first delete or create
// of an object type, to interleave a concurrent writer at that point.
type hookStore struct {
	store.Store
	mu    sync.Mutex
	hooks map[string]func()
}

func (h *hookStore) on(op, objType string, fn func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.hooks[op+" "+objType] = fn
}

func (h *hookStore) fire(op, objType string) {
	h.mu.Lock()
	fn := h.hooks[op+" "+objType]
	delete(h.hooks, op+" "+objType)
	h.mu.Unlock()
	if fn != nil {
		fn()
	}
}

func (h *hookStore) Create(ctx context.Context, objType string, msg proto.Message) (store.WriteResult, error) {
	h.fire("create", objType)
	return h.Store.Create(ctx, objType, msg)
}

func (h *hookStore) Delete(ctx context.Context, objType, id string) (bool, error) {
	h.fire("delete", objType)
	return h.Store.Delete(ctx, objType, id)
}

func (h *hookStore) DeleteIf(ctx context.Context, objType, id string, expectedRV uint64) error {
	h.fire("delete", objType)
	return h.Store.DeleteIf(ctx, objType, id, expectedRV)
}

type fixture struct {
	*apitest.Fixture
	svc   *workspaces.Service
	hooks *hookStore
}

func newFixture(t *testing.T, oidc bool) *fixture {
	t.Helper()
	f := apitest.NewFixture(t)
	h := &hookStore{Store: f.Store, hooks: map[string]func(){}}
	az := authz.New(authz.Options{Store: h, Sandboxes: f.Engine, OIDC: oidc, AdminRole: apitest.AdminRole})
	return &fixture{Fixture: f, hooks: h, svc: workspaces.New(workspaces.Options{Store: h, Engine: f.Engine, Authz: az})}
}

// setRole changes a member's role behind the service's back.
func (f *fixture) setRole(t *testing.T, ws, subject string, role openshellv1.WorkspaceRole) {
	t.Helper()
	m := &openshellv1.WorkspaceMember{}
	if err := f.Store.GetByName(t.Context(), store.TypeWorkspaceMember, ws, subject, m); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Store.UpdateCAS(t.Context(), store.TypeWorkspaceMember, m.GetMetadata().GetId(), 0, m, func(p proto.Message) error {
		p.(*openshellv1.WorkspaceMember).Role = role
		return nil
	}); err != nil {
		t.Fatalf("concurrent role change: %v", err)
	}
}

func (f *fixture) members(t *testing.T, ws string) map[string]openshellv1.WorkspaceRole {
	t.Helper()
	list, err := store.ListAs(t.Context(), f.Store, store.TypeWorkspaceMember, store.ListOptions{Workspace: ws}, func() *openshellv1.WorkspaceMember { return &openshellv1.WorkspaceMember{} })
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]openshellv1.WorkspaceRole{}
	for _, m := range list {
		out[m.GetPrincipalSubject()] = m.GetRole()
	}
	return out
}

func (f *fixture) phase(t *testing.T, ws string) datamodelv1.WorkspacePhase {
	t.Helper()
	w, err := f.Authz(false).LoadWorkspace(t.Context(), ws)
	if err != nil {
		t.Fatalf("workspace %s: %v", ws, err)
	}
	return w.GetStatus().GetPhase()
}

// newEmpty creates workspace "empty" (no sandboxes) with member alice.
func (f *fixture) newEmpty(t *testing.T) {
	t.Helper()
	apitest.CreateWorkspace(t, f.Store, "empty")
	apitest.AddMember(t, f.Store, "empty", "alice", openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER)
}

var root = func(t *testing.T) context.Context { return apitest.As(t.Context(), apitest.LocalDev) }

// TestDeleteWorkspaceMemberChanged is the regression test for the
// unconditional member delete: a member changed while the workspace is
// being deleted fails the delete with Aborted and keeps the workspace.
func TestDeleteWorkspaceMemberChanged(t *testing.T) {
	f := newFixture(t, false)
	f.newEmpty(t)
	f.hooks.on("delete", store.TypeWorkspaceMember, func() {
		f.setRole(t, "empty", "alice", openshellv1.WorkspaceRole_WORKSPACE_ROLE_ADMIN)
	})
	_, err := f.svc.DeleteWorkspace(root(t), &openshellv1.DeleteWorkspaceRequest{Name: "empty"})
	apitest.WantErr(t, "DeleteWorkspace", err, codes.Aborted, "modified concurrently")
	if got := f.phase(t, "empty"); got != authz.WorkspaceActive {
		t.Errorf("workspace phase after the aborted delete = %v, want ACTIVE", got)
	}
	if diff := cmp.Diff(map[string]openshellv1.WorkspaceRole{"alice": openshellv1.WorkspaceRole_WORKSPACE_ROLE_ADMIN}, f.members(t, "empty")); diff != "" {
		t.Errorf("members (-want +got):\n%s", diff)
	}
	// Retried, it goes through.
	if _, err := f.svc.DeleteWorkspace(root(t), &openshellv1.DeleteWorkspaceRequest{Name: "empty"}); err != nil {
		t.Fatalf("DeleteWorkspace again: %v", err)
	}
	if got := f.members(t, "empty"); len(got) != 0 {
		t.Errorf("members after delete = %v", got)
	}
}

// TestDeleteWorkspaceChanged is the regression test for the unconditional
// workspace delete: another writer of the workspace (a second delete
// marking it TERMINATING) fails this one with Aborted.
func TestDeleteWorkspaceChanged(t *testing.T) {
	f := newFixture(t, false)
	f.newEmpty(t)
	f.hooks.on("delete", store.TypeWorkspace, func() {
		if _, _, err := store.UpdateCASAs(t.Context(), f.Store, store.TypeWorkspace, authz.WorkspaceID("empty"), 0,
			func() *datamodelv1.Workspace { return &datamodelv1.Workspace{} },
			func(w *datamodelv1.Workspace) error { w.Status.Phase = authz.WorkspaceTerminating; return nil }); err != nil {
			t.Fatalf("concurrent workspace write: %v", err)
		}
	})
	_, err := f.svc.DeleteWorkspace(root(t), &openshellv1.DeleteWorkspaceRequest{Name: "empty"})
	apitest.WantErr(t, "DeleteWorkspace", err, codes.Aborted, "modified concurrently")
	// The other writer's TERMINATING stands: this call does not restore
	// over a version it did not write.
	if got := f.phase(t, "empty"); got != authz.WorkspaceTerminating {
		t.Errorf("workspace phase = %v, want TERMINATING", got)
	}
}

// TestRemoveWorkspaceMemberChanged is the regression test for the
// unconditional member delete of RemoveWorkspaceMember.
func TestRemoveWorkspaceMemberChanged(t *testing.T) {
	f := newFixture(t, false)
	f.hooks.on("delete", store.TypeWorkspaceMember, func() {
		f.setRole(t, "team-a", "ua", openshellv1.WorkspaceRole_WORKSPACE_ROLE_ADMIN)
	})
	_, err := f.svc.RemoveWorkspaceMember(root(t), &openshellv1.RemoveWorkspaceMemberRequest{Workspace: "team-a", PrincipalSubject: "ua"})
	apitest.WantErr(t, "RemoveWorkspaceMember", err, codes.Aborted, "modified concurrently")
	if got := f.members(t, "team-a")["ua"]; got != openshellv1.WorkspaceRole_WORKSPACE_ROLE_ADMIN {
		t.Errorf("ua after the aborted remove = %v, want ADMIN", got)
	}
}

// TestAddWorkspaceMemberDuringDelete: a member added while its workspace
// is deleted is never left behind, whichever side writes first.
func TestAddWorkspaceMemberDuringDelete(t *testing.T) {
	add := func(f *fixture) error {
		_, err := f.svc.AddWorkspaceMember(root(t), &openshellv1.AddWorkspaceMemberRequest{Workspace: "empty", PrincipalSubject: "late", Role: openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER})
		return err
	}
	del := func(f *fixture) error {
		_, err := f.svc.DeleteWorkspace(root(t), &openshellv1.DeleteWorkspaceRequest{Name: "empty"})
		return err
	}
	t.Run("add while terminating", func(t *testing.T) {
		f := newFixture(t, false)
		f.newEmpty(t)
		var addErr error
		f.hooks.on("delete", store.TypeWorkspace, func() { addErr = add(f) })
		if err := del(f); err != nil {
			t.Fatalf("DeleteWorkspace: %v", err)
		}
		apitest.WantErr(t, "AddWorkspaceMember", addErr, codes.FailedPrecondition, `workspace "empty" is being deleted`)
		if got := f.members(t, "empty"); len(got) != 0 {
			t.Errorf("members left behind = %v", got)
		}
	})
	t.Run("delete between check and write", func(t *testing.T) {
		f := newFixture(t, false)
		f.newEmpty(t)
		var delErr error
		f.hooks.on("create", store.TypeWorkspaceMember, func() { delErr = del(f) })
		err := add(f)
		if delErr != nil {
			t.Fatalf("DeleteWorkspace: %v", delErr)
		}
		apitest.WantErr(t, "AddWorkspaceMember", err, codes.NotFound, `workspace "empty" not found`)
		if got := f.members(t, "empty"); len(got) != 0 {
			t.Errorf("members left behind = %v", got)
		}
	})
}

// TestAuthorization runs the workspace RPCs as each kind of principal on
// an OIDC gateway: team-a has user "ua" and admin "aa".
func TestAuthorization(t *testing.T) {
	f := newFixture(t, true)
	created := 0
	calls := []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"GetWorkspace", func(ctx context.Context) error {
			_, err := f.svc.GetWorkspace(ctx, &openshellv1.GetWorkspaceRequest{Name: "team-a"})
			return err
		}},
		{"ListWorkspaceMembers", func(ctx context.Context) error {
			_, err := f.svc.ListWorkspaceMembers(ctx, &openshellv1.ListWorkspaceMembersRequest{Workspace: "team-a"})
			return err
		}},
		{"AddWorkspaceMember", func(ctx context.Context) error {
			_, err := f.svc.AddWorkspaceMember(ctx, &openshellv1.AddWorkspaceMemberRequest{Workspace: "team-a", PrincipalSubject: "zed", Role: openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER})
			return err
		}},
		{"RemoveWorkspaceMember", func(ctx context.Context) error {
			_, err := f.svc.RemoveWorkspaceMember(ctx, &openshellv1.RemoveWorkspaceMemberRequest{Workspace: "team-a", PrincipalSubject: "zed"})
			return err
		}},
		{"CreateWorkspace", func(ctx context.Context) error {
			created++
			_, err := f.svc.CreateWorkspace(ctx, &openshellv1.CreateWorkspaceRequest{Name: "new-" + string(rune('a'+created))})
			return err
		}},
		{"DeleteWorkspace", func(ctx context.Context) error {
			// team-b holds a sandbox: allowed callers get FailedPrecondition.
			_, err := f.svc.DeleteWorkspace(ctx, &openshellv1.DeleteWorkspaceRequest{Name: "team-b"})
			return err
		}},
	}
	const (
		ok     = codes.OK
		nf     = codes.NotFound
		denied = codes.PermissionDenied
		busy   = codes.FailedPrecondition
	)
	tests := []struct {
		name    string
		p       *auth.Principal
		want    []codes.Code // in calls order
		visible []string     // ListWorkspaces
	}{
		{"local dev", apitest.LocalDev, []codes.Code{ok, ok, ok, ok, ok, busy}, nil},
		{"platform admin", apitest.OIDCRoot, []codes.Code{ok, ok, ok, ok, ok, busy}, nil},
		{"workspace admin", apitest.OIDCUser("aa"), []codes.Code{ok, ok, ok, ok, denied, denied}, []string{"team-a"}},
		{"workspace user", apitest.OIDCUser("ua"), []codes.Code{ok, ok, denied, denied, denied, denied}, []string{"team-a"}},
		{"non-member", apitest.OIDCUser("stranger"), []codes.Code{nf, denied, denied, denied, denied, denied}, []string{}},
		{"no subject", apitest.NoSubject, []codes.Code{nf, denied, denied, denied, denied, denied}, []string{}},
		{"sandbox", apitest.Sandbox(f.SandboxA), []codes.Code{nf, denied, denied, denied, denied, denied}, []string{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := apitest.As(t.Context(), tc.p)
			for i, c := range calls {
				if got := errdefs.Code(c.call(ctx)); got != tc.want[i] {
					t.Errorf("%s as %s = %v, want %v", c.name, tc.name, got, tc.want[i])
				}
			}
			if tc.visible == nil {
				return // platform admins see every workspace
			}
			resp, err := f.svc.ListWorkspaces(ctx, &openshellv1.ListWorkspacesRequest{})
			if err != nil {
				t.Fatal(err)
			}
			got := []string{}
			for _, w := range resp.GetWorkspaces() {
				got = append(got, w.GetMetadata().GetName())
			}
			if diff := cmp.Diff(tc.visible, got); diff != "" {
				t.Errorf("ListWorkspaces as %s (-want +got):\n%s", tc.name, diff)
			}
		})
	}
}

// TestDeleteWorkspaceWithProviders is the regression test for a workspace
// deleted while it still held providers: their sealed credentials stayed
// behind and a workspace created again under the same name inherited them.
// As OpenShell, providers block the delete until they are removed.
func TestDeleteWorkspaceWithProviders(t *testing.T) {
	f := newFixture(t, true)
	f.newEmpty(t)
	if _, err := f.Providers.Create(t.Context(), "empty", &datamodelv1.Provider{
		Metadata: &datamodelv1.ObjectMeta{Name: "gh"}, Type: "github", Credentials: map[string]string{"GITHUB_TOKEN": "v"},
	}); err != nil {
		t.Fatal(err)
	}
	_, err := f.svc.DeleteWorkspace(root(t), &openshellv1.DeleteWorkspaceRequest{Name: "empty"})
	apitest.WantErr(t, "DeleteWorkspace", err, codes.FailedPrecondition, `workspace "empty" still has 1 provider(s); delete them first`)
	if got := f.phase(t, "empty"); got != datamodelv1.WorkspacePhase_WORKSPACE_PHASE_ACTIVE {
		t.Errorf("phase after the refused delete = %v, want ACTIVE", got)
	}
	if _, err := f.Providers.Delete(t.Context(), "empty", "gh", func(context.Context) ([]string, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := f.svc.DeleteWorkspace(root(t), &openshellv1.DeleteWorkspaceRequest{Name: "empty"}); err != nil {
		t.Fatalf("DeleteWorkspace without providers: %v", err)
	}
}
