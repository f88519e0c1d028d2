// Package sandboxapi implements the sandbox-facing part of the
// openshell.v1.OpenShell service: lifecycle RPCs on top of the lifecycle
// engine, exec / SSH sessions / TCP forwarding over supervisor relays,
// logs, and the supervisor's own RPCs (session, relays, config, exit
// reports, token refresh).
//
// Authentication and the per-RPC authorization rule are enforced by the
// server's interceptors before a method runs; the methods here add the
// checks that need the request body: a sandbox principal may only act for
// its own sandbox.
package sandboxapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/lifecycle"
	"github.com/openshell-go/openshell/internal/relay"
	"github.com/openshell-go/openshell/internal/sandboxlog"
	"github.com/openshell-go/openshell/internal/store"
)

// TokenMinter mints sandbox JWTs (RefreshSandboxToken).
type TokenMinter interface {
	Mint(sandboxID string) (token string, expiresAt time.Time, err error)
}

// Options wire a Service.
type Options struct {
	Engine *lifecycle.Engine
	Relay  *relay.Registry
	Logs   *sandboxlog.Buffer
	Store  store.Store
	Minter TokenMinter // nil: RefreshSandboxToken is Unavailable
	// SSHSessionTTL bounds CreateSshSession tokens; 0 means no expiry.
	SSHSessionTTL time.Duration
	// Gateway address reported in CreateSshSession responses.
	GatewayHost   string
	GatewayPort   uint32
	GatewayScheme string
	// Connection caps for ForwardTcp (0 = defaults).
	MaxForwardsPerToken   int
	MaxForwardsPerSandbox int
	// OIDC turns workspace membership checks on; AdminRole is the role
	// that makes a principal a platform admin (membership bypassed; an
	// empty AdminRole bypasses for everyone, as upstream).
	OIDC      bool
	AdminRole string
	Logger    *slog.Logger
	Now       func() time.Time
}

// Service implements the sandbox RPCs of openshellv1.OpenShellServer.
// Methods it does not implement answer Unimplemented through the embedded
// type; the server composes it with the gateway-level RPCs.
type Service struct {
	openshellv1.UnimplementedOpenShellServer
	o        Options
	log      *slog.Logger
	forwards *forwardCounter
	ssh      *sshPool
	// closing ends long-lived streams (log pushes, watches) at shutdown.
	closing   chan struct{}
	closeOnce sync.Once
}

// Close ends the service's long-lived streams so a graceful drain does not
// wait for its deadline. Unary calls are unaffected.
func (s *Service) Close() {
	s.closeOnce.Do(func() {
		close(s.closing)
		s.ssh.close()
	})
}

// New returns a Service.
func New(o Options) *Service {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logs == nil {
		o.Logs = sandboxlog.New(0)
	}
	if o.MaxForwardsPerToken == 0 {
		o.MaxForwardsPerToken = 16
	}
	if o.MaxForwardsPerSandbox == 0 {
		o.MaxForwardsPerSandbox = 64
	}
	return &Service{
		o: o, log: o.Logger.With("component", "sandboxapi"), closing: make(chan struct{}),
		forwards: newForwardCounter(o.MaxForwardsPerToken, o.MaxForwardsPerSandbox),
		ssh:      newSSHPool(o.Relay),
	}
}

// errCrossSandbox is the refusal when a sandbox principal names another
// sandbox.
var errCrossSandbox = errdefs.PermissionDenied("cross-sandbox access denied: principal does not own this sandbox")

// ensureSandboxScope refuses a sandbox principal acting for another
// sandbox. User principals pass (their workspace is checked by lookups).
func ensureSandboxScope(ctx context.Context, sandboxID string) error {
	p, ok := auth.FromContext(ctx)
	if !ok || !p.IsSandbox() {
		return nil
	}
	if p.SandboxID != sandboxID {
		return errCrossSandbox
	}
	return nil
}

// requireSandboxPrincipal returns the caller's sandbox id for
// sandbox-only RPCs.
func requireSandboxPrincipal(ctx context.Context) (string, error) {
	p, ok := auth.FromContext(ctx)
	if !ok || !p.IsSandbox() {
		return "", errdefs.PermissionDenied("this method requires a sandbox principal")
	}
	return p.SandboxID, nil
}

