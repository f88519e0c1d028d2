// Package policy implements the sandbox configuration RPCs of
// openshell.v1.OpenShell: GetSandboxConfig (the policy and settings the
// supervisor is to enforce), UpdateConfig (a new policy revision, checked
// with OpenShell's safety and live-update rules), ReportPolicyStatus
// (whether the supervisor enforces a revision), GetSandboxPolicyStatus and
// ListSandboxPolicies (the revisions and their statuses). The rules and
// the revision workflow live in internal/policy (History); this package
// adds authorization and the wire shapes.
package policy

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/api/authz"
	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/lifecycle"
	policyrules "github.com/openshell-go/openshell/internal/policy"
	"github.com/openshell-go/openshell/internal/store"
)

// Options wire a Service.
type Options struct {
	Engine *lifecycle.Engine
	Store  store.Store
	Authz  *authz.Authorizer
	Now    func() time.Time
}

// Service implements the policy RPCs. It is safe for concurrent use.
type Service struct {
	o       Options
	history policyrules.History
}

// New returns a Service.
func New(o Options) *Service {
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Service{o: o, history: policyrules.History{Store: o.Store, Now: o.Now}}
}

// GetSandboxConfig returns the sandbox's effective policy and settings.
func (s *Service) GetSandboxConfig(ctx context.Context, req *sandboxv1.GetSandboxConfigRequest) (*sandboxv1.GetSandboxConfigResponse, error) {
	sb, err := s.o.Authz.SandboxForCaller(ctx, req.GetSandboxId())
	if err != nil {
		return nil, err
	}
	resp := &sandboxv1.GetSandboxConfigResponse{Workspace: sb.GetMetadata().GetWorkspace(), PolicyValidationFailureMode: "fail_closed"}
	rev, err := s.history.Latest(ctx, sb)
	switch {
	case err == nil:
		resp.Policy, resp.Version, resp.PolicyHash = rev.GetPolicy(), rev.GetVersion(), rev.GetPolicyHash()
		resp.PolicySource = sandboxv1.PolicySource_POLICY_SOURCE_SANDBOX
	case errors.Is(err, errdefs.ErrNotFound):
		// No policy: the supervisor seeds one with UpdateConfig.
	default:
		return nil, err
	}
	return resp, nil
}

// UpdateConfig stores a new policy revision for a sandbox. Settings keys
// are not supported yet.
func (s *Service) UpdateConfig(ctx context.Context, req *openshellv1.UpdateConfigRequest) (*openshellv1.UpdateConfigResponse, error) {
	if req.GetGlobal() || req.GetSettingKey() != "" || len(req.GetMergeOperations()) > 0 {
		return nil, errdefs.Unimplemented("only sandbox policy replacement is supported by this gateway")
	}
	if req.GetPolicy() == nil {
		return nil, errdefs.InvalidArgument("policy is required")
	}
	if size := proto.Size(req.GetPolicy()); size > 256<<10 {
		return nil, errdefs.InvalidArgument(fmt.Sprintf("policy serialized size exceeds maximum (%d > %d)", size, 256<<10))
	}
	var sb *openshellv1.Sandbox
	var err error
	if p, ok := auth.FromContext(ctx); ok && p.IsSandbox() {
		sb, err = s.o.Engine.GetByID(ctx, p.SandboxID)
		if err == nil && req.GetName() != "" && req.GetName() != sb.GetMetadata().GetName() && req.GetName() != sb.GetMetadata().GetId() {
			return nil, authz.ErrCrossSandbox
		}
	} else {
		if err = s.o.Authz.Sandbox(ctx, req.GetWorkspace(), req.GetName(), openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER); err == nil {
			sb, err = s.o.Engine.Get(ctx, req.GetWorkspace(), req.GetName())
		}
	}
	if err != nil {
		return nil, err
	}
	rev, err := s.history.Update(ctx, sb, req.GetPolicy())
	if err != nil {
		return nil, err
	}
	return &openshellv1.UpdateConfigResponse{Version: rev.GetVersion(), PolicyHash: rev.GetPolicyHash()}, nil
}

// ReportPolicyStatus records whether the supervisor (of its own sandbox
// only) enforces a policy revision: LOADED (the sandbox's current_policy_version becomes that
// version) or FAILED with the reason.
func (s *Service) ReportPolicyStatus(ctx context.Context, req *openshellv1.ReportPolicyStatusRequest) (*openshellv1.ReportPolicyStatusResponse, error) {
	if err := authz.RequireOwnSandbox(ctx, req.GetSandboxId()); err != nil {
		return nil, err
	}
	if err := s.history.Report(ctx, req.GetSandboxId(), req.GetVersion(), req.GetStatus(), req.GetLoadError()); err != nil {
		return nil, err
	}
	if req.GetStatus() == openshellv1.PolicyStatus_POLICY_STATUS_LOADED {
		if err := s.o.Engine.SetCurrentPolicyVersion(ctx, req.GetSandboxId(), req.GetVersion()); err != nil {
			return nil, err
		}
	}
	return &openshellv1.ReportPolicyStatusResponse{}, nil
}

// sandboxByName loads the sandbox a policy-status request names, with
// the caller's workspace membership checked (a refusal reads NotFound).
func (s *Service) sandboxByName(ctx context.Context, global bool, workspace, name string) (*openshellv1.Sandbox, error) {
	if global {
		return nil, errdefs.Unimplemented("global policies are not supported by this gateway")
	}
	if name == "" {
		return nil, errdefs.InvalidArgument("name is required")
	}
	if err := s.o.Authz.Sandbox(ctx, workspace, name, openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER); err != nil {
		return nil, err
	}
	return s.o.Engine.Get(ctx, workspace, name)
}

// GetSandboxPolicyStatus returns one revision of a sandbox's policy (the
// newest when version is 0) with the version its supervisor last loaded.
func (s *Service) GetSandboxPolicyStatus(ctx context.Context, req *openshellv1.GetSandboxPolicyStatusRequest) (*openshellv1.GetSandboxPolicyStatusResponse, error) {
	sb, err := s.sandboxByName(ctx, req.GetGlobal(), req.GetWorkspace(), req.GetName())
	if err != nil {
		return nil, err
	}
	rev, err := s.history.Get(ctx, sb.GetMetadata().GetId(), req.GetVersion())
	if err != nil {
		return nil, err
	}
	return &openshellv1.GetSandboxPolicyStatusResponse{Revision: rev, ActiveVersion: sb.GetStatus().GetCurrentPolicyVersion()}, nil
}

// Paging of ListSandboxPolicies, as OpenShell: 50 by default.
const (
	defaultPolicyPage = 50
	maxPolicyPage     = store.MaxLimit
)

// ListSandboxPolicies returns a sandbox's policy revisions, newest first,
// without their policy bodies.
func (s *Service) ListSandboxPolicies(ctx context.Context, req *openshellv1.ListSandboxPoliciesRequest) (*openshellv1.ListSandboxPoliciesResponse, error) {
	sb, err := s.sandboxByName(ctx, req.GetGlobal(), req.GetWorkspace(), req.GetName())
	if err != nil {
		return nil, err
	}
	limit := int(min(req.GetLimit(), maxPolicyPage))
	if limit == 0 {
		limit = defaultPolicyPage
	}
	revs, err := s.history.List(ctx, sb.GetMetadata().GetId(), limit, int(req.GetOffset()))
	if err != nil {
		return nil, err
	}
	for _, r := range revs {
		r.Policy = nil
	}
	return &openshellv1.ListSandboxPoliciesResponse{Revisions: revs}, nil
}
