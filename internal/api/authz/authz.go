// Package authz holds the authorization checks shared by the API domain
// packages under internal/api: the sandbox-principal scope (a sandbox
// acts only for itself) and workspace membership (a user acts only in the
// workspaces it belongs to, with a sufficient role).
//
// The per-RPC rule from the proto's authorization option (mode, scope,
// role) is applied by the server's interceptors before a handler runs;
// the checks here need the request body and run inside the handlers.
// It is the only package the domain packages share.
//
// An Authorizer is safe for concurrent use. Its methods return errdefs
// errors; refusals never reveal whether the workspace or sandbox exists.
package authz

import (
	"context"
	"errors"
	"fmt"
	"slices"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/lifecycle"
	"github.com/openshell-go/openshell/internal/store"
)

// Workspaces are stored as store.TypeWorkspace objects with an empty
// workspace column and id "workspace-<name>" (the gateway creates
// "workspace-default" at start). Members are store.TypeWorkspaceMember
// objects in their workspace, named by principal subject, so a subject
// holds at most one membership per workspace.

// Workspace phases.
const (
	WorkspaceActive      = datamodelv1.WorkspacePhase_WORKSPACE_PHASE_ACTIVE
	WorkspaceTerminating = datamodelv1.WorkspacePhase_WORKSPACE_PHASE_TERMINATING
)

// WorkspaceID is the object id of workspace name.
func WorkspaceID(name string) string { return "workspace-" + name }

// SandboxGetter loads sandboxes by id (lifecycle.Engine).
type SandboxGetter interface {
	GetByID(ctx context.Context, id string) (*openshellv1.Sandbox, error)
}

// Options configure an Authorizer.
type Options struct {
	// Store holds workspaces and members; nil (unit tests of other
	// checks) means no workspace exists besides "default" and nobody is
	// a member of anything.
	Store store.Store
	// Sandboxes loads sandboxes for SandboxForCaller.
	Sandboxes SandboxGetter
	// OIDC turns workspace membership checks on; AdminRole is the role
	// that makes a principal a platform admin (membership bypassed; an
	// empty AdminRole bypasses for everyone, as upstream).
	OIDC      bool
	AdminRole string
}

// Authorizer answers "may the caller in ctx do this?".
type Authorizer struct{ o Options }

// New returns an Authorizer.
func New(o Options) *Authorizer { return &Authorizer{o: o} }

// ErrCrossSandbox is the refusal when a sandbox principal names another
// sandbox.
var ErrCrossSandbox = errdefs.PermissionDenied("cross-sandbox access denied: principal does not own this sandbox")

// EnsureSandboxScope refuses a sandbox principal acting for another
// sandbox. User principals pass (their workspace is checked separately).
func EnsureSandboxScope(ctx context.Context, sandboxID string) error {
	p, ok := auth.FromContext(ctx)
	if !ok || !p.IsSandbox() {
		return nil
	}
	if p.SandboxID != sandboxID {
		return ErrCrossSandbox
	}
	return nil
}

// RequireSandboxPrincipal returns the caller's sandbox id for
// sandbox-only RPCs.
func RequireSandboxPrincipal(ctx context.Context) (string, error) {
	p, ok := auth.FromContext(ctx)
	if !ok || !p.IsSandbox() {
		return "", errdefs.PermissionDenied("this method requires a sandbox principal")
	}
	return p.SandboxID, nil
}

// RequireOwnSandbox is the check of sandbox-only RPCs naming a sandbox:
// the caller must be a sandbox principal (PermissionDenied otherwise) and
// the id its own (ErrCrossSandbox).
func RequireOwnSandbox(ctx context.Context, sandboxID string) error {
	id, err := RequireSandboxPrincipal(ctx)
	if err != nil {
		return err
	}
	if sandboxID == "" {
		return errdefs.InvalidArgument("sandbox_id is required")
	}
	if id != sandboxID {
		return ErrCrossSandbox
	}
	return nil
}

