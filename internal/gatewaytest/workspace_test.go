package gatewaytest

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// waitPhaseIn is WaitPhase for a sandbox outside the default workspace.
func waitPhaseIn(ctx context.Context, t *testing.T, c openshellv1.OpenShellClient, ws, name string, phase openshellv1.SandboxPhase) *openshellv1.Sandbox {
	t.Helper()
	var last *openshellv1.Sandbox
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		resp, err := c.GetSandbox(ctx, &openshellv1.GetSandboxRequest{Workspace: ws, Name: name})
		if err == nil {
			last = resp.GetSandbox()
			if last.GetStatus().GetPhase() == phase {
				return last
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("sandbox %s/%s did not reach %v: last %v, err %v", ws, name, phase, last.GetStatus(), err)
		case <-tick.C:
		}
	}
}

func wantStatus(t *testing.T, what string, err error, code codes.Code, msg string) {
	t.Helper()
	if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), msg) {
		t.Fatalf("%s: error = %v, want %v containing %q", what, err, code, msg)
	}
}

func TestWorkspaceLifecycle(t *testing.T) {
	g := Start(t, Options{})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	// The default workspace exists from the start and cannot be deleted.
	def, err := c.GetWorkspace(ctx, &openshellv1.GetWorkspaceRequest{Name: "default"})
	if err != nil || def.GetWorkspace().GetStatus().GetPhase() != datamodelv1.WorkspacePhase_WORKSPACE_PHASE_ACTIVE {
		t.Fatalf("GetWorkspace(default) = %v, %v", def, err)
	}
	_, err = c.DeleteWorkspace(ctx, &openshellv1.DeleteWorkspaceRequest{Name: "default"})
	wantStatus(t, "DeleteWorkspace(default)", err, codes.FailedPrecondition, "cannot be deleted")

	created, err := c.CreateWorkspace(ctx, &openshellv1.CreateWorkspaceRequest{Name: "team-a", Labels: map[string]string{"team": "a"}})
	if err != nil || created.GetWorkspace().GetMetadata().GetName() != "team-a" || created.GetWorkspace().GetStatus().GetPhase() != datamodelv1.WorkspacePhase_WORKSPACE_PHASE_ACTIVE {
		t.Fatalf("CreateWorkspace(team-a) = %v, %v", created, err)
	}
	_, err = c.CreateWorkspace(ctx, &openshellv1.CreateWorkspaceRequest{Name: "team-a"})
	wantStatus(t, "CreateWorkspace(dup)", err, codes.AlreadyExists, "already exists")
	_, err = c.CreateWorkspace(ctx, &openshellv1.CreateWorkspaceRequest{Name: "Team_A"})
	wantStatus(t, "CreateWorkspace(Team_A)", err, codes.InvalidArgument, "lowercase")
	list, err := c.ListWorkspaces(ctx, &openshellv1.ListWorkspacesRequest{LabelSelector: "team=a"})
	if err != nil || len(list.GetWorkspaces()) != 1 || list.GetWorkspaces()[0].GetMetadata().GetName() != "team-a" {
		t.Fatalf("ListWorkspaces(team=a) = %v, %v", list, err)
	}

	// A sandbox in a workspace that does not exist is refused.
	_, err = c.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: "ws-x", Workspace: "nope", Spec: &openshellv1.SandboxSpec{Command: []string{"sleep", "infinity"}}})
	wantStatus(t, "CreateSandbox(nope)", err, codes.NotFound, `workspace "nope" not found`)

	// A sandbox in team-a runs and is listed there, not in default.
	if _, err := c.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: "ws-sb", Workspace: "team-a", Spec: &openshellv1.SandboxSpec{Command: []string{"sleep", "infinity"}}}); err != nil {
		t.Fatalf("CreateSandbox(team-a/ws-sb): %v", err)
	}
	sb := waitPhaseIn(ctx, t, c, "team-a", "ws-sb", openshellv1.SandboxPhase_SANDBOX_PHASE_READY)
	if sb.GetMetadata().GetWorkspace() != "team-a" {
		t.Fatalf("sandbox workspace = %q, want team-a", sb.GetMetadata().GetWorkspace())
	}
	stdout, _, code, err := Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: sb.GetMetadata().GetId(), Command: []string{"sh", "-c", "printf ok"}})
	if err != nil || stdout != "ok" || code != 0 {
		t.Fatalf("exec in team-a sandbox = %q %d %v", stdout, code, err)
	}
	_, err = c.GetSandbox(ctx, &openshellv1.GetSandboxRequest{Name: "ws-sb"})
	wantStatus(t, "GetSandbox(default/ws-sb)", err, codes.NotFound, "not found")
	inA, err := c.ListSandboxes(ctx, &openshellv1.ListSandboxesRequest{Workspace: "team-a"})
	if err != nil || len(inA.GetSandboxes()) != 1 || inA.GetSandboxes()[0].GetMetadata().GetName() != "ws-sb" {
		t.Fatalf("ListSandboxes(team-a) = %v, %v", inA, err)
	}
	inDefault, err := c.ListSandboxes(ctx, &openshellv1.ListSandboxesRequest{})
	if err != nil || len(inDefault.GetSandboxes()) != 0 {
		t.Fatalf("ListSandboxes(default) = %v, %v; want none", inDefault, err)
	}
	all, err := c.ListSandboxes(ctx, &openshellv1.ListSandboxesRequest{AllWorkspaces: true})
	if err != nil || len(all.GetSandboxes()) != 1 || all.GetSandboxes()[0].GetMetadata().GetWorkspace() != "team-a" {
		t.Fatalf("ListSandboxes(all_workspaces) = %v, %v", all, err)
	}

	// Members.
	for _, m := range []struct {
		subject string
		role    openshellv1.WorkspaceRole
	}{
		{"alice", openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER},
		{"bob", openshellv1.WorkspaceRole_WORKSPACE_ROLE_ADMIN},
		{"alice", openshellv1.WorkspaceRole_WORKSPACE_ROLE_ADMIN}, // upsert
	} {
		resp, err := c.AddWorkspaceMember(ctx, &openshellv1.AddWorkspaceMemberRequest{Workspace: "team-a", PrincipalSubject: m.subject, Role: m.role})
		if err != nil || resp.GetMember().GetPrincipalSubject() != m.subject || resp.GetMember().GetRole() != m.role {
			t.Fatalf("AddWorkspaceMember(%s, %v) = %v, %v", m.subject, m.role, resp, err)
		}
	}
	_, err = c.AddWorkspaceMember(ctx, &openshellv1.AddWorkspaceMemberRequest{Workspace: "team-a", PrincipalSubject: "carol"})
	wantStatus(t, "AddWorkspaceMember(no role)", err, codes.InvalidArgument, "role")
	members, err := c.ListWorkspaceMembers(ctx, &openshellv1.ListWorkspaceMembersRequest{Workspace: "team-a"})
	if err != nil || len(members.GetMembers()) != 2 {
		t.Fatalf("ListWorkspaceMembers = %v, %v; want alice and bob", members, err)
	}
	for _, m := range members.GetMembers() {
		if m.GetRole() != openshellv1.WorkspaceRole_WORKSPACE_ROLE_ADMIN {
			t.Fatalf("member %s role = %v, want ADMIN", m.GetPrincipalSubject(), m.GetRole())
		}
	}
	rm, err := c.RemoveWorkspaceMember(ctx, &openshellv1.RemoveWorkspaceMemberRequest{Workspace: "team-a", PrincipalSubject: "bob"})
	if err != nil || !rm.GetRemoved() {
		t.Fatalf("RemoveWorkspaceMember(bob) = %v, %v", rm, err)
	}
	members, err = c.ListWorkspaceMembers(ctx, &openshellv1.ListWorkspaceMembersRequest{Workspace: "team-a"})
	if err != nil || len(members.GetMembers()) != 1 || members.GetMembers()[0].GetPrincipalSubject() != "alice" {
		t.Fatalf("ListWorkspaceMembers after remove = %v, %v; want alice", members, err)
	}

	// Deleting a workspace with a sandbox is refused and changes nothing.
	_, err = c.DeleteWorkspace(ctx, &openshellv1.DeleteWorkspaceRequest{Name: "team-a"})
	wantStatus(t, "DeleteWorkspace(team-a with sandbox)", err, codes.FailedPrecondition, `workspace "team-a" still has 1 sandbox(es)`)
	waitPhaseIn(ctx, t, c, "team-a", "ws-sb", openshellv1.SandboxPhase_SANDBOX_PHASE_READY)

	del, err := c.DeleteSandbox(ctx, &openshellv1.DeleteSandboxRequest{Workspace: "team-a", Name: "ws-sb"})
	if err != nil || !del.GetDeleted() {
		t.Fatalf("DeleteSandbox(team-a/ws-sb) = %v, %v", del, err)
	}
	// The row goes once the backend is gone; until then the workspace is
	// still not empty.
	for {
		resp, err := c.DeleteWorkspace(ctx, &openshellv1.DeleteWorkspaceRequest{Name: "team-a"})
		if err == nil {
			if !resp.GetDeleted() {
				t.Fatalf("DeleteWorkspace(team-a) = %v", resp)
			}
			break
		}
		if status.Code(err) != codes.FailedPrecondition || ctx.Err() != nil {
			t.Fatalf("DeleteWorkspace(team-a) after sandbox delete: %v", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
	_, err = c.GetWorkspace(ctx, &openshellv1.GetWorkspaceRequest{Name: "team-a"})
	wantStatus(t, "GetWorkspace(team-a) after delete", err, codes.NotFound, `workspace "team-a" not found`)
	_, err = c.ListWorkspaceMembers(ctx, &openshellv1.ListWorkspaceMembersRequest{Workspace: "team-a"})
	wantStatus(t, "ListWorkspaceMembers(team-a) after delete", err, codes.NotFound, "not found")
	if _, err := c.GetWorkspace(ctx, &openshellv1.GetWorkspaceRequest{Name: "default"}); err != nil {
		t.Fatalf("GetWorkspace(default) at the end: %v", err)
	}
}