// sandboxForUser loads a sandbox by id for a user or its own supervisor;
// "missing" and "not yours" both read NotFound.
func (s *Service) sandboxForCaller(ctx context.Context, id string) (*openshellv1.Sandbox, error) {
	if id == "" {
		return nil, errdefs.InvalidArgument("sandbox_id is required")
	}
	if err := ensureSandboxScope(ctx, id); err != nil {
		return nil, err
	}
	sb, err := s.o.Engine.GetByID(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := s.authorizeSandboxRecord(ctx, sb); err != nil {
		return nil, err
	}
	return sb, nil
}

// CreateSandbox creates a sandbox.
func (s *Service) CreateSandbox(ctx context.Context, req *openshellv1.CreateSandboxRequest) (*openshellv1.SandboxResponse, error) {
	if err := s.authorizeCreate(ctx, req.GetWorkspace(), openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER); err != nil {
		return nil, err
	}
	sb, err := s.o.Engine.Create(ctx, req)
	if err != nil {
		return nil, err
	}
	s.gatewayLog(sb.GetMetadata().GetId(), "info", fmt.Sprintf("sandbox %s created", sb.GetMetadata().GetName()))
	return &openshellv1.SandboxResponse{Sandbox: sb}, nil
}

// GetSandbox returns a sandbox by name.
func (s *Service) GetSandbox(ctx context.Context, req *openshellv1.GetSandboxRequest) (*openshellv1.SandboxResponse, error) {
	if err := s.authorizeSandbox(ctx, req.GetWorkspace(), req.GetName(), openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER); err != nil {
		return nil, err
	}
	sb, err := s.o.Engine.Get(ctx, req.GetWorkspace(), req.GetName())
	if err != nil {
		return nil, err
	}
	return &openshellv1.SandboxResponse{Sandbox: sb}, nil
}

// ListSandboxes lists sandboxes of a workspace, or of all workspaces for
// platform admins.
func (s *Service) ListSandboxes(ctx context.Context, req *openshellv1.ListSandboxesRequest) (*openshellv1.ListSandboxesResponse, error) {
	if req.GetAllWorkspaces() && !s.platformAdmin(ctx) {
		return nil, errdefs.PermissionDenied("all_workspaces requires the platform admin role")
	}
	if !req.GetAllWorkspaces() {
		if err := s.authorizeWorkspace(ctx, req.GetWorkspace(), openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER); err != nil {
			return nil, err
		}
	}
	if req.GetLimit() > store.MaxLimit {
		return nil, errdefs.InvalidArgument(fmt.Sprintf("limit exceeds maximum (%d > %d)", req.GetLimit(), store.MaxLimit))
	}
	list, err := s.o.Engine.List(ctx, lifecycle.ListOptions{
		Workspace: req.GetWorkspace(), AllWorkspaces: req.GetAllWorkspaces(),
		Limit: int(req.GetLimit()), Offset: int(req.GetOffset()), LabelSelector: req.GetLabelSelector(),
	})
	if err != nil {
		return nil, err
	}
	return &openshellv1.ListSandboxesResponse{Sandboxes: list}, nil
}

// DeleteSandbox deletes a sandbox by name.
func (s *Service) DeleteSandbox(ctx context.Context, req *openshellv1.DeleteSandboxRequest) (*openshellv1.DeleteSandboxResponse, error) {
	if err := s.authorizeSandbox(ctx, req.GetWorkspace(), req.GetName(), openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER); err != nil {
		return nil, err
	}
	sb, err := s.o.Engine.Get(ctx, req.GetWorkspace(), req.GetName())
	if err != nil {
		return nil, err
	}
	deleted, err := s.o.Engine.Delete(ctx, req.GetWorkspace(), req.GetName())
	if err != nil {
		return nil, err
	}
	s.o.Logs.Drop(sb.GetMetadata().GetId())
	s.ssh.dropSandbox(sb.GetMetadata().GetId())
	return &openshellv1.DeleteSandboxResponse{Deleted: deleted}, nil
}

// StopSandbox stops a sandbox, keeping its workspace.
func (s *Service) StopSandbox(ctx context.Context, req *openshellv1.StopSandboxRequest) (*openshellv1.SandboxResponse, error) {
	if err := s.authorizeSandbox(ctx, req.GetWorkspace(), req.GetName(), openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER); err != nil {
		return nil, err
	}
	sb, err := s.o.Engine.Stop(ctx, req.GetWorkspace(), req.GetName())
	if err != nil {
		return nil, err
	}
	return &openshellv1.SandboxResponse{Sandbox: sb}, nil
}

// StartSandbox starts a stopped sandbox.
func (s *Service) StartSandbox(ctx context.Context, req *openshellv1.StartSandboxRequest) (*openshellv1.SandboxResponse, error) {
	if err := s.authorizeSandbox(ctx, req.GetWorkspace(), req.GetName(), openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER); err != nil {
		return nil, err
	}
	sb, err := s.o.Engine.Start(ctx, req.GetWorkspace(), req.GetName())
	if err != nil {
		return nil, err
	}
	return &openshellv1.SandboxResponse{Sandbox: sb}, nil
}

// ListSandboxProviders lists providers attached to a sandbox. Providers
// are not implemented yet, so the list is empty for an existing sandbox.
func (s *Service) ListSandboxProviders(ctx context.Context, req *openshellv1.ListSandboxProvidersRequest) (*openshellv1.ListSandboxProvidersResponse, error) {
	if err := s.authorizeSandbox(ctx, req.GetWorkspace(), req.GetSandboxName(), openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER); err != nil {
		return nil, err
	}
	if _, err := s.o.Engine.Get(ctx, req.GetWorkspace(), req.GetSandboxName()); err != nil {
		return nil, err
	}
	return &openshellv1.ListSandboxProvidersResponse{}, nil
}

func (s *Service) gatewayLog(sandboxID, level, msg string) {
	s.o.Logs.Append(&openshellv1.SandboxLogLine{
		SandboxId: sandboxID, TimestampMs: s.o.Now().UnixMilli(), Level: level,
		Target: "openshell_gateway", Message: msg, Source: sandboxlog.SourceGateway,
	})
}

func isNotFound(err error) bool { return errors.Is(err, errdefs.ErrNotFound) }
