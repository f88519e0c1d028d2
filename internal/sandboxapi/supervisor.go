package sandboxapi

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"

	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/sandboxlog"
	"github.com/openshell-go/openshell/internal/store"
)

// ConnectSupervisor holds a supervisor's session stream.
func (s *Service) ConnectSupervisor(stream openshellv1.OpenShell_ConnectSupervisorServer) error {
	id, err := requireSandboxPrincipal(stream.Context())
	if err != nil {
		return err
	}
	return s.o.Relay.HandleConnect(stream, id)
}

// RelayStream carries the bytes of one relay opened by the gateway.
func (s *Service) RelayStream(stream openshellv1.OpenShell_RelayStreamServer) error {
	id, err := requireSandboxPrincipal(stream.Context())
	if err != nil {
		return err
	}
	return s.o.Relay.HandleRelayStream(stream, id)
}

// ReportMainProcessExit records the exit of the sandbox's main process.
func (s *Service) ReportMainProcessExit(ctx context.Context, req *openshellv1.ReportMainProcessExitRequest) (*openshellv1.ReportMainProcessExitResponse, error) {
	if req.GetSandboxId() == "" {
		return nil, errdefs.InvalidArgument("sandbox_id is required")
	}
	if err := ensureSandboxScope(ctx, req.GetSandboxId()); err != nil {
		return nil, err
	}
	if err := s.o.Engine.ReportMainProcessExit(ctx, req.GetSandboxId(), req.GetInstanceId(), req.GetExitCode()); err != nil {
		return nil, err
	}
	s.gatewayLog(req.GetSandboxId(), "warn", fmt.Sprintf("main process exited with code %d", req.GetExitCode()))
	return &openshellv1.ReportMainProcessExitResponse{}, nil
}

// maxLogLine bounds a single pushed log message.
const maxLogLine = 16 << 10

// PushSandboxLogs receives log batches from a supervisor.
func (s *Service) PushSandboxLogs(stream openshellv1.OpenShell_PushSandboxLogsServer) error {
	id, err := requireSandboxPrincipal(stream.Context())
	if err != nil {
		return err
	}
	type recv struct {
		req *openshellv1.PushSandboxLogsRequest
		err error
	}
	next := make(chan recv)
	go func() { // ends when the call ends (Recv fails)
		for {
			req, err := stream.Recv()
			select {
			case next <- recv{req, err}:
			case <-stream.Context().Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	for {
		var r recv
		select {
		case <-s.closing:
			return errdefs.Unavailable("gateway is shutting down")
		case r = <-next:
		}
		if errors.Is(r.err, io.EOF) {
			return stream.SendAndClose(&openshellv1.PushSandboxLogsResponse{})
		}
		if r.err != nil {
			return r.err
		}
		if r.req.GetSandboxId() != id {
			return errCrossSandbox
		}
		for _, l := range r.req.GetLogs() {
			l.SandboxId = id
			l.Source = sandboxlog.SourceSandbox
			if len(l.Message) > maxLogLine {
				l.Message = l.Message[:maxLogLine]
			}
			if l.TimestampMs == 0 {
				l.TimestampMs = s.o.Now().UnixMilli()
			}
			s.o.Logs.Append(l)
		}
	}
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
	sb, err := s.sandboxForCaller(ctx, req.GetSandboxId())
	if err != nil {
		return nil, err
	}
	resp := &sandboxv1.GetSandboxConfigResponse{Workspace: sb.GetMetadata().GetWorkspace(), PolicyValidationFailureMode: "fail_closed"}
	rev, err := s.latestPolicy(ctx, sb.GetMetadata().GetId())
	switch {
	case err == nil:
		resp.Policy, resp.Version, resp.PolicyHash = rev.GetPolicy(), rev.GetVersion(), rev.GetPolicyHash()
		resp.PolicySource = sandboxv1.PolicySource_POLICY_SOURCE_SANDBOX
	case isNotFound(err):
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
			return nil, errCrossSandbox
		}
	} else {
		if err = s.authorizeSandbox(ctx, req.GetWorkspace(), req.GetName(), openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER); err == nil {
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
	if err := ensureSandboxScope(ctx, req.GetSandboxId()); err != nil {
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

// GetSandboxProviderEnvironment returns provider credentials for the
// sandbox. Providers are not implemented yet: the environment is empty.
func (s *Service) GetSandboxProviderEnvironment(ctx context.Context, req *openshellv1.GetSandboxProviderEnvironmentRequest) (*openshellv1.GetSandboxProviderEnvironmentResponse, error) {
	if _, err := s.sandboxForCaller(ctx, req.GetSandboxId()); err != nil {
		return nil, err
	}
	return &openshellv1.GetSandboxProviderEnvironmentResponse{}, nil
}

// RefreshSandboxToken mints a fresh JWT for the calling sandbox.
func (s *Service) RefreshSandboxToken(ctx context.Context, _ *openshellv1.RefreshSandboxTokenRequest) (*openshellv1.RefreshSandboxTokenResponse, error) {
	tok, expMs, err := s.mintFor(ctx, auth.SourceSandboxJWT, "only a sandbox JWT can be refreshed")
	if err != nil {
		return nil, err
	}
	return &openshellv1.RefreshSandboxTokenResponse{Token: tok, ExpiresAtMs: expMs}, nil
}

// IssueSandboxToken exchanges a Kubernetes ServiceAccount token for a
// sandbox JWT. The exchange itself is authenticated by the Kubernetes
// bootstrap authenticator; any other principal is refused.
func (s *Service) IssueSandboxToken(ctx context.Context, _ *openshellv1.IssueSandboxTokenRequest) (*openshellv1.IssueSandboxTokenResponse, error) {
	tok, expMs, err := s.mintFor(ctx, auth.SourceK8sSABootstrap, "this principal cannot mint a sandbox token; use RefreshSandboxToken")
	if err != nil {
		return nil, err
	}
	return &openshellv1.IssueSandboxTokenResponse{Token: tok, ExpiresAtMs: expMs}, nil
}

// mintFor mints a JWT for the calling sandbox principal, which must have
// authenticated through source (refused with refusal otherwise) and whose
// sandbox must still exist. expiresAtMs is 0 for non-expiring tokens.
func (s *Service) mintFor(ctx context.Context, source auth.Source, refusal string) (token string, expiresAtMs int64, err error) {
	p, ok := auth.FromContext(ctx)
	if !ok || !p.IsSandbox() {
		return "", 0, errdefs.PermissionDenied("this method requires a sandbox principal")
	}
	if p.Source != source {
		return "", 0, errdefs.PermissionDenied(refusal)
	}
	if s.o.Minter == nil {
		return "", 0, errdefs.Unavailable("sandbox JWT minting is not configured on this gateway")
	}
	if err := s.o.Engine.SandboxExists(ctx, p.SandboxID); err != nil {
		return "", 0, err
	}
	tok, exp, err := s.o.Minter.Mint(p.SandboxID)
	if err != nil {
		return "", 0, fmt.Errorf("mint sandbox token: %w", err)
	}
	if !exp.IsZero() {
		expiresAtMs = exp.UnixMilli()
	}
	return tok, expiresAtMs, nil
}
