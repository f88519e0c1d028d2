// Package workspaces implements the workspace and membership RPCs of
// openshell.v1.OpenShell: Create/Get/List/DeleteWorkspace (creation and
// deletion for platform admins) and Add/Remove/ListWorkspaceMembers
// (workspace admins and platform admins; listing for members).
//
// Workspaces and members are store objects; their layout and the
// membership check itself live in authz, which every domain shares.
package workspaces

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/api/authz"
	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/lifecycle"
	"github.com/openshell-go/openshell/internal/store"
)

// Options wire a Service.
type Options struct {
	Store store.Store
	// Engine releases a deleted workspace's backend scope; nil skips it.
	Engine *lifecycle.Engine
	Authz  *authz.Authorizer
	Logger *slog.Logger
}

// Service implements the workspace RPCs. It is safe for concurrent use.
type Service struct {
	o   Options
	log *slog.Logger
}

// New returns a Service.
func New(o Options) *Service {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &Service{o: o, log: o.Logger.With("component", "api/workspaces")}
}

const (
	maxWorkspaceNameLen = 63
	maxSubjectLen       = 1024
)

func newWorkspace() *datamodelv1.Workspace { return &datamodelv1.Workspace{} }

func newMember() *openshellv1.WorkspaceMember { return &openshellv1.WorkspaceMember{} }

// validateWorkspaceName checks a DNS-1123 label of at most 63 characters.
func validateWorkspaceName(name string) error {
	if name == "" {
		return errdefs.InvalidArgument("name is required")
	}
	if len(name) > maxWorkspaceNameLen {
		return errdefs.InvalidArgument(fmt.Sprintf("name exceeds maximum length (%d > %d)", len(name), maxWorkspaceNameLen))
	}
	for _, c := range name {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return errdefs.InvalidArgument("name must contain only lowercase alphanumeric characters or hyphens")
		}
	}
	if strings.HasPrefix(name, "-") || strings.HasSuffix(name, "-") {
		return errdefs.InvalidArgument("name must not start or end with a hyphen")
	}
	return nil
}

// CreateWorkspace creates an ACTIVE workspace (platform admins).
func (s *Service) CreateWorkspace(ctx context.Context, req *openshellv1.CreateWorkspaceRequest) (*openshellv1.CreateWorkspaceResponse, error) {
	if err := s.o.Authz.RequirePlatformAdmin(ctx); err != nil {
		return nil, err
	}
	name := req.GetName()
	if err := validateWorkspaceName(name); err != nil {
		return nil, err
	}
	if err := lifecycle.ValidateLabels(req.GetLabels(), "labels"); err != nil {
		return nil, err
	}
	w := &datamodelv1.Workspace{
		Metadata: &datamodelv1.ObjectMeta{Id: authz.WorkspaceID(name), Name: name, Labels: req.GetLabels()},
		Status:   &datamodelv1.WorkspaceStatus{Phase: authz.WorkspaceActive},
	}
	res, err := s.o.Store.Create(ctx, store.TypeWorkspace, w)
	if err != nil {
		if errors.Is(err, errdefs.ErrAlreadyExists) {
			return nil, errdefs.AlreadyExists(fmt.Sprintf("workspace %q already exists", name))
		}
		return nil, err
	}
	w.Metadata.ResourceVersion, w.Metadata.CreatedAtMs = res.ResourceVersion, res.CreatedAtMs
	s.log.InfoContext(ctx, "workspace created", "workspace", name)
	return &openshellv1.CreateWorkspaceResponse{Workspace: w}, nil
}

// GetWorkspace returns a workspace its caller belongs to; a workspace the
// caller may not see reads NotFound like a missing one.
func (s *Service) GetWorkspace(ctx context.Context, req *openshellv1.GetWorkspaceRequest) (*openshellv1.GetWorkspaceResponse, error) {
	name := req.GetName()
	if name == "" {
		return nil, errdefs.InvalidArgument("name is required")
	}
	if err := s.o.Authz.Workspace(ctx, name, openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER); err != nil {
		if errors.Is(err, errdefs.ErrPermissionDenied) {
			return nil, errdefs.NotFound(fmt.Sprintf("workspace %q not found", name))
		}
		return nil, err
	}
	w, err := s.o.Authz.LoadWorkspace(ctx, name)
	if err != nil {
		return nil, err
	}
	return &openshellv1.GetWorkspaceResponse{Workspace: w}, nil
}

