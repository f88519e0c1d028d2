package remote

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	computev1 "github.com/openshell-go/openshell/api/openshell/compute/v1"
	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/telemetry"
)

// drainTimeout bounds graceful shutdown; open watches are then cut.
const drainTimeout = 5 * time.Second

// Serve exposes d as openshell.compute.v1.ComputeDriver on a Unix socket at
// socketPath (mode 0600) until ctx ends, then stops gracefully and removes
// the socket. A stale socket file is replaced; a socket another server
// still answers on is an error (FailedPrecondition). It returns nil after
// ctx cancellation.
func Serve(ctx context.Context, d compute.Driver, socketPath string, logger *slog.Logger) error {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	logger = logger.With("component", "compute/remote", "socket", socketPath)
	lis, err := listenUnix(socketPath)
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(socketPath) }() // best effort: the socket may already be gone

	traceUnary, traceStream := telemetry.ServerInterceptors()
	srv := grpc.NewServer(
		grpc.MaxRecvMsgSize(maxMsgSize),
		grpc.ChainUnaryInterceptor(traceUnary, func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			resp, err := h(ctx, req)
			return resp, toWire(logger, info.FullMethod, err)
		}),
		grpc.ChainStreamInterceptor(traceStream, func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			return toWire(logger, info.FullMethod, h(srv, ss))
		}),
	)
	computev1.RegisterComputeDriverServer(srv, &server{d: d, logger: logger, serveCtx: ctx})

	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	logger.Info("serving compute driver")

	select {
	case err := <-served:
		return fmt.Errorf("serve compute driver on %s: %w", socketPath, err)
	case <-ctx.Done():
	}
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(drainTimeout):
		srv.Stop()
		<-stopped
	}
	<-served //nolint:errcheck // joined only: Serve returns nil after Stop/GracefulStop
	logger.Info("compute driver server stopped")
	return nil
}

func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("socket directory: %w", err)
	}
	if st, err := os.Lstat(path); err == nil {
		if st.Mode().Type() != os.ModeSocket {
			return nil, errdefs.FailedPrecondition(fmt.Sprintf("%s exists and is not a socket", path))
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, errdefs.FailedPrecondition(fmt.Sprintf("socket %s is in use by another server", path))
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove stale socket: %w", err)
		}
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	lis.(*net.UnixListener).SetUnlinkOnClose(false)
	if err := os.Chmod(path, 0o600); err != nil {
		lis.Close()
		_ = os.Remove(path) // best-effort cleanup; the chmod error is reported
		return nil, fmt.Errorf("chmod socket: %w", err)
	}
	return lis, nil
}

// toWire converts a driver error to a gRPC status once; errors of no
// known kind are logged here and reach the client as a generic Internal.
func toWire(logger *slog.Logger, method string, err error) error {
	if err == nil {
		return nil
	}
	if errdefs.Code(err) == codes.Internal {
		logger.Error("compute driver call failed", "method", method, "error", err)
	}
	return errdefs.ToGRPC(err)
}

type server struct {
	computev1.UnimplementedComputeDriverServer
	d      compute.Driver
	logger *slog.Logger
	// serveCtx ends with Serve; open watches end with it so that a
	// graceful stop does not wait for clients to hang up.
	serveCtx context.Context

	bootMu sync.Mutex
	boot   auth.Authenticator // the served driver's, once built
}

func (s *server) GetCapabilities(ctx context.Context, _ *computev1.GetCapabilitiesRequest) (*computev1.GetCapabilitiesResponse, error) {
	c, err := s.d.Capabilities(ctx)
	if err != nil {
		return nil, err
	}
	return &computev1.GetCapabilitiesResponse{
		DriverName: c.DriverName, DriverVersion: c.DriverVersion, DefaultImage: c.DefaultImage,
		GatewayManagesLifecycle: c.GatewayManagesLifecycle,
	}, nil
}

func (s *server) GetGatewayListenerRequirements(ctx context.Context, _ *computev1.GetGatewayListenerRequirementsRequest) (*computev1.GetGatewayListenerRequirementsResponse, error) {
	reqs, err := compute.ListenerRequirements(ctx, s.d)
	if err != nil {
		return nil, err
	}
	out := &computev1.GetGatewayListenerRequirementsResponse{}
	for _, r := range reqs {
		out.Requirements = append(out.Requirements, ListenerRequirementToProto(r))
	}
	return out, nil
}

func (s *server) ValidateSandboxCreate(ctx context.Context, req *computev1.ValidateSandboxCreateRequest) (*computev1.ValidateSandboxCreateResponse, error) {
	sb, err := s.sandboxToCreate(ctx, req.GetSandbox())
	if err != nil {
		return nil, err
	}
	return &computev1.ValidateSandboxCreateResponse{}, s.d.ValidateCreate(ctx, sb)
}

// sandboxToCreate converts a create request's sandbox and refuses template
// fields that need an ability the served driver lacks (compute.CheckTemplate),
// so a separately served driver refuses what the in-process one would.
func (s *server) sandboxToCreate(ctx context.Context, p *computev1.DriverSandbox) (compute.Sandbox, error) {
	sb, err := SandboxFromProto(p)
	if err != nil {
		return compute.Sandbox{}, err
	}
	c, err := s.d.Capabilities(ctx)
	if err != nil {
		return compute.Sandbox{}, err
	}
	return sb, compute.CheckTemplate(s.d, c.DriverName, sb.Spec.Template)
}

