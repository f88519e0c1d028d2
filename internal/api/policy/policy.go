// Package policy implements the sandbox configuration RPCs of
// openshell.v1.OpenShell: GetSandboxConfig (the effective policy and
// settings a supervisor enforces), UpdateConfig (a new policy revision)
// and ReportPolicyStatus (whether the supervisor loaded a revision).
// Revisions are scoped store records of the sandbox.
package policy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/api/authz"
	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/lifecycle"
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
type Service struct{ o Options }

// New returns a Service.
func New(o Options) *Service {
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Service{o: o}
}

// policyRecordType holds policy revisions, scoped by sandbox id.
const policyRecordType = store.TypeSandboxPolicy

func policyHash(p *sandboxv1.SandboxPolicy) string {
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(p)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func (s *Service) latestPolicy(ctx context.Context, sandboxID string) (*openshellv1.SandboxPolicyRevision, error) {
	rec, err := s.o.Store.GetLatestScoped(ctx, policyRecordType, sandboxID, "")
	if err != nil {
		return nil, err
	}
	rev := &openshellv1.SandboxPolicyRevision{}
	if err := proto.Unmarshal(rec.Payload, rev); err != nil {
		return nil, fmt.Errorf("decode policy revision: %w", err)
	}
	rev.Version = uint32(rec.Version)
	return rev, nil
}

// GetSandboxConfig returns the sandbox's effective policy and settings.
func (s *Service) GetSandboxConfig(ctx context.Context, req *sandboxv1.GetSandboxConfigRequest) (*sandboxv1.GetSandboxConfigResponse, error) {
	sb, err := s.o.Authz.SandboxForCaller(ctx, req.GetSandboxId())
	if err != nil {
		return nil, err
	}
	resp := &sandboxv1.GetSandboxConfigResponse{Workspace: sb.GetMetadata().GetWorkspace(), PolicyValidationFailureMode: "fail_closed"}
	rev, err := s.latestPolicy(ctx, sb.GetMetadata().GetId())
	switch {
	case err == nil:
		resp.Policy, resp.Version, resp.PolicyHash = rev.GetPolicy(), rev.GetVersion(), rev.GetPolicyHash()
		resp.PolicySource = sandboxv1.PolicySource_POLICY_SOURCE_SANDBOX
	case errors.Is(err, errdefs.ErrNotFound):
		if p := sb.GetSpec().GetPolicy(); p != nil {
			resp.Policy, resp.Version, resp.PolicyHash = p, 1, policyHash(p)
			resp.PolicySource = sandboxv1.PolicySource_POLICY_SOURCE_SANDBOX
		}
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
	id := sb.GetMetadata().GetId()
	hash := policyHash(req.GetPolicy())
	if latest, err := s.latestPolicy(ctx, id); err == nil && latest.GetPolicyHash() == hash {
		return &openshellv1.UpdateConfigResponse{Version: latest.GetVersion(), PolicyHash: hash}, nil
	}
	rev := &openshellv1.SandboxPolicyRevision{
		PolicyHash: hash, Status: openshellv1.PolicyStatus_POLICY_STATUS_PENDING,
		CreatedAtMs: s.o.Now().UnixMilli(), Policy: req.GetPolicy(),
	}
	payload, err := proto.Marshal(rev)
	if err != nil {
		return nil, err
	}
	res, err := s.o.Store.CommitPolicyRevision(ctx, store.PolicyRevision{
		Revision:        store.Record{Type: policyRecordType, Scope: id, Status: rev.Status.String(), Payload: payload},
		SupersedeStatus: openshellv1.PolicyStatus_POLICY_STATUS_SUPERSEDED.String(),
		SupersedeFrom:   []string{openshellv1.PolicyStatus_POLICY_STATUS_PENDING.String()},
	})
	if err != nil {
		return nil, err
	}
	return &openshellv1.UpdateConfigResponse{Version: uint32(res.Revision.Version), PolicyHash: hash}, nil
}

// ReportPolicyStatus records whether the supervisor loaded a policy
// revision.
func (s *Service) ReportPolicyStatus(ctx context.Context, req *openshellv1.ReportPolicyStatusRequest) (*openshellv1.ReportPolicyStatusResponse, error) {
	if req.GetSandboxId() == "" {
		return nil, errdefs.InvalidArgument("sandbox_id is required")
	}
	if err := authz.EnsureSandboxScope(ctx, req.GetSandboxId()); err != nil {
		return nil, err
	}
	recs, err := s.o.Store.ListScoped(ctx, policyRecordType, req.GetSandboxId(), store.MaxLimit, 0)
	if err != nil {
		return nil, err
	}
	for _, rec := range recs {
		if rec.Version != int64(req.GetVersion()) {
			continue
		}
		rev := &openshellv1.SandboxPolicyRevision{}
		if err := proto.Unmarshal(rec.Payload, rev); err != nil {
			return nil, fmt.Errorf("decode policy revision: %w", err)
		}
		rev.Status, rev.LoadError = req.GetStatus(), req.GetLoadError()
		if req.GetStatus() == openshellv1.PolicyStatus_POLICY_STATUS_LOADED {
			rev.LoadedAtMs = s.o.Now().UnixMilli()
		}
		rec.Status = rev.Status.String()
		if rec.Payload, err = proto.Marshal(rev); err != nil {
			return nil, err
		}
		if _, err := s.o.Store.UpdateScoped(ctx, rec, rec.ResourceVersion); err != nil {
			return nil, err
		}
		return &openshellv1.ReportPolicyStatusResponse{}, nil
	}
	return nil, errdefs.NotFound("policy version " + strconv.Itoa(int(req.GetVersion())) + " not found")
}
