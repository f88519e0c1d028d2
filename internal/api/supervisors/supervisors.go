// Package supervisors implements the RPCs of a sandbox supervisor's
// session with the gateway: ConnectSupervisor (the long-lived session
// stream), RelayStream (the bytes of one relay the gateway asked for) and
// ReportMainProcessExit. Only a sandbox principal may hold a session or
// carry a relay, and only for its own sandbox.
package supervisors

import (
	"context"
	"fmt"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/api/authz"
	"github.com/openshell-go/openshell/internal/lifecycle"
	"github.com/openshell-go/openshell/internal/relay"
)

// Options wire a Service.
type Options struct {
	Engine *lifecycle.Engine
	Relay  *relay.Registry
	// GatewayLog appends a gateway-sourced line to a sandbox's log; nil
	// drops it.
	GatewayLog func(sandboxID, level, msg string)
}

// Service implements the supervisor session RPCs. It is safe for
// concurrent use.
type Service struct{ o Options }

// New returns a Service.
func New(o Options) *Service {
	if o.GatewayLog == nil {
		o.GatewayLog = func(string, string, string) {}
	}
	return &Service{o: o}
}

// ConnectSupervisor holds a supervisor's session stream.
func (s *Service) ConnectSupervisor(stream openshellv1.OpenShell_ConnectSupervisorServer) error {
	id, err := authz.RequireSandboxPrincipal(stream.Context())
	if err != nil {
		return err
	}
	return s.o.Relay.HandleConnect(stream, id)
}

// RelayStream carries the bytes of one relay opened by the gateway.
func (s *Service) RelayStream(stream openshellv1.OpenShell_RelayStreamServer) error {
	id, err := authz.RequireSandboxPrincipal(stream.Context())
	if err != nil {
		return err
	}
	return s.o.Relay.HandleRelayStream(stream, id)
}

// ReportMainProcessExit records the exit of the sandbox's main process
// (its own supervisor only).
func (s *Service) ReportMainProcessExit(ctx context.Context, req *openshellv1.ReportMainProcessExitRequest) (*openshellv1.ReportMainProcessExitResponse, error) {
	if err := authz.RequireOwnSandbox(ctx, req.GetSandboxId()); err != nil {
		return nil, err
	}
	if err := s.o.Engine.ReportMainProcessExit(ctx, req.GetSandboxId(), req.GetInstanceId(), req.GetExitCode()); err != nil {
		return nil, err
	}
	s.o.GatewayLog(req.GetSandboxId(), "warn", fmt.Sprintf("main process exited with code %d", req.GetExitCode()))
	return &openshellv1.ReportMainProcessExitResponse{}, nil
}