// SandboxForCaller loads a sandbox by id for a user who may see it or for
// its own supervisor; "missing" and "not yours" both read NotFound, a
// sandbox principal naming another sandbox is ErrCrossSandbox.
func (a *Authorizer) SandboxForCaller(ctx context.Context, id string) (*openshellv1.Sandbox, error) {
	if id == "" {
		return nil, errdefs.InvalidArgument("sandbox_id is required")
	}
	if err := EnsureSandboxScope(ctx, id); err != nil {
		return nil, err
	}
	sb, err := a.o.Sandboxes.GetByID(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := a.SandboxRecord(ctx, sb); err != nil {
		return nil, err
	}
	return sb, nil
}

// Workspace membership: once the per-RPC rule (role, scope) has passed in
// the server's authorizer, RPCs that name a workspace also need the caller
// to belong to it. Bypassed for the local-dev user, gateways without OIDC
// (single-user, as upstream: an empty admin role bypasses) and platform
// admins. Sandbox principals act in no workspace: they reach only their own
// sandbox (SandboxForCaller), and the server's authorizer already keeps
// them off user RPCs; the refusal here is the second line.

// roleName is the wire name of a workspace role in error texts.
func roleName(r openshellv1.WorkspaceRole) string {
	if r == openshellv1.WorkspaceRole_WORKSPACE_ROLE_ADMIN {
		return "admin"
	}
	return "user"
}

// membershipBypassed reports whether p skips the membership check.
func (a *Authorizer) membershipBypassed(p *auth.Principal) bool {
	if !a.o.OIDC || a.o.AdminRole == "" {
		return true
	}
	if p.Source == auth.SourceLocalDev {
		return true
	}
	return slices.Contains(p.Roles, a.o.AdminRole)
}

// PlatformAdmin reports whether the caller is a platform admin: the
// local-dev user, any user principal on a gateway without OIDC, or a
// principal holding the configured admin role. Sandbox principals never
// are.
func (a *Authorizer) PlatformAdmin(ctx context.Context) bool {
	p, ok := auth.FromContext(ctx)
	if !ok || p.IsSandbox() {
		return false
	}
	return a.membershipBypassed(p)
}

// RequirePlatformAdmin refuses callers that are not platform admins.
func (a *Authorizer) RequirePlatformAdmin(ctx context.Context) error {
	if a.PlatformAdmin(ctx) {
		return nil
	}
	return errdefs.PermissionDenied(fmt.Sprintf("role '%s' required", a.o.AdminRole))
}

// Workspace checks that the caller may act in workspace with at least
// role need. A missing workspace, a missing membership and an
// insufficient role all read PermissionDenied "workspace '<ws>' requires
// role '<role>'", so the answer does not reveal which workspaces exist.
// Store failures are returned as they are.
func (a *Authorizer) Workspace(ctx context.Context, workspace string, need openshellv1.WorkspaceRole) error {
	ws := lifecycle.NormalizeWorkspace(workspace)
	p, ok := auth.FromContext(ctx)
	if !ok {
		if !a.o.OIDC {
			return nil
		}
		return errdefs.Unauthenticated("missing authorization header")
	}
	denied := errdefs.PermissionDenied(fmt.Sprintf("workspace '%s' requires role '%s'", ws, roleName(need)))
	if p.IsSandbox() {
		return denied
	}
	if a.membershipBypassed(p) {
		return nil
	}
	if p.Subject == "" {
		return denied
	}
	m, err := a.Member(ctx, ws, p.Subject)
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

// Sandbox is Workspace for RPCs naming one sandbox: refusal reads exactly
// like a missing sandbox.
func (a *Authorizer) Sandbox(ctx context.Context, workspace, name string, need openshellv1.WorkspaceRole) error {
	err := a.Workspace(ctx, workspace, need)
	if errors.Is(err, errdefs.ErrPermissionDenied) {
		return errdefs.NotFound(fmt.Sprintf("sandbox %q not found in workspace %q", name, lifecycle.NormalizeWorkspace(workspace)))
	}
	return err
}

// SandboxRecord checks a sandbox already loaded by id: a sandbox
// principal may see only itself (ErrCrossSandbox), a user needs
// membership of its workspace; that refusal reads NotFound like a missing
// sandbox.
func (a *Authorizer) SandboxRecord(ctx context.Context, sb *openshellv1.Sandbox) error {
	if p, ok := auth.FromContext(ctx); ok && p.IsSandbox() {
		if p.SandboxID != sb.GetMetadata().GetId() {
			return ErrCrossSandbox
		}
		return nil
	}
	err := a.Workspace(ctx, sb.GetMetadata().GetWorkspace(), openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER)
	if errors.Is(err, errdefs.ErrPermissionDenied) {
		return errdefs.NotFound("sandbox not found")
	}
	return err
}

// Create checks membership for creating in workspace, then that the
// workspace exists and accepts new sandboxes.
func (a *Authorizer) Create(ctx context.Context, workspace string, need openshellv1.WorkspaceRole) error {
	if err := a.Workspace(ctx, workspace, need); err != nil {
		return err
	}
	return a.WorkspaceAcceptsSandboxes(ctx, workspace)
}

// WorkspaceAcceptsSandboxes: the workspace exists and is not being
// deleted. "default" always exists. Without a store there is nothing to
// check.
func (a *Authorizer) WorkspaceAcceptsSandboxes(ctx context.Context, workspace string) error {
	ws := lifecycle.NormalizeWorkspace(workspace)
	if a.o.Store == nil {
		return nil
	}
	w, err := a.LoadWorkspace(ctx, ws)
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		if ws == lifecycle.DefaultWorkspace {
			return nil
		}
		return err
	case err != nil:
		return err
	}
	if w.GetStatus().GetPhase() == WorkspaceTerminating {
		return errdefs.FailedPrecondition(fmt.Sprintf("workspace %q is being deleted", ws))
	}
	return nil
}

// LoadWorkspace reads workspace name; NotFound `workspace "<name>" not
// found`.
func (a *Authorizer) LoadWorkspace(ctx context.Context, name string) (*datamodelv1.Workspace, error) {
	if a.o.Store == nil {
		return nil, errdefs.NotFound(fmt.Sprintf("workspace %q not found", name))
	}
	w, err := store.GetAs(ctx, a.o.Store, store.TypeWorkspace, WorkspaceID(name), func() *datamodelv1.Workspace { return &datamodelv1.Workspace{} })
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil, errdefs.NotFound(fmt.Sprintf("workspace %q not found", name))
	}
	return w, err
}

// Member reads the membership of subject in workspace ws.
func (a *Authorizer) Member(ctx context.Context, ws, subject string) (*openshellv1.WorkspaceMember, error) {
	if a.o.Store == nil {
		return nil, errdefs.NotFound("workspace member not found")
	}
	m := &openshellv1.WorkspaceMember{}
	if err := a.o.Store.GetByName(ctx, store.TypeWorkspaceMember, ws, subject, m); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil, errdefs.NotFound(fmt.Sprintf("member %q not found in workspace %q", subject, ws))
		}
		return nil, err
	}
	return m, nil
}
