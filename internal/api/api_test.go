package api

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/api/apitest"
	"github.com/openshell-go/openshell/internal/api/authz"
	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/store"
)

const adminRole = apitest.AdminRole

// newTestService returns a Service over a real SQLite store holding the
// default workspace, as the gateway creates it at start.
func newTestService(t *testing.T, oidc bool) (*Service, store.Store) {
	t.Helper()
	env := apitest.NewEnv(t)
	s := New(Options{Engine: env.Engine, Store: env.Store, OIDC: oidc, AdminRole: adminRole})
	t.Cleanup(s.Close)
	return s, env.Store
}

var (
	as       = apitest.As
	wantErr  = apitest.WantErr
	localDev = apitest.LocalDev
	mtlsUser = apitest.MTLSUser
	oidcRoot = apitest.OIDCRoot
	oidcUser = apitest.OIDCUser
)

func mustCreateWorkspace(t *testing.T, s *Service, ctx context.Context, name string, labels map[string]string) *datamodelv1.Workspace {
	t.Helper()
	resp, err := s.CreateWorkspace(ctx, &openshellv1.CreateWorkspaceRequest{Name: name, Labels: labels})
	if err != nil {
		t.Fatalf("CreateWorkspace(%s): %v", name, err)
	}
	return resp.GetWorkspace()
}

func TestCreateGetWorkspace(t *testing.T) {
	s, _ := newTestService(t, false)
	ctx := as(t.Context(), localDev)
	w := mustCreateWorkspace(t, s, ctx, "team-a", map[string]string{"tier": "gold"})
	if w.GetMetadata().GetId() != "workspace-team-a" || w.GetMetadata().GetName() != "team-a" ||
		w.GetStatus().GetPhase() != datamodelv1.WorkspacePhase_WORKSPACE_PHASE_ACTIVE || w.GetMetadata().GetResourceVersion() == 0 || w.GetMetadata().GetCreatedAtMs() == 0 {
		t.Fatalf("CreateWorkspace = %v", w)
	}
	got, err := s.GetWorkspace(ctx, &openshellv1.GetWorkspaceRequest{Name: "team-a"})
	if err != nil {
		t.Fatalf("GetWorkspace: %v", err)
	}
	if diff := cmp.Diff(map[string]string{"tier": "gold"}, got.GetWorkspace().GetMetadata().GetLabels()); diff != "" || got.GetWorkspace().GetStatus().GetPhase() != datamodelv1.WorkspacePhase_WORKSPACE_PHASE_ACTIVE {
		t.Fatalf("GetWorkspace = %v (labels -want +got %s)", got, diff)
	}
	if _, err := s.GetWorkspace(ctx, &openshellv1.GetWorkspaceRequest{Name: "default"}); err != nil {
		t.Fatalf("GetWorkspace(default): %v", err)
	}
	_, err = s.GetWorkspace(ctx, &openshellv1.GetWorkspaceRequest{Name: "nope"})
	wantErr(t, "GetWorkspace(nope)", err, codes.NotFound, `workspace "nope" not found`)
	_, err = s.GetWorkspace(ctx, &openshellv1.GetWorkspaceRequest{})
	wantErr(t, "GetWorkspace(\"\")", err, codes.InvalidArgument, "name is required")

	_, err = s.CreateWorkspace(ctx, &openshellv1.CreateWorkspaceRequest{Name: "team-a"})
	wantErr(t, "CreateWorkspace(dup)", err, codes.AlreadyExists, `workspace "team-a" already exists`)

	bad := []struct {
		name   string
		req    *openshellv1.CreateWorkspaceRequest
		substr string
	}{
		{"empty", &openshellv1.CreateWorkspaceRequest{}, "name is required"},
		{"upper", &openshellv1.CreateWorkspaceRequest{Name: "Team"}, "lowercase alphanumeric"},
		{"underscore", &openshellv1.CreateWorkspaceRequest{Name: "a_b"}, "lowercase alphanumeric"},
		{"leading hyphen", &openshellv1.CreateWorkspaceRequest{Name: "-a"}, "start or end with a hyphen"},
		{"trailing hyphen", &openshellv1.CreateWorkspaceRequest{Name: "a-"}, "start or end with a hyphen"},
		{"too long", &openshellv1.CreateWorkspaceRequest{Name: strings.Repeat("a", 64)}, "name exceeds maximum length (64 > 63)"},
		{"bad label key", &openshellv1.CreateWorkspaceRequest{Name: "ok", Labels: map[string]string{"bad key": "v"}}, ""},
		{"bad label value", &openshellv1.CreateWorkspaceRequest{Name: "ok", Labels: map[string]string{"k": "bad value!"}}, ""},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.CreateWorkspace(ctx, tc.req)
			wantErr(t, "CreateWorkspace", err, codes.InvalidArgument, tc.substr)
			if _, err := s.GetWorkspace(ctx, &openshellv1.GetWorkspaceRequest{Name: tc.req.GetName()}); err == nil {
				t.Fatalf("rejected workspace %q was stored", tc.req.GetName())
			}
		})
	}
	if w := mustCreateWorkspace(t, s, ctx, strings.Repeat("b", 63), nil); w.GetMetadata().GetName() != strings.Repeat("b", 63) {
		t.Fatalf("63-char workspace = %v", w)
	}
}

