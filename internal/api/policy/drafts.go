package policy

import (
	"context"
	"errors"
	"fmt"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/api/authz"
	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/policy/advisor"
	"github.com/openshell-go/openshell/internal/settings"
)

// The policy advisor RPCs: SubmitPolicyAnalysis (a supervisor, for its own
// sandbox only), GetDraftPolicy (workspace users, and the sandbox's own
// supervisor), GetDraftHistory (workspace users) and the decisions on
// draft chunks (workspace admins). The draft logic is internal/policy/advisor.

// approvalModeKey is the setting that turns auto-approval on.
const approvalModeKey = "proposal_approval_mode"

// ownSandbox loads the caller's own sandbox for a sandbox principal that
// names it (by name or id); another sandbox is ErrCrossSandbox.
func (s *Service) ownSandbox(ctx context.Context, sandboxID, name string) (*openshellv1.Sandbox, error) {
	sb, err := s.o.Engine.GetByID(ctx, sandboxID)
	if err != nil {
		return nil, err
	}
	if name != sb.GetMetadata().GetName() && name != sb.GetMetadata().GetId() {
		return nil, authz.ErrCrossSandbox
	}
	return sb, nil
}

// draftSandbox resolves the sandbox a draft RPC names: its own for a
// supervisor (only where allowed), else by workspace and name with the
// caller's workspace role checked (a refusal reads NotFound).
func (s *Service) draftSandbox(ctx context.Context, workspace, name string, need openshellv1.WorkspaceRole, sandboxAllowed bool) (advisor.Sandbox, error) {
	if name == "" {
		return advisor.Sandbox{}, errdefs.InvalidArgument("name is required")
	}
	var sb *openshellv1.Sandbox
	var err error
	if p, ok := auth.FromContext(ctx); ok && p.IsSandbox() {
		if !sandboxAllowed {
			return advisor.Sandbox{}, errdefs.PermissionDenied("sandbox principals may not call this method")
		}
		sb, err = s.ownSandbox(ctx, p.SandboxID, name)
	} else {
		if err := s.o.Authz.Sandbox(ctx, workspace, name, need); err != nil {
			return advisor.Sandbox{}, err
		}
		sb, err = s.o.Engine.Get(ctx, workspace, name)
	}
	if err != nil {
		return advisor.Sandbox{}, err
	}
	return s.advisorInputs(ctx, sb)
}

// advisorInputs gathers the live inputs of the advisor for sb.
func (s *Service) advisorInputs(ctx context.Context, sb *openshellv1.Sandbox) (advisor.Sandbox, error) {
	in := advisor.Sandbox{Sandbox: sb}
	if _, err := s.global.Active(ctx); err == nil {
		in.Global = true
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return in, err
	}
	global, err := s.settings.Get(ctx, settings.GlobalScope)
	if err != nil {
		return in, err
	}
	own, err := s.settings.Get(ctx, sb.GetMetadata().GetId())
	if err != nil {
		return in, err
	}
	// A global value wins; anything but exactly "auto" is manual.
	mode := own.Values[approvalModeKey]
	if g, ok := global.Values[approvalModeKey]; ok {
		mode = g
	}
	in.Auto = mode.GetStringValue() == "auto"
	if s.o.CredentialHosts != nil {
		if in.CredentialHosts, err = s.o.CredentialHosts(ctx, sb); err != nil {
			return in, err
		}
	}
	return in, nil
}

