package sandboxapi

import (
	"context"
	"errors"
	"fmt"
	"slices"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/lifecycle"
	"github.com/openshell-go/openshell/internal/store"
)

// Workspace membership: once the per-RPC rule (role, scope) has passed in
// the server's authorizer, RPCs that name a workspace also need the caller
// to belong to it. Bypassed for sandbox principals (scoped by sandbox id
// elsewhere), the local-dev user, gateways without OIDC (single-user, as
// upstream: an empty admin role bypasses) and platform admins.

// roleName is the wire name of a workspace role in error texts.
func roleName(r openshellv1.WorkspaceRole) string {
	if r == openshellv1.WorkspaceRole_WORKSPACE_ROLE_ADMIN {
		return "admin"
	}
	return "user"
}

// membershipBypassed reports whether p skips the membership check.
func (s *Service) membershipBypassed(p *auth.Principal) bool {
	if !s.o.OIDC || s.o.AdminRole == "" {
		return true
	}
	if p.IsSandbox() || p.Source == auth.SourceLocalDev {
		return true
	}
	return slices.Contains(p.Roles, s.o.AdminRole)
}

// platformAdmin reports whether the caller is a platform admin: the
// local-dev user, any user principal on a gateway without OIDC, or a
// principal holding the configured admin role. Sandbox principals never
// are.
func (s *Service) platformAdmin(ctx context.Context) bool {
	p, ok := auth.FromContext(ctx)
	if !ok || p.IsSandbox() {
		return false
	}
	return s.membershipBypassed(p)
}

// requirePlatformAdmin refuses callers that are not platform admins.
func (s *Service) requirePlatformAdmin(ctx context.Context) error {
	if s.platformAdmin(ctx) {
		return nil
	}
	return errdefs.PermissionDenied(fmt.Sprintf("role '%s' required", s.o.AdminRole))
}

// authorizeWorkspace checks that the caller may act in workspace with at
// least role need. A missing workspace, a missing membership and an
// insufficient role all read PermissionDenied "workspace '<ws>' requires
// role '<role>'", so the answer does not reveal which workspaces exist.
// Store failures are returned as they are.
func (s *Service) authorizeWorkspace(ctx context.Context, workspace string, need openshellv1.WorkspaceRole) error {
	ws := lifecycle.NormalizeWorkspace(workspace)
	p, ok := auth.FromContext(ctx)
	if !ok {
		if !s.o.OIDC {
			return nil
		}
		return errdefs.Unauthenticated("missing authorization header")
	}
	if s.membershipBypassed(p) {
		return nil
	}
	denied := errdefs.PermissionDenied(fmt.Sprintf("workspace '%s' requires role '%s'", ws, roleName(need)))
	if p.Subject == "" {
		return denied
	}
	m, err := s.member(ctx, ws, p.Subject)
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		return denied
	case err != nil:
		return err
	case m.GetRole() < need:
		return denied
	}
	return nil
}

// authorizeSandbox is authorizeWorkspace for RPCs naming one sandbox:
// refusal reads exactly like a missing sandbox.
func (s *Service) authorizeSandbox(ctx context.Context, workspace, name string, need openshellv1.WorkspaceRole) error {
	err := s.authorizeWorkspace(ctx, workspace, need)
	if errors.Is(err, errdefs.ErrPermissionDenied) {
		return errdefs.NotFound(fmt.Sprintf("sandbox %q not found in workspace %q", name, lifecycle.NormalizeWorkspace(workspace)))
	}
	return err
}

// authorizeSandboxRecord checks a sandbox already loaded by id; refusal
// reads NotFound like a missing sandbox.
func (s *Service) authorizeSandboxRecord(ctx context.Context, sb *openshellv1.Sandbox) error {
	err := s.authorizeWorkspace(ctx, sb.GetMetadata().GetWorkspace(), openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER)
	if errors.Is(err, errdefs.ErrPermissionDenied) {
		return errdefs.NotFound("sandbox not found")
	}
	return err
}

// authorizeCreate checks membership for creating in workspace, then that
// the workspace exists and accepts new sandboxes.
func (s *Service) authorizeCreate(ctx context.Context, workspace string, need openshellv1.WorkspaceRole) error {
	if err := s.authorizeWorkspace(ctx, workspace, need); err != nil {
		return err
	}
	return s.workspaceAcceptsSandboxes(ctx, workspace)
}

// workspaceAcceptsSandboxes: the workspace exists and is not being
// deleted. "default" always exists. Without a store (unit tests of other
// RPCs) there is nothing to check.
func (s *Service) workspaceAcceptsSandboxes(ctx context.Context, workspace string) error {
	ws := lifecycle.NormalizeWorkspace(workspace)
	if s.o.Store == nil {
		return nil
	}
	w, err := s.workspace(ctx, ws)
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		if ws == lifecycle.DefaultWorkspace {
			return nil
		}
		return err
	case err != nil:
		return err
	}
	if w.GetStatus().GetPhase() == workspaceTerminating {
		return errdefs.FailedPrecondition(fmt.Sprintf("workspace %q is being deleted", ws))
	}
	return nil
}

// member reads the membership of subject in workspace ws.
func (s *Service) member(ctx context.Context, ws, subject string) (*openshellv1.WorkspaceMember, error) {
	if s.o.Store == nil {
		return nil, errdefs.NotFound("workspace member not found")
	}
	m := &openshellv1.WorkspaceMember{}
	if err := s.o.Store.GetByName(ctx, store.TypeWorkspaceMember, ws, subject, m); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil, errdefs.NotFound(fmt.Sprintf("member %q not found in workspace %q", subject, ws))
		}
		return nil, err
	}
	return m, nil
}