func names(ws []*datamodelv1.Workspace) []string {
	out := []string{}
	for _, w := range ws {
		out = append(out, w.GetMetadata().GetName())
	}
	return out
}

func TestListWorkspaces(t *testing.T) {
	s, _ := newTestService(t, false)
	ctx := as(t.Context(), localDev)
	mustCreateWorkspace(t, s, ctx, "x", map[string]string{"env": "prod"})
	mustCreateWorkspace(t, s, ctx, "y", nil)
	mustCreateWorkspace(t, s, ctx, "z", map[string]string{"env": "prod"})
	tests := []struct {
		name string
		req  *openshellv1.ListWorkspacesRequest
		want []string
	}{
		{"all", &openshellv1.ListWorkspacesRequest{}, []string{"default", "x", "y", "z"}},
		{"first page", &openshellv1.ListWorkspacesRequest{Limit: 2}, []string{"default", "x"}},
		{"second page", &openshellv1.ListWorkspacesRequest{Limit: 2, Offset: 2}, []string{"y", "z"}},
		{"past the end", &openshellv1.ListWorkspacesRequest{Offset: 10}, []string{}},
		{"selector", &openshellv1.ListWorkspacesRequest{LabelSelector: "env=prod"}, []string{"x", "z"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := s.ListWorkspaces(ctx, tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, names(resp.GetWorkspaces())); diff != "" {
				t.Errorf("ListWorkspaces(%v) (-want +got):\n%s", tc.req, diff)
			}
		})
	}
	_, err := s.ListWorkspaces(ctx, &openshellv1.ListWorkspacesRequest{Limit: store.MaxLimit + 1})
	wantErr(t, "ListWorkspaces(limit 1001)", err, codes.InvalidArgument, "limit exceeds maximum (1001 > 1000)")
}