// ListWorkspaces lists workspaces in creation order: all of them for
// platform admins, those the caller is a member of otherwise.
func (s *Service) ListWorkspaces(ctx context.Context, req *openshellv1.ListWorkspacesRequest) (*openshellv1.ListWorkspacesResponse, error) {
	if req.GetLimit() > store.MaxLimit {
		return nil, errdefs.InvalidArgument(fmt.Sprintf("limit exceeds maximum (%d > %d)", req.GetLimit(), store.MaxLimit))
	}
	if s.o.Authz.PlatformAdmin(ctx) {
		list, err := store.ListAs(ctx, s.o.Store, store.TypeWorkspace, store.ListOptions{
			AllWorkspaces: true, Limit: int(req.GetLimit()), Offset: int(req.GetOffset()), LabelSelector: req.GetLabelSelector(),
		}, newWorkspace)
		if err != nil {
			return nil, err
		}
		return &openshellv1.ListWorkspacesResponse{Workspaces: list}, nil
	}
	p, ok := auth.FromContext(ctx)
	if !ok || p.IsSandbox() || p.Subject == "" {
		return &openshellv1.ListWorkspacesResponse{}, nil
	}
	mine, err := s.memberWorkspaces(ctx, p.Subject)
	if err != nil {
		return nil, err
	}
	// Filter the caller's workspaces by the selector, then page.
	var out []*datamodelv1.Workspace
	offset, limit := int(req.GetOffset()), store.Limit(int(req.GetLimit()))
	err = s.eachObject(ctx, store.TypeWorkspace, store.ListOptions{AllWorkspaces: true, LabelSelector: req.GetLabelSelector()}, func(o store.Object) error {
		if !mine[o.Name] || len(out) >= limit {
			return nil
		}
		if offset > 0 {
			offset--
			return nil
		}
		w := newWorkspace()
		if err := store.Hydrate(o.Payload, o.ResourceVersion, w); err != nil {
			return err
		}
		out = append(out, w)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &openshellv1.ListWorkspacesResponse{Workspaces: out}, nil
}

// memberWorkspaces returns the names of the workspaces subject belongs to.
func (s *Service) memberWorkspaces(ctx context.Context, subject string) (map[string]bool, error) {
	mine := map[string]bool{}
	err := s.eachObject(ctx, store.TypeWorkspaceMember, store.ListOptions{AllWorkspaces: true}, func(o store.Object) error {
		if o.Name == subject {
			mine[o.Workspace] = true
		}
		return nil
	})
	return mine, err
}

// eachObject calls fn for every object of objType matching opts, paging
// through the store. opts.Limit and opts.Offset are ignored.
func (s *Service) eachObject(ctx context.Context, objType string, opts store.ListOptions, fn func(store.Object) error) error {
	opts.Limit, opts.Offset = store.MaxLimit, 0
	for {
		page, err := s.o.Store.List(ctx, objType, opts)
		if err != nil {
			return err
		}
		for _, o := range page {
			if err := fn(o); err != nil {
				return err
			}
		}
		if len(page) < opts.Limit {
			return nil
		}
		opts.Offset += len(page)
	}
}

// DeleteWorkspace deletes an empty workspace and its members (platform
// admins). The workspace is marked TERMINATING first, so CreateSandbox and
// AddWorkspaceMember refuse it while the sandboxes are counted and the
// members removed. Every delete is conditional on the version read: a
// member or the workspace changed meanwhile fails the call with Aborted.
// A workspace that still has sandboxes, or whose deletion failed, goes
// back to its previous phase.
func (s *Service) DeleteWorkspace(ctx context.Context, req *openshellv1.DeleteWorkspaceRequest) (*openshellv1.DeleteWorkspaceResponse, error) {
	if err := s.o.Authz.RequirePlatformAdmin(ctx); err != nil {
		return nil, err
	}
	name := req.GetName()
	if name == "" {
		return nil, errdefs.InvalidArgument("name is required")
	}
	if name == lifecycle.DefaultWorkspace {
		return nil, errdefs.FailedPrecondition(fmt.Sprintf("workspace %q cannot be deleted", name))
	}
	w, err := s.o.Authz.LoadWorkspace(ctx, name)
	if err != nil {
		return nil, err
	}
	prev := w.GetStatus().GetPhase()
	_, wr, err := s.setWorkspacePhase(ctx, name, w.GetMetadata().GetResourceVersion(), authz.WorkspaceTerminating)
	if err != nil {
		return nil, err
	}
	members, err := s.deleteTerminating(ctx, name, wr.ResourceVersion)
	if err != nil {
		if _, _, rerr := s.setWorkspacePhase(ctx, name, wr.ResourceVersion, prev); rerr != nil && !errors.Is(rerr, errdefs.ErrNotFound) {
			s.log.WarnContext(ctx, "restore workspace phase", "workspace", name, "err", rerr)
		}
		return nil, err
	}
	s.log.InfoContext(ctx, "workspace deleted", "workspace", name, "members", members)
	return &openshellv1.DeleteWorkspaceResponse{Deleted: true}, nil
}

// deleteTerminating deletes workspace name, marked TERMINATING at version
// rv, once it holds no sandboxes: its members, its backend scope, then the
// workspace itself, each delete conditional on the version read. It
// returns how many members it removed.
func (s *Service) deleteTerminating(ctx context.Context, name string, rv uint64) (int, error) {
	// Sandboxes and providers block the delete (as OpenShell): a provider
	// left behind would keep its credentials and hand them to a workspace
	// created again under the same name.
	// Its provider profiles too (as OpenShell): a workspace created again
	// under the same name would inherit them.
	for _, kind := range []struct{ objType, what string }{{store.TypeSandbox, "sandbox(es)"}, {store.TypeProvider, "provider(s)"}, {store.TypeProviderProfile, "provider profile(s)"}} {
		n, err := s.count(ctx, kind.objType, name)
		if err != nil {
			return 0, err
		}
		if n > 0 {
			return 0, errdefs.FailedPrecondition(fmt.Sprintf("workspace %q still has %d %s; delete them first", name, n, kind.what))
		}
	}
	type member struct {
		id string
		rv uint64
	}
	var members []member
	if err := s.eachObject(ctx, store.TypeWorkspaceMember, store.ListOptions{Workspace: name}, func(o store.Object) error {
		members = append(members, member{o.ID, o.ResourceVersion})
		return nil
	}); err != nil {
		return 0, err
	}
	for _, m := range members {
		err := s.o.Store.DeleteIf(ctx, store.TypeWorkspaceMember, m.id, m.rv)
		switch {
		case errors.Is(err, errdefs.ErrNotFound): // removed meanwhile
		case errors.Is(err, errdefs.ErrConflict):
			return 0, fmt.Errorf("workspace %q: a member changed while the workspace was being deleted: %w", name, err)
		case err != nil:
			return 0, err
		}
	}
	if s.o.Engine != nil {
		if err := s.o.Engine.DeleteWorkspace(ctx, name); err != nil {
			return 0, err
		}
	}
	if err := s.o.Store.DeleteIf(ctx, store.TypeWorkspace, authz.WorkspaceID(name), rv); err != nil {
		if errors.Is(err, errdefs.ErrConflict) {
			return 0, fmt.Errorf("workspace %q changed while it was being deleted: %w", name, err)
		}
		return 0, err
	}
	return len(members), nil
}

// setWorkspacePhase writes the phase of workspace name (CAS on expectedRV;
// 0 = the version read).
func (s *Service) setWorkspacePhase(ctx context.Context, name string, expectedRV uint64, phase datamodelv1.WorkspacePhase) (*datamodelv1.Workspace, store.WriteResult, error) {
	return store.UpdateCASAs(ctx, s.o.Store, store.TypeWorkspace, authz.WorkspaceID(name), expectedRV, newWorkspace, func(w *datamodelv1.Workspace) error {
		if w.Status == nil {
			w.Status = &datamodelv1.WorkspaceStatus{}
		}
		w.Status.Phase = phase
		return nil
	})
}

// count counts the objType records of workspace ws.
func (s *Service) count(ctx context.Context, objType, ws string) (int, error) {
	n := 0
	err := s.eachObject(ctx, objType, store.ListOptions{Workspace: ws}, func(store.Object) error {
		n++
		return nil
	})
	return n, err
}

// AddWorkspaceMember adds subject to a workspace, or changes the role of
// an existing member (workspace admins and platform admins). A workspace
// being deleted is refused (FailedPrecondition).
func (s *Service) AddWorkspaceMember(ctx context.Context, req *openshellv1.AddWorkspaceMemberRequest) (*openshellv1.AddWorkspaceMemberResponse, error) {
	ws, subject, role := req.GetWorkspace(), req.GetPrincipalSubject(), req.GetRole()
	if err := validateMemberRequest(ws, subject); err != nil {
		return nil, err
	}
	if role != openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER && role != openshellv1.WorkspaceRole_WORKSPACE_ROLE_ADMIN {
		return nil, errdefs.InvalidArgument("role must be WORKSPACE_ROLE_USER or WORKSPACE_ROLE_ADMIN")
	}
	if err := s.o.Authz.Workspace(ctx, ws, openshellv1.WorkspaceRole_WORKSPACE_ROLE_ADMIN); err != nil {
		return nil, err
	}
	if err := s.workspaceActive(ctx, ws); err != nil {
		return nil, err
	}
	// Upsert: update an existing membership, else create one; a racing
	// create turns into an update on the second attempt.
	for attempt := 0; ; attempt++ {
		m, created, err := s.upsertMember(ctx, ws, subject, role)
		if err == nil {
			if created {
				err = s.keepMember(ctx, ws, m)
			}
			if err != nil {
				return nil, err
			}
			return &openshellv1.AddWorkspaceMemberResponse{Member: m}, nil
		}
		if attempt > 0 || !errors.Is(err, errdefs.ErrAlreadyExists) && !errors.Is(err, errdefs.ErrConflict) && !errors.Is(err, errdefs.ErrNotFound) {
			return nil, err
		}
	}
}

// workspaceActive reads workspace ws and refuses one being deleted.
func (s *Service) workspaceActive(ctx context.Context, ws string) error {
	w, err := s.o.Authz.LoadWorkspace(ctx, ws)
	if err != nil {
		return err
	}
	if w.GetStatus().GetPhase() == authz.WorkspaceTerminating {
		return errdefs.FailedPrecondition(fmt.Sprintf("workspace %q is being deleted", ws))
	}
	return nil
}

// keepMember checks, after member m was created, that its workspace is
// still there and not being deleted. A DeleteWorkspace that listed the
// members just before m was written would leave m behind; either it sees
// m, or this check sees the deletion and removes m again.
func (s *Service) keepMember(ctx context.Context, ws string, m *openshellv1.WorkspaceMember) error {
	err := s.workspaceActive(ctx, ws)
	if err == nil {
		return nil
	}
	derr := s.o.Store.DeleteIf(ctx, store.TypeWorkspaceMember, m.GetMetadata().GetId(), m.GetMetadata().GetResourceVersion())
	if derr != nil && !errors.Is(derr, errdefs.ErrNotFound) {
		s.log.WarnContext(ctx, "remove member added to a workspace being deleted", "workspace", ws, "subject", m.GetPrincipalSubject(), "err", derr)
	}
	return err
}

// upsertMember sets the role of subject in ws; created reports a new
// membership.
func (s *Service) upsertMember(ctx context.Context, ws, subject string, role openshellv1.WorkspaceRole) (m *openshellv1.WorkspaceMember, created bool, err error) {
	cur, err := s.o.Authz.Member(ctx, ws, subject)
	switch {
	case err == nil:
		if cur.GetRole() == role {
			return cur, false, nil
		}
		m, _, err := store.UpdateCASAs(ctx, s.o.Store, store.TypeWorkspaceMember, cur.GetMetadata().GetId(), cur.GetMetadata().GetResourceVersion(), newMember, func(m *openshellv1.WorkspaceMember) error {
			m.Role = role
			return nil
		})
		return m, false, err
	case !errors.Is(err, errdefs.ErrNotFound):
		return nil, false, err
	}
	m = &openshellv1.WorkspaceMember{
		Metadata:         &datamodelv1.ObjectMeta{Name: subject, Workspace: ws},
		PrincipalSubject: subject,
		Role:             role,
	}
	res, err := s.o.Store.Create(ctx, store.TypeWorkspaceMember, m)
	if err != nil {
		return nil, false, err
	}
	m.Metadata.ResourceVersion, m.Metadata.CreatedAtMs = res.ResourceVersion, res.CreatedAtMs
	return m, true, nil
}

func validateMemberRequest(ws, subject string) error {
	if ws == "" {
		return errdefs.InvalidArgument("workspace is required")
	}
	if subject == "" {
		return errdefs.InvalidArgument("principal_subject is required")
	}
	if len(subject) > maxSubjectLen {
		return errdefs.InvalidArgument(fmt.Sprintf("principal_subject exceeds maximum length (%d > %d)", len(subject), maxSubjectLen))
	}
	return nil
}

// RemoveWorkspaceMember removes subject from a workspace (workspace admins
// and platform admins). Removing a non-member reports removed=false; a
// membership changed concurrently is Aborted.
func (s *Service) RemoveWorkspaceMember(ctx context.Context, req *openshellv1.RemoveWorkspaceMemberRequest) (*openshellv1.RemoveWorkspaceMemberResponse, error) {
	ws, subject := req.GetWorkspace(), req.GetPrincipalSubject()
	if err := validateMemberRequest(ws, subject); err != nil {
		return nil, err
	}
	if err := s.o.Authz.Workspace(ctx, ws, openshellv1.WorkspaceRole_WORKSPACE_ROLE_ADMIN); err != nil {
		return nil, err
	}
	if _, err := s.o.Authz.LoadWorkspace(ctx, ws); err != nil {
		return nil, err
	}
	m, err := s.o.Authz.Member(ctx, ws, subject)
	if errors.Is(err, errdefs.ErrNotFound) {
		return &openshellv1.RemoveWorkspaceMemberResponse{Removed: false}, nil
	}
	if err != nil {
		return nil, err
	}
	// Conditional on the membership read: a role changed meanwhile is
	// Aborted rather than silently removed.
	err = s.o.Store.DeleteIf(ctx, store.TypeWorkspaceMember, m.GetMetadata().GetId(), m.GetMetadata().GetResourceVersion())
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		return &openshellv1.RemoveWorkspaceMemberResponse{Removed: false}, nil
	case err != nil:
		return nil, err
	}
	return &openshellv1.RemoveWorkspaceMemberResponse{Removed: true}, nil
}

// ListWorkspaceMembers lists the members of a workspace in the order they
// were added (members of the workspace and platform admins).
func (s *Service) ListWorkspaceMembers(ctx context.Context, req *openshellv1.ListWorkspaceMembersRequest) (*openshellv1.ListWorkspaceMembersResponse, error) {
	ws := req.GetWorkspace()
	if ws == "" {
		return nil, errdefs.InvalidArgument("workspace is required")
	}
	if req.GetLimit() > store.MaxLimit {
		return nil, errdefs.InvalidArgument(fmt.Sprintf("limit exceeds maximum (%d > %d)", req.GetLimit(), store.MaxLimit))
	}
	if err := s.o.Authz.Workspace(ctx, ws, openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER); err != nil {
		return nil, err
	}
	if _, err := s.o.Authz.LoadWorkspace(ctx, ws); err != nil {
		return nil, err
	}
	list, err := store.ListAs(ctx, s.o.Store, store.TypeWorkspaceMember, store.ListOptions{
		Workspace: ws, Limit: int(req.GetLimit()), Offset: int(req.GetOffset()),
	}, newMember)
	if err != nil {
		return nil, err
	}
	return &openshellv1.ListWorkspaceMembersResponse{Members: list}, nil
}