// SubmitPolicyAnalysis stores a supervisor's denial summaries and
// proposals as draft chunks of its own sandbox.
func (s *Service) SubmitPolicyAnalysis(ctx context.Context, req *openshellv1.SubmitPolicyAnalysisRequest) (*openshellv1.SubmitPolicyAnalysisResponse, error) {
	id, err := authz.RequireSandboxPrincipal(ctx)
	if err != nil {
		return nil, err
	}
	if req.GetName() == "" {
		return nil, errdefs.InvalidArgument("name is required")
	}
	sb, err := s.ownSandbox(ctx, id, req.GetName())
	if err != nil {
		return nil, err
	}
	in, err := s.advisorInputs(ctx, sb)
	if err != nil {
		return nil, err
	}
	resp, created, err := s.drafts.Submit(ctx, in, req)
	if err == nil && resp.GetAcceptedChunks() > 0 {
		s.publishDrafts(ctx, in, created, fmt.Sprintf("%d proposal(s) accepted (%d new chunk(s)), %d rejected", resp.GetAcceptedChunks(), created, resp.GetRejectedChunks()))
	}
	return resp, err
}

// publishDrafts tells the sandbox's watchers (WatchSandbox follow_events)
// that its drafts changed. It is best effort: the change is stored, and a
// failure to describe it only costs the notification.
func (s *Service) publishDrafts(ctx context.Context, in advisor.Sandbox, newChunks uint32, summary string) {
	u, err := s.drafts.Update(ctx, in, newChunks, summary)
	if err != nil {
		return
	}
	s.o.Engine.PublishDraftUpdate(in.Sandbox.GetMetadata().GetId(), u)
}

// GetDraftPolicy lists a sandbox's draft chunks.
func (s *Service) GetDraftPolicy(ctx context.Context, req *openshellv1.GetDraftPolicyRequest) (*openshellv1.GetDraftPolicyResponse, error) {
	in, err := s.draftSandbox(ctx, req.GetWorkspace(), req.GetName(), openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER, true)
	if err != nil {
		return nil, err
	}
	chunks, version, last, err := s.drafts.List(ctx, in, req.GetStatusFilter())
	if err != nil {
		return nil, err
	}
	return &openshellv1.GetDraftPolicyResponse{Chunks: chunks, DraftVersion: version, LastAnalyzedAtMs: last}, nil
}

// GetDraftHistory lists the proposal and decision events of a sandbox's
// draft chunks.
func (s *Service) GetDraftHistory(ctx context.Context, req *openshellv1.GetDraftHistoryRequest) (*openshellv1.GetDraftHistoryResponse, error) {
	in, err := s.draftSandbox(ctx, req.GetWorkspace(), req.GetName(), openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER, false)
	if err != nil {
		return nil, err
	}
	entries, err := s.drafts.HistoryOf(ctx, in)
	if err != nil {
		return nil, err
	}
	return &openshellv1.GetDraftHistoryResponse{Entries: entries}, nil
}

// adminSandbox resolves the sandbox of a draft decision (workspace admins).
func (s *Service) adminSandbox(ctx context.Context, workspace, name string) (advisor.Sandbox, error) {
	return s.draftSandbox(ctx, workspace, name, openshellv1.WorkspaceRole_WORKSPACE_ROLE_ADMIN, false)
}

// ApproveDraftChunk merges a chunk's rule into the sandbox's policy.
func (s *Service) ApproveDraftChunk(ctx context.Context, req *openshellv1.ApproveDraftChunkRequest) (*openshellv1.ApproveDraftChunkResponse, error) {
	in, err := s.adminSandbox(ctx, req.GetWorkspace(), req.GetName())
	if err != nil {
		return nil, err
	}
	rev, err := s.drafts.Approve(ctx, in, req.GetChunkId(), req.GetReviewToken())
	if err != nil {
		return nil, err
	}
	s.publishDrafts(ctx, in, 0, fmt.Sprintf("chunk %s approved (policy version %d)", req.GetChunkId(), rev.GetVersion()))
	return &openshellv1.ApproveDraftChunkResponse{PolicyVersion: rev.GetVersion(), PolicyHash: rev.GetPolicyHash()}, nil
}