func TestDeleteWorkspace(t *testing.T) {
	s, st := newTestService(t, false)
	ctx := as(t.Context(), localDev)
	mustCreateWorkspace(t, s, ctx, "team-a", nil)

	_, err := s.DeleteWorkspace(ctx, &openshellv1.DeleteWorkspaceRequest{Name: "default"})
	wantErr(t, "DeleteWorkspace(default)", err, codes.FailedPrecondition, `workspace "default" cannot be deleted`)
	_, err = s.DeleteWorkspace(ctx, &openshellv1.DeleteWorkspaceRequest{Name: "nope"})
	wantErr(t, "DeleteWorkspace(nope)", err, codes.NotFound, `workspace "nope" not found`)
	_, err = s.DeleteWorkspace(ctx, &openshellv1.DeleteWorkspaceRequest{})
	wantErr(t, "DeleteWorkspace(\"\")", err, codes.InvalidArgument, "name is required")

	for _, n := range []string{"one", "two"} {
		if _, err := s.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: n, Workspace: "team-a"}); err != nil {
			t.Fatalf("CreateSandbox(%s): %v", n, err)
		}
	}
	if _, err := s.AddWorkspaceMember(ctx, &openshellv1.AddWorkspaceMemberRequest{Workspace: "team-a", PrincipalSubject: "alice", Role: openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER}); err != nil {
		t.Fatal(err)
	}
	_, err = s.DeleteWorkspace(ctx, &openshellv1.DeleteWorkspaceRequest{Name: "team-a"})
	wantErr(t, "DeleteWorkspace(non-empty)", err, codes.FailedPrecondition, `workspace "team-a" still has 2 sandbox(es)`)
	// Refused: the workspace is ACTIVE again and still takes sandboxes.
	w, err := s.GetWorkspace(ctx, &openshellv1.GetWorkspaceRequest{Name: "team-a"})
	if err != nil || w.GetWorkspace().GetStatus().GetPhase() != datamodelv1.WorkspacePhase_WORKSPACE_PHASE_ACTIVE {
		t.Fatalf("GetWorkspace after refused delete = %v, %v; want ACTIVE", w, err)
	}
	for _, n := range []string{"one", "two"} {
		if _, err := s.DeleteSandbox(ctx, &openshellv1.DeleteSandboxRequest{Name: n, Workspace: "team-a"}); err != nil {
			t.Fatalf("DeleteSandbox(%s): %v", n, err)
		}
	}
	del, err := s.DeleteWorkspace(ctx, &openshellv1.DeleteWorkspaceRequest{Name: "team-a"})
	if err != nil || !del.GetDeleted() {
		t.Fatalf("DeleteWorkspace = %v, %v", del, err)
	}
	_, err = s.GetWorkspace(ctx, &openshellv1.GetWorkspaceRequest{Name: "team-a"})
	wantErr(t, "GetWorkspace after delete", err, codes.NotFound, "not found")
	members, err := st.List(t.Context(), store.TypeWorkspaceMember, store.ListOptions{AllWorkspaces: true})
	if err != nil || len(members) != 0 {
		t.Fatalf("members after workspace delete = %d, %v; want 0", len(members), err)
	}
	_, err = s.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: "three", Workspace: "team-a"})
	wantErr(t, "CreateSandbox in deleted workspace", err, codes.NotFound, `workspace "team-a" not found`)
}

func TestCreateSandboxRefusesTerminatingWorkspace(t *testing.T) {
	s, st := newTestService(t, false)
	ctx := as(t.Context(), localDev)
	mustCreateWorkspace(t, s, ctx, "team-a", nil)
	if _, _, err := store.UpdateCASAs(ctx, st, store.TypeWorkspace, authz.WorkspaceID("team-a"), 0, func() *datamodelv1.Workspace { return &datamodelv1.Workspace{} }, func(w *datamodelv1.Workspace) error {
		w.Status.Phase = authz.WorkspaceTerminating
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	_, err := s.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: "x", Workspace: "team-a"})
	wantErr(t, "CreateSandbox(terminating)", err, codes.FailedPrecondition, `workspace "team-a" is being deleted`)
	list, err := s.ListSandboxes(ctx, &openshellv1.ListSandboxesRequest{Workspace: "team-a"})
	if err != nil || len(list.GetSandboxes()) != 0 {
		t.Fatalf("ListSandboxes = %v, %v; want empty", list, err)
	}
}