func (s *server) CreateSandbox(ctx context.Context, req *computev1.CreateSandboxRequest) (*computev1.CreateSandboxResponse, error) {
	sb, err := s.sandboxToCreate(ctx, req.GetSandbox())
	if err != nil {
		return nil, err
	}
	return &computev1.CreateSandboxResponse{}, s.d.Create(ctx, sb)
}

func (s *server) GetSandbox(ctx context.Context, req *computev1.GetSandboxRequest) (*computev1.GetSandboxResponse, error) {
	sb, err := s.d.Get(ctx, compute.Ref{ID: req.GetSandboxId(), Name: req.GetSandboxName()})
	if err != nil {
		return nil, err
	}
	p, err := SandboxToProto(sb)
	if err != nil {
		return nil, err
	}
	return &computev1.GetSandboxResponse{Sandbox: p}, nil
}

func (s *server) ListSandboxes(ctx context.Context, _ *computev1.ListSandboxesRequest) (*computev1.ListSandboxesResponse, error) {
	list, err := s.d.List(ctx)
	if err != nil {
		return nil, err
	}
	out := &computev1.ListSandboxesResponse{}
	for _, sb := range list {
		p, err := SandboxToProto(sb)
		if err != nil {
			return nil, err
		}
		out.Sandboxes = append(out.Sandboxes, p)
	}
	return out, nil
}

func (s *server) StopSandbox(ctx context.Context, req *computev1.StopSandboxRequest) (*computev1.StopSandboxResponse, error) {
	return &computev1.StopSandboxResponse{}, s.d.Stop(ctx, compute.Ref{ID: req.GetSandboxId(), Name: req.GetSandboxName()})
}

func (s *server) StartSandbox(ctx context.Context, req *computev1.StartSandboxRequest) (*computev1.StartSandboxResponse, error) {
	return &computev1.StartSandboxResponse{}, s.d.Start(ctx, compute.Ref{ID: req.GetSandboxId(), Name: req.GetSandboxName()})
}

func (s *server) DeleteSandbox(ctx context.Context, req *computev1.DeleteSandboxRequest) (*computev1.DeleteSandboxResponse, error) {
	ok, err := s.d.Delete(ctx, compute.Ref{ID: req.GetSandboxId(), Name: req.GetSandboxName()})
	if err != nil {
		return nil, err
	}
	return &computev1.DeleteSandboxResponse{Deleted: ok}, nil
}

func (s *server) EnsureWorkspace(ctx context.Context, req *computev1.EnsureWorkspaceRequest) (*computev1.EnsureWorkspaceResponse, error) {
	return &computev1.EnsureWorkspaceResponse{}, compute.EnsureWorkspace(ctx, s.d, req.GetWorkspace())
}

func (s *server) DeleteWorkspace(ctx context.Context, req *computev1.DeleteWorkspaceRequest) (*computev1.DeleteWorkspaceResponse, error) {
	return &computev1.DeleteWorkspaceResponse{}, compute.DeleteWorkspace(ctx, s.d, req.GetWorkspace())
}

func (s *server) AdoptSandbox(ctx context.Context, req *computev1.AdoptSandboxRequest) (*computev1.AdoptSandboxResponse, error) {
	a, ok := s.d.(compute.Adopter)
	if !ok {
		return nil, errdefs.Unimplemented("compute driver does not support adoption")
	}
	if err := a.AdoptionEnabled(ctx); err != nil {
		return nil, err
	}
	if req.GetSandbox() == nil && req.GetDryRun() {
		return &computev1.AdoptSandboxResponse{}, nil // the AdoptionEnabled probe
	}
	sb, err := SandboxFromProto(req.GetSandbox())
	if err != nil {
		return nil, err
	}
	res, err := a.Adopt(ctx, compute.AdoptRequest{
		Sandbox: sb, Namespace: req.GetNamespace(), AgentContainer: req.GetAgentContainer(),
		Reenrich: req.GetReenrich(), DryRun: req.GetDryRun(),
	})
	if err != nil {
		return nil, err
	}
	p, err := SandboxToProto(res.Sandbox)
	if err != nil {
		return nil, err
	}
	return &computev1.AdoptSandboxResponse{Sandbox: p, BackendUid: res.BackendUID}, nil
}

func (s *server) WatchSandboxes(_ *computev1.WatchSandboxesRequest, stream grpc.ServerStreamingServer[computev1.WatchSandboxesEvent]) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	defer context.AfterFunc(s.serveCtx, cancel)()
	ch, watchErr, err := s.d.Watch(ctx)
	if err != nil {
		return err
	}
	drain := func() {
		cancel()
		for range ch {
		}
		_ = watchErr()
	}
	// Subscribed: tell the client, so it can rely on seeing every later change.
	if err := stream.SendHeader(metadata.MD{}); err != nil {
		drain()
		return err
	}
	for ev := range ch {
		msg, err := EventToProto(ev)
		if err != nil {
			s.logger.Warn("dropping unconvertible watch event", "sandbox_id", ev.SandboxID, "error", err)
			continue
		}
		if err := stream.Send(msg); err != nil {
			drain()
			return err
		}
	}
	if err := watchErr(); err != nil {
		return err
	}
	if stream.Context().Err() != nil {
		return nil
	}
	return errdefs.Unavailable("compute driver server is shutting down")
}
