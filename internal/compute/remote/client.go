package remote

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	computev1 "github.com/openshell-go/openshell/api/openshell/compute/v1"
	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/telemetry"
)

// DialTimeout bounds how long Dial waits for the driver socket to answer.
const DialTimeout = 30 * time.Second

// maxMsgSize matches the gateway's gRPC decode limit.
const maxMsgSize = 4 << 20

// Driver is a compute.Driver served by another process. It is safe for
// concurrent use; Close ends its watches and the connection.
type Driver struct {
	logger *slog.Logger
	conn   *grpc.ClientConn
	c      computev1.ComputeDriverClient
	wg     sync.WaitGroup // watch readers
}

var (
	_ compute.Driver                 = (*Driver)(nil)
	_ compute.WorkspaceScoper        = (*Driver)(nil)
	_ compute.Adopter                = (*Driver)(nil)
	_ compute.ServiceAccountSelector = (*Driver)(nil)
	_ compute.ListenerRequirer       = (*Driver)(nil)
	_ io.Closer                      = (*Driver)(nil)
)

// Dial connects to the compute driver serving on socketPath, retrying
// until it answers GetCapabilities or DialTimeout (or ctx) expires; then
// it fails with Unavailable.
func Dial(ctx context.Context, socketPath string, logger *slog.Logger) (*Driver, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	abs, err := filepath.Abs(socketPath)
	if err != nil {
		return nil, fmt.Errorf("compute driver socket %q: %w", socketPath, err)
	}
	conn, err := grpc.NewClient("unix://"+abs,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: time.Second,
		}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMsgSize), grpc.MaxCallSendMsgSize(maxMsgSize)),
		grpc.WithChainUnaryInterceptor(telemetry.UnaryClientInterceptor()), grpc.WithChainStreamInterceptor(telemetry.StreamClientInterceptor()),
	)
	if err != nil {
		return nil, fmt.Errorf("compute driver socket %q: %w", abs, err)
	}
	d := &Driver{logger: logger.With("component", "compute/remote", "socket", abs), conn: conn, c: computev1.NewComputeDriverClient(conn)}
	wctx, cancel := context.WithTimeout(ctx, DialTimeout)
	defer cancel()
	caps, err := d.c.GetCapabilities(wctx, &computev1.GetCapabilitiesRequest{}, grpc.WaitForReady(true))
	if err != nil {
		conn.Close()
		if s, ok := status.FromError(err); ok && (s.Code() == codes.DeadlineExceeded || s.Code() == codes.Canceled || s.Code() == codes.Unavailable) {
			return nil, errdefs.Unavailable(fmt.Sprintf("compute driver socket %s did not answer: %v", abs, s.Message()))
		}
		return nil, errdefs.FromGRPC(err)
	}
	d.logger.Info("connected to compute driver", "driver", caps.GetDriverName(), "version", caps.GetDriverVersion())
	return d, nil
}

// Close closes the connection and joins the watch readers.
func (d *Driver) Close() error {
	err := d.conn.Close()
	d.wg.Wait()
	return err
}

func fromWire(err error) error { return errdefs.FromGRPC(err) }

// Capabilities implements compute.Driver.
func (d *Driver) Capabilities(ctx context.Context) (compute.Capabilities, error) {
	r, err := d.c.GetCapabilities(ctx, &computev1.GetCapabilitiesRequest{})
	if err != nil {
		return compute.Capabilities{}, fromWire(err)
	}
	return CapabilitiesFromProto(r), nil
}

// SelectsServiceAccounts implements compute.ServiceAccountSelector by
// forwarding: the serving side refuses template.service_account_name when
// the driver it serves cannot select ServiceAccounts.
func (d *Driver) SelectsServiceAccounts() {}

// ListenerRequirements implements compute.ListenerRequirer; a served
// driver without the ability answers none.
func (d *Driver) ListenerRequirements(ctx context.Context) ([]compute.ListenerRequirement, error) {
	r, err := d.c.GetGatewayListenerRequirements(ctx, &computev1.GetGatewayListenerRequirementsRequest{})
	if err != nil {
		return nil, fromWire(err)
	}
	var out []compute.ListenerRequirement
	for _, p := range r.GetRequirements() {
		out = append(out, ListenerRequirementFromProto(p))
	}
	return out, nil
}

// ValidateCreate implements compute.Driver.
func (d *Driver) ValidateCreate(ctx context.Context, sb compute.Sandbox) error {
	p, err := SandboxToProto(sb)
	if err != nil {
		return err
	}
	_, err = d.c.ValidateSandboxCreate(ctx, &computev1.ValidateSandboxCreateRequest{Sandbox: p})
	return fromWire(err)
}

// Create implements compute.Driver.
func (d *Driver) Create(ctx context.Context, sb compute.Sandbox) error {
	p, err := SandboxToProto(sb)
	if err != nil {
		return err
	}
	_, err = d.c.CreateSandbox(ctx, &computev1.CreateSandboxRequest{Sandbox: p})
	return fromWire(err)
}

// Get implements compute.Driver.
func (d *Driver) Get(ctx context.Context, ref compute.Ref) (compute.Sandbox, error) {
	r, err := d.c.GetSandbox(ctx, &computev1.GetSandboxRequest{SandboxId: ref.ID, SandboxName: ref.Name})
	if err != nil {
		return compute.Sandbox{}, fromWire(err)
	}
	return SandboxViewFromProto(r.GetSandbox())
}