// Issue 13, defect 4: a workspace deleted after CreateSandbox checked it
// but before the row went in (or marked TERMINATING in that window) does
// not end up holding the sandbox: the create is refused after its insert,
// and nothing is left behind.
func TestCreateSandboxRacingDeleteWorkspace(t *testing.T) {
	env := apitest.NewEnv(t)
	s := New(Options{Engine: env.Engine, Store: env.Store, AdminRole: adminRole})
	t.Cleanup(s.Close)
	ctx := as(t.Context(), localDev)
	for _, tt := range []struct {
		name   string
		finish bool // the workspace delete completes inside the window
		msg    string
	}{
		{"deleted", true, `workspace "team-a" was deleted`},
		{"terminating", false, `workspace "team-a" is being deleted`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			mustCreateWorkspace(t, s, ctx, "team-a", nil)
			env.Driver.ValidateFn = func(context.Context, compute.Sandbox) error {
				if tt.finish {
					_, err := s.DeleteWorkspace(ctx, &openshellv1.DeleteWorkspaceRequest{Name: "team-a"})
					return err
				}
				_, _, err := store.UpdateCASAs(ctx, env.Store, store.TypeWorkspace, authz.WorkspaceID("team-a"), 0, func() *datamodelv1.Workspace { return &datamodelv1.Workspace{} }, func(w *datamodelv1.Workspace) error {
					w.Status.Phase = authz.WorkspaceTerminating
					return nil
				})
				return err
			}
			_, err := s.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: "late", Workspace: "team-a"})
			env.Driver.ValidateFn = nil
			wantErr(t, "CreateSandbox racing DeleteWorkspace", err, codes.FailedPrecondition, tt.msg)
			rows, err := env.Store.List(t.Context(), store.TypeSandbox, store.ListOptions{Workspace: "team-a"})
			if err != nil || len(rows) != 0 {
				t.Fatalf("sandboxes in workspace team-a = %d, %v; want none", len(rows), err)
			}
			if sbs, _ := env.Driver.List(t.Context()); len(sbs) != 0 {
				t.Fatalf("workloads = %v; want none", sbs)
			}
			if !tt.finish {
				if _, err := s.DeleteWorkspace(ctx, &openshellv1.DeleteWorkspaceRequest{Name: "team-a"}); err != nil {
					t.Fatalf("DeleteWorkspace after the refused create: %v", err)
				}
			}
		})
	}
}

