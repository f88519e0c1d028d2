// Package policy implements the sandbox configuration RPCs of
// openshell.v1.OpenShell: GetSandboxConfig (the policy and settings the
// supervisor is to enforce: the global policy when one is set, else the
// sandbox's own; the effective settings; config_revision), GetGatewayConfig
// (the global settings), UpdateConfig (one change: a sandbox or global
// policy revision, merge operations on a sandbox policy, a setting at
// sandbox or global scope, or the removal of the global policy),
// ReportPolicyStatus (whether the supervisor enforces a revision),
// GetSandboxPolicyStatus and ListSandboxPolicies (the revisions of a
// sandbox or of the global policy), and the policy advisor's
// SubmitPolicyAnalysis and draft chunk RPCs (internal/policy/advisor).
// The rules and revisions live in internal/policy, the settings registry
// and store in internal/settings; this package adds authorization (global
// writes and reads need a platform admin) and the wire shapes. See
// docs/policy.md.
package policy

import (
	"context"
	"time"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/api/authz"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/lifecycle"
	policyrules "github.com/openshell-go/openshell/internal/policy"
	"github.com/openshell-go/openshell/internal/policy/advisor"
	"github.com/openshell-go/openshell/internal/settings"
	"github.com/openshell-go/openshell/internal/store"
)

// Options wire a Service.
type Options struct {
	Engine *lifecycle.Engine
	Store  store.Store
	Authz  *authz.Authorizer
	Now    func() time.Time
	// CredentialHosts returns the hosts a sandbox holds credentials for
	// (for the policy advisor's prover); nil means none are known.
	CredentialHosts func(ctx context.Context, sb *openshellv1.Sandbox) ([]string, error)
	// ProviderRules returns policy with the network rules of the sandbox's
	// provider profiles added (providers_v2_enabled), or policy itself when
	// they add none; nil composes nothing.
	ProviderRules func(ctx context.Context, sb *openshellv1.Sandbox, policy *sandboxv1.SandboxPolicy) (*sandboxv1.SandboxPolicy, error)
}

// Service implements the policy RPCs. It is safe for concurrent use.
type Service struct {
	o        Options
	history  policyrules.History
	global   policyrules.Global
	settings *settings.Store
	drafts   advisor.Drafts
}

// New returns a Service.
func New(o Options) *Service {
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Service{
		o:        o,
		history:  policyrules.History{Store: o.Store, Now: o.Now},
		global:   policyrules.Global{Store: o.Store, Now: o.Now},
		settings: &settings.Store{Records: o.Store},
		drafts:   advisor.Drafts{Store: o.Store, History: policyrules.History{Store: o.Store, Now: o.Now}, Now: o.Now},
	}
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
func (s *Service) sandboxByName(ctx context.Context, workspace, name string) (*openshellv1.Sandbox, error) {
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
	if req.GetGlobal() {
		if err := s.o.Authz.RequirePlatformAdmin(ctx); err != nil {
			return nil, err
		}
		rev, err := s.global.Get(ctx, req.GetVersion())
		if err != nil {
			return nil, err
		}
		return &openshellv1.GetSandboxPolicyStatusResponse{Revision: rev}, nil
	}
	sb, err := s.sandboxByName(ctx, req.GetWorkspace(), req.GetName())
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
	limit := int(min(req.GetLimit(), maxPolicyPage))
	if limit == 0 {
		limit = defaultPolicyPage
	}
	var revs []*openshellv1.SandboxPolicyRevision
	var err error
	if req.GetGlobal() {
		if err := s.o.Authz.RequirePlatformAdmin(ctx); err != nil {
			return nil, err
		}
		revs, err = s.global.List(ctx, limit, int(req.GetOffset()))
	} else {
		var sb *openshellv1.Sandbox
		if sb, err = s.sandboxByName(ctx, req.GetWorkspace(), req.GetName()); err == nil {
			revs, err = s.history.List(ctx, sb.GetMetadata().GetId(), limit, int(req.GetOffset()))
		}
	}
	if err != nil {
		return nil, err
	}
	for _, r := range revs {
		r.Policy = nil
	}
	return &openshellv1.ListSandboxPoliciesResponse{Revisions: revs}, nil
}