// RejectDraftChunk rejects a chunk (removing an approved one's rule).
func (s *Service) RejectDraftChunk(ctx context.Context, req *openshellv1.RejectDraftChunkRequest) (*openshellv1.RejectDraftChunkResponse, error) {
	in, err := s.adminSandbox(ctx, req.GetWorkspace(), req.GetName())
	if err != nil {
		return nil, err
	}
	if req.GetChunkId() == "" {
		return nil, errdefs.InvalidArgument("chunk_id is required")
	}
	if err := s.drafts.Reject(ctx, in, req.GetChunkId(), req.GetReason()); err != nil {
		return nil, err
	}
	s.publishDrafts(ctx, in, 0, fmt.Sprintf("chunk %s rejected", req.GetChunkId()))
	return &openshellv1.RejectDraftChunkResponse{}, nil
}

// ApproveAllDraftChunks approves pending chunks in one revision.
func (s *Service) ApproveAllDraftChunks(ctx context.Context, req *openshellv1.ApproveAllDraftChunksRequest) (*openshellv1.ApproveAllDraftChunksResponse, error) {
	in, err := s.adminSandbox(ctx, req.GetWorkspace(), req.GetName())
	if err != nil {
		return nil, err
	}
	rev, approved, skipped, err := s.drafts.ApproveAll(ctx, in, req.GetIncludeSecurityFlagged(), req.GetApprovals())
	if approved > 0 {
		s.publishDrafts(ctx, in, 0, fmt.Sprintf("%d chunk(s) approved (policy version %d), %d skipped", approved, rev.GetVersion(), skipped))
	}
	if err != nil {
		return nil, err
	}
	return &openshellv1.ApproveAllDraftChunksResponse{PolicyVersion: rev.GetVersion(), PolicyHash: rev.GetPolicyHash(), ChunksApproved: approved, ChunksSkipped: skipped}, nil
}

// EditDraftChunk replaces a pending chunk's proposed rule.
func (s *Service) EditDraftChunk(ctx context.Context, req *openshellv1.EditDraftChunkRequest) (*openshellv1.EditDraftChunkResponse, error) {
	in, err := s.adminSandbox(ctx, req.GetWorkspace(), req.GetName())
	if err != nil {
		return nil, err
	}
	if err := s.drafts.Edit(ctx, in, req.GetChunkId(), req.GetProposedRule()); err != nil {
		return nil, err
	}
	s.publishDrafts(ctx, in, 0, fmt.Sprintf("chunk %s edited", req.GetChunkId()))
	return &openshellv1.EditDraftChunkResponse{}, nil
}

// UndoDraftChunk reverts an approved chunk to pending.
func (s *Service) UndoDraftChunk(ctx context.Context, req *openshellv1.UndoDraftChunkRequest) (*openshellv1.UndoDraftChunkResponse, error) {
	in, err := s.adminSandbox(ctx, req.GetWorkspace(), req.GetName())
	if err != nil {
		return nil, err
	}
	if req.GetChunkId() == "" {
		return nil, errdefs.InvalidArgument("chunk_id is required")
	}
	rev, err := s.drafts.Undo(ctx, in, req.GetChunkId())
	if err != nil {
		return nil, err
	}
	s.publishDrafts(ctx, in, 0, fmt.Sprintf("chunk %s undone (policy version %d)", req.GetChunkId(), rev.GetVersion()))
	return &openshellv1.UndoDraftChunkResponse{PolicyVersion: rev.GetVersion(), PolicyHash: rev.GetPolicyHash()}, nil
}

// ClearDraftChunks deletes a sandbox's pending chunks.
func (s *Service) ClearDraftChunks(ctx context.Context, req *openshellv1.ClearDraftChunksRequest) (*openshellv1.ClearDraftChunksResponse, error) {
	in, err := s.adminSandbox(ctx, req.GetWorkspace(), req.GetName())
	if err != nil {
		return nil, err
	}
	n, err := s.drafts.Clear(ctx, in)
	if n > 0 {
		s.publishDrafts(ctx, in, 0, fmt.Sprintf("%d pending chunk(s) cleared", n))
	}
	if err != nil {
		return nil, err
	}
	return &openshellv1.ClearDraftChunksResponse{ChunksCleared: n}, nil
}