func TestWorkspaceMembers(t *testing.T) {
	s, _ := newTestService(t, false)
	ctx := as(t.Context(), localDev)
	mustCreateWorkspace(t, s, ctx, "team-a", nil)
	add := func(subject string, role openshellv1.WorkspaceRole) *openshellv1.WorkspaceMember {
		t.Helper()
		resp, err := s.AddWorkspaceMember(ctx, &openshellv1.AddWorkspaceMemberRequest{Workspace: "team-a", PrincipalSubject: subject, Role: role})
		if err != nil {
			t.Fatalf("AddWorkspaceMember(%s, %v): %v", subject, role, err)
		}
		return resp.GetMember()
	}
	list := func() map[string]openshellv1.WorkspaceRole {
		t.Helper()
		resp, err := s.ListWorkspaceMembers(ctx, &openshellv1.ListWorkspaceMembersRequest{Workspace: "team-a"})
		if err != nil {
			t.Fatalf("ListWorkspaceMembers: %v", err)
		}
		out := map[string]openshellv1.WorkspaceRole{}
		for _, m := range resp.GetMembers() {
			if m.GetMetadata().GetWorkspace() != "team-a" || m.GetMetadata().GetName() != m.GetPrincipalSubject() {
				t.Errorf("member metadata = %v", m.GetMetadata())
			}
			out[m.GetPrincipalSubject()] = m.GetRole()
		}
		return out
	}
	alice := add("alice", openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER)
	if alice.GetMetadata().GetId() == "" || alice.GetPrincipalSubject() != "alice" || alice.GetRole() != openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER {
		t.Fatalf("AddWorkspaceMember = %v", alice)
	}
	add("bob", openshellv1.WorkspaceRole_WORKSPACE_ROLE_ADMIN)
	// Upsert: adding alice again changes her role in place.
	alice2 := add("alice", openshellv1.WorkspaceRole_WORKSPACE_ROLE_ADMIN)
	if alice2.GetMetadata().GetId() != alice.GetMetadata().GetId() || alice2.GetRole() != openshellv1.WorkspaceRole_WORKSPACE_ROLE_ADMIN {
		t.Fatalf("upsert = %v, want id %s role ADMIN", alice2, alice.GetMetadata().GetId())
	}
	want := map[string]openshellv1.WorkspaceRole{"alice": openshellv1.WorkspaceRole_WORKSPACE_ROLE_ADMIN, "bob": openshellv1.WorkspaceRole_WORKSPACE_ROLE_ADMIN}
	if diff := cmp.Diff(want, list()); diff != "" {
		t.Fatalf("members (-want +got):\n%s", diff)
	}
	page, err := s.ListWorkspaceMembers(ctx, &openshellv1.ListWorkspaceMembersRequest{Workspace: "team-a", Limit: 1, Offset: 1})
	if err != nil || len(page.GetMembers()) != 1 || page.GetMembers()[0].GetPrincipalSubject() != "bob" {
		t.Fatalf("ListWorkspaceMembers(limit 1 offset 1) = %v, %v; want bob", page, err)
	}

	rm, err := s.RemoveWorkspaceMember(ctx, &openshellv1.RemoveWorkspaceMemberRequest{Workspace: "team-a", PrincipalSubject: "alice"})
	if err != nil || !rm.GetRemoved() {
		t.Fatalf("RemoveWorkspaceMember = %v, %v", rm, err)
	}
	rm, err = s.RemoveWorkspaceMember(ctx, &openshellv1.RemoveWorkspaceMemberRequest{Workspace: "team-a", PrincipalSubject: "alice"})
	if err != nil || rm.GetRemoved() {
		t.Fatalf("RemoveWorkspaceMember again = %v, %v; want removed=false", rm, err)
	}
	if diff := cmp.Diff(map[string]openshellv1.WorkspaceRole{"bob": openshellv1.WorkspaceRole_WORKSPACE_ROLE_ADMIN}, list()); diff != "" {
		t.Fatalf("members after remove (-want +got):\n%s", diff)
	}

	bad := []struct {
		name string
		call func() error
		code codes.Code
		msg  string
	}{
		{"add unspecified role", func() error {
			_, err := s.AddWorkspaceMember(ctx, &openshellv1.AddWorkspaceMemberRequest{Workspace: "team-a", PrincipalSubject: "carol"})
			return err
		}, codes.InvalidArgument, "role must be"},
		{"add no subject", func() error {
			_, err := s.AddWorkspaceMember(ctx, &openshellv1.AddWorkspaceMemberRequest{Workspace: "team-a", Role: openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER})
			return err
		}, codes.InvalidArgument, "principal_subject is required"},
		{"add no workspace", func() error {
			_, err := s.AddWorkspaceMember(ctx, &openshellv1.AddWorkspaceMemberRequest{PrincipalSubject: "carol", Role: openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER})
			return err
		}, codes.InvalidArgument, "workspace is required"},
		{"add missing workspace", func() error {
			_, err := s.AddWorkspaceMember(ctx, &openshellv1.AddWorkspaceMemberRequest{Workspace: "nope", PrincipalSubject: "carol", Role: openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER})
			return err
		}, codes.NotFound, `workspace "nope" not found`},
		{"remove missing workspace", func() error {
			_, err := s.RemoveWorkspaceMember(ctx, &openshellv1.RemoveWorkspaceMemberRequest{Workspace: "nope", PrincipalSubject: "carol"})
			return err
		}, codes.NotFound, `workspace "nope" not found`},
		{"list missing workspace", func() error {
			_, err := s.ListWorkspaceMembers(ctx, &openshellv1.ListWorkspaceMembersRequest{Workspace: "nope"})
			return err
		}, codes.NotFound, `workspace "nope" not found`},
		{"list limit", func() error {
			_, err := s.ListWorkspaceMembers(ctx, &openshellv1.ListWorkspaceMembersRequest{Workspace: "team-a", Limit: 1001})
			return err
		}, codes.InvalidArgument, "limit exceeds maximum"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) { wantErr(t, tc.name, tc.call(), tc.code, tc.msg) })
	}
	if _, err := s.Authz.Member(ctx, "nope", "carol"); errdefs.Code(err) != codes.NotFound {
		t.Fatalf("a rejected add left a member behind: %v", err)
	}
}