// List implements compute.Driver.
func (d *Driver) List(ctx context.Context) ([]compute.Sandbox, error) {
	r, err := d.c.ListSandboxes(ctx, &computev1.ListSandboxesRequest{})
	if err != nil {
		return nil, fromWire(err)
	}
	out := make([]compute.Sandbox, 0, len(r.GetSandboxes()))
	for _, p := range r.GetSandboxes() {
		sb, err := SandboxViewFromProto(p)
		if err != nil {
			return nil, err
		}
		out = append(out, sb)
	}
	return out, nil
}

// Stop implements compute.Driver.
func (d *Driver) Stop(ctx context.Context, ref compute.Ref) error {
	_, err := d.c.StopSandbox(ctx, &computev1.StopSandboxRequest{SandboxId: ref.ID, SandboxName: ref.Name})
	return fromWire(err)
}

// Start implements compute.Driver.
func (d *Driver) Start(ctx context.Context, ref compute.Ref) error {
	_, err := d.c.StartSandbox(ctx, &computev1.StartSandboxRequest{SandboxId: ref.ID, SandboxName: ref.Name})
	return fromWire(err)
}

// Delete implements compute.Driver.
func (d *Driver) Delete(ctx context.Context, ref compute.Ref) (bool, error) {
	r, err := d.c.DeleteSandbox(ctx, &computev1.DeleteSandboxRequest{SandboxId: ref.ID, SandboxName: ref.Name})
	if err != nil {
		return false, fromWire(err)
	}
	return r.GetDeleted(), nil
}

// EnsureWorkspace implements compute.WorkspaceScoper; the serving side
// makes it a no-op for a driver without workspace scoping.
func (d *Driver) EnsureWorkspace(ctx context.Context, workspace string) error {
	_, err := d.c.EnsureWorkspace(ctx, &computev1.EnsureWorkspaceRequest{Workspace: workspace})
	return fromWire(err)
}

// DeleteWorkspace implements compute.WorkspaceScoper (see EnsureWorkspace).
func (d *Driver) DeleteWorkspace(ctx context.Context, workspace string) error {
	_, err := d.c.DeleteWorkspace(ctx, &computev1.DeleteWorkspaceRequest{Workspace: workspace})
	return fromWire(err)
}

// AdoptionEnabled implements compute.Adopter: an AdoptSandbox dry run
// without a sandbox, which asks only that. A served driver that cannot
// adopt answers errdefs.ErrUnimplemented.
func (d *Driver) AdoptionEnabled(ctx context.Context) error {
	_, err := d.c.AdoptSandbox(ctx, &computev1.AdoptSandboxRequest{DryRun: true})
	return fromWire(err)
}

// Adopt implements compute.Adopter; a remote driver that cannot adopt
// answers errdefs.ErrUnimplemented.
func (d *Driver) Adopt(ctx context.Context, req compute.AdoptRequest) (compute.AdoptResult, error) {
	p, err := SandboxToProto(req.Sandbox)
	if err != nil {
		return compute.AdoptResult{}, err
	}
	r, err := d.c.AdoptSandbox(ctx, &computev1.AdoptSandboxRequest{
		Sandbox: p, Namespace: req.Namespace, AgentContainer: req.AgentContainer, Reenrich: req.Reenrich, DryRun: req.DryRun,
	})
	if err != nil {
		return compute.AdoptResult{}, fromWire(err)
	}
	sb, err := SandboxViewFromProto(r.GetSandbox())
	if err != nil {
		return compute.AdoptResult{}, err
	}
	return compute.AdoptResult{Sandbox: sb, BackendUID: r.GetBackendUid()}, nil
}

// Watch implements compute.Driver. It returns once the remote driver has
// subscribed (the server sends stream headers after subscribing), so no
// change made after Watch returns is missed.
func (d *Driver) Watch(ctx context.Context) (<-chan compute.Event, func() error, error) {
	ctx, cancel := context.WithCancel(ctx)
	stream, err := d.c.WatchSandboxes(ctx, &computev1.WatchSandboxesRequest{})
	if err != nil {
		cancel()
		return nil, nil, fromWire(err)
	}
	md, err := stream.Header()
	if err == nil && md == nil {
		// Ended without headers: the driver refused the watch.
		_, err = stream.Recv()
		if err == nil || errors.Is(err, io.EOF) {
			err = errdefs.Unavailable("remote compute driver ended the watch")
		}
	}
	if err != nil {
		cancel()
		return nil, nil, fromWire(err)
	}
	ch := make(chan compute.Event)
	done := make(chan struct{})
	var watchErr error
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		defer close(done)
		defer close(ch)
		defer cancel()
		for {
			msg, err := stream.Recv()
			if err != nil {
				switch {
				case ctx.Err() != nil:
					// The caller ended the watch.
				case errors.Is(err, io.EOF):
					watchErr = errdefs.Unavailable("remote compute driver ended the watch")
				default:
					watchErr = fromWire(err)
				}
				return
			}
			ev, err := EventFromProto(msg)
			if err != nil {
				d.logger.Warn("dropping malformed watch event", "error", err)
				continue
			}
			select {
			case ch <- ev:
			case <-ctx.Done():
			}
		}
	}()
	return ch, func() error { <-done; return watchErr }, nil
}