// TestMembershipMatrix runs the sandbox and workspace RPCs as each kind of
// principal against an OIDC gateway (and one without OIDC).
func TestMembershipMatrix(t *testing.T) {
	s, _ := newTestService(t, true)
	root := as(t.Context(), oidcRoot)
	mustCreateWorkspace(t, s, root, "team-a", nil)
	mustCreateWorkspace(t, s, root, "team-b", nil)
	for _, m := range []struct {
		subject string
		role    openshellv1.WorkspaceRole
	}{{"ua", openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER}, {"aa", openshellv1.WorkspaceRole_WORKSPACE_ROLE_ADMIN}} {
		if _, err := s.AddWorkspaceMember(root, &openshellv1.AddWorkspaceMemberRequest{Workspace: "team-a", PrincipalSubject: m.subject, Role: m.role}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.CreateSandbox(root, &openshellv1.CreateSandboxRequest{Name: "sb", Workspace: "team-a"}); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetSandbox(root, &openshellv1.GetSandboxRequest{Name: "sb", Workspace: "team-a"})
	if err != nil {
		t.Fatal(err)
	}
	sbID := got.GetSandbox().GetMetadata().GetId()
	noOIDC, _ := newTestService(t, false)
	mustCreateWorkspace(t, noOIDC, as(t.Context(), mtlsUser), "team-a", nil)
	r, err := noOIDC.CreateSandbox(as(t.Context(), mtlsUser), &openshellv1.CreateSandboxRequest{Name: "sb", Workspace: "team-a"})
	if err != nil {
		t.Fatal(err)
	}
	ids := map[*Service]string{s: sbID, noOIDC: r.GetSandbox().GetMetadata().GetId()}
	created := 0

	type op struct {
		name string
		call func(s *Service, ctx context.Context) error
	}
	ops := []op{
		{"GetSandbox", func(s *Service, ctx context.Context) error {
			_, err := s.GetSandbox(ctx, &openshellv1.GetSandboxRequest{Name: "sb", Workspace: "team-a"})
			return err
		}},
		{"ListSandboxes", func(s *Service, ctx context.Context) error {
			r, err := s.ListSandboxes(ctx, &openshellv1.ListSandboxesRequest{Workspace: "team-a"})
			if err == nil && len(r.GetSandboxes()) == 0 {
				return errors.New("listed no sandboxes")
			}
			return err
		}},
		{"ListAllWorkspaces", func(s *Service, ctx context.Context) error {
			_, err := s.ListSandboxes(ctx, &openshellv1.ListSandboxesRequest{AllWorkspaces: true})
			return err
		}},
		{"StopSandbox", func(s *Service, ctx context.Context) error {
			_, err := s.StopSandbox(ctx, &openshellv1.StopSandboxRequest{Name: "sb", Workspace: "team-a"})
			return err
		}},
		{"StartSandbox", func(s *Service, ctx context.Context) error {
			_, err := s.StartSandbox(ctx, &openshellv1.StartSandboxRequest{Name: "sb", Workspace: "team-a"})
			return err
		}},
		{"ListSandboxProviders", func(s *Service, ctx context.Context) error {
			_, err := s.ListSandboxProviders(ctx, &openshellv1.ListSandboxProvidersRequest{SandboxName: "sb", Workspace: "team-a"})
			return err
		}},
		{"GetSandboxLogs", func(s *Service, ctx context.Context) error {
			_, err := s.GetSandboxLogs(ctx, &openshellv1.GetSandboxLogsRequest{SandboxId: ids[s]})
			return err
		}},
		{"CreateSandbox", func(s *Service, ctx context.Context) error {
			_, err := s.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Workspace: "team-a"})
			return err
		}},
		{"CreateSandboxMissingWorkspace", func(s *Service, ctx context.Context) error {
			_, err := s.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Workspace: "nope"})
			return err
		}},
		{"GetWorkspace", func(s *Service, ctx context.Context) error {
			_, err := s.GetWorkspace(ctx, &openshellv1.GetWorkspaceRequest{Name: "team-a"})
			return err
		}},
		{"ListWorkspaceMembers", func(s *Service, ctx context.Context) error {
			_, err := s.ListWorkspaceMembers(ctx, &openshellv1.ListWorkspaceMembersRequest{Workspace: "team-a"})
			return err
		}},
		{"AddWorkspaceMember", func(s *Service, ctx context.Context) error {
			_, err := s.AddWorkspaceMember(ctx, &openshellv1.AddWorkspaceMemberRequest{Workspace: "team-a", PrincipalSubject: "zed", Role: openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER})
			return err
		}},
		{"CreateWorkspace", func(s *Service, ctx context.Context) error {
			created++
			_, err := s.CreateWorkspace(ctx, &openshellv1.CreateWorkspaceRequest{Name: fmt.Sprintf("new-%d", created)})
			return err
		}},
	}

	const (
		ok     = codes.OK
		nf     = codes.NotFound
		denied = codes.PermissionDenied
	)
	// want[principal] = codes per op, in ops order.
	tests := []struct {
		name string
		svc  *Service
		p    *auth.Principal
		want []codes.Code
		msg  map[string]string
	}{
		{"local dev", s, localDev, []codes.Code{ok, ok, ok, ok, ok, ok, ok, ok, nf, ok, ok, ok, ok}, nil},
		{"mtls without oidc", noOIDC, mtlsUser, []codes.Code{ok, ok, ok, ok, ok, ok, ok, ok, nf, ok, ok, ok, ok}, nil},
		{"oidc platform admin", s, oidcRoot, []codes.Code{ok, ok, ok, ok, ok, ok, ok, ok, nf, ok, ok, ok, ok}, nil},
		{"oidc workspace admin", s, oidcUser("aa"), []codes.Code{ok, ok, denied, ok, ok, ok, ok, ok, denied, ok, ok, ok, denied}, nil},
		{"oidc workspace user", s, oidcUser("ua"), []codes.Code{ok, ok, denied, ok, ok, ok, ok, ok, denied, ok, ok, denied, denied},
			map[string]string{"AddWorkspaceMember": "workspace 'team-a' requires role 'admin'"}},
		{"oidc non-member", s, oidcUser("stranger"), []codes.Code{nf, denied, denied, nf, nf, nf, nf, denied, denied, nf, denied, denied, denied},
			map[string]string{
				"GetSandbox":      `sandbox "sb" not found in workspace "team-a"`,
				"ListSandboxes":   "workspace 'team-a' requires role 'user'",
				"CreateSandbox":   "workspace 'team-a' requires role 'user'",
				"GetWorkspace":    `workspace "team-a" not found`,
				"GetSandboxLogs":  "sandbox not found",
				"CreateWorkspace": "role 'openshell-admin' required",
			}},
		{"oidc no subject", s, &auth.Principal{Kind: auth.KindUser, Source: auth.SourceOIDC, Roles: []string{auth.DefaultUserRole}},
			[]codes.Code{nf, denied, denied, nf, nf, nf, nf, denied, denied, nf, denied, denied, denied}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for i, o := range ops {
				err := o.call(tc.svc, as(t.Context(), tc.p))
				if got := errdefs.Code(err); got != tc.want[i] {
					t.Errorf("%s as %s: code %v (%v), want %v", o.name, tc.name, got, err, tc.want[i])
					continue
				}
				if m, ok := tc.msg[o.name]; ok && !strings.Contains(fmt.Sprint(err), m) {
					t.Errorf("%s as %s: error %v, want %q", o.name, tc.name, err, m)
				}
			}
		})
	}

	// Non-admins see only the workspaces they belong to.
	for _, c := range []struct {
		p    *auth.Principal
		want []string
	}{
		{oidcUser("ua"), []string{"team-a"}},
		{oidcUser("stranger"), []string{}},
		{oidcRoot, []string{"default", "team-a", "team-b"}},
	} {
		resp, err := s.ListWorkspaces(as(t.Context(), c.p), &openshellv1.ListWorkspacesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		got := []string{}
		for _, n := range names(resp.GetWorkspaces()) {
			if !strings.HasPrefix(n, "new-") { // made by the CreateWorkspace op
				got = append(got, n)
			}
		}
		if diff := cmp.Diff(c.want, got); diff != "" {
			t.Errorf("ListWorkspaces as %s (-want +got):\n%s", c.p.Subject, diff)
		}
	}

	// A sandbox principal is scoped by id and acts in no workspace.
	sbCtx := as(t.Context(), &auth.Principal{Kind: auth.KindSandbox, Source: auth.SourceSandboxJWT, SandboxID: sbID})
	if err := s.Authz.Workspace(sbCtx, "team-a", openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER); errdefs.Code(err) != codes.PermissionDenied {
		t.Errorf("Authz.Workspace(sandbox principal) = %v, want PermissionDenied", err)
	}
	if _, err := s.GetSandboxLogs(sbCtx, &openshellv1.GetSandboxLogsRequest{SandboxId: sbID}); err != nil {
		t.Errorf("GetSandboxLogs(own sandbox) = %v", err)
	}
	if s.Authz.PlatformAdmin(sbCtx) {
		t.Error("a sandbox principal is a platform admin")
	}
}
