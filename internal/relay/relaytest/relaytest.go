// Package relaytest provides a gateway stand-in for tests of the relay
// protocol: a real gRPC server on a Unix socket that serves the supervisor
// RPCs (ConnectSupervisor and RelayStream through relay.Registry, plus
// GetSandboxConfig, UpdateConfig, ReportPolicyStatus, PushSandboxLogs,
// ReportMainProcessExit, IssueSandboxToken and RefreshSandboxToken) with a
// trivial bearer-token → sandbox-id authenticator.
//
// It records what supervisors report so tests can assert on it. All
// methods are safe for concurrent use.
package relaytest

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/relay"
)

// Options configure a Gateway.
type Options struct {
	// Relay is the registry configuration; SandboxExists and
	// OnSessionChange are wrapped by the Gateway.
	Relay relay.Config
	// TokenTTL, when positive, makes minted tokens expire (exp claim).
	TokenTTL time.Duration
	Logger   *slog.Logger
	// TCP serves on a loopback TCP port instead of a Unix socket.
	TCP bool
	// TLS, when set (with TCP), serves gRPC over TLS.
	TLS *tls.Config
}

// Presence is one OnSessionChange call.
type Presence struct {
	SandboxID  string
	Connected  bool
	InstanceID string
}

// Gateway is the stand-in. Create it with Start.
type Gateway struct {
	opts     Options
	sockPath string
	tcpAddr  string // after the first start, restarts reuse it

	mu        sync.Mutex
	registry  *relay.Registry
	srv       *grpc.Server
	srvDone   chan struct{}
	tokens    map[string]string // bearer token → sandbox id
	saTokens  map[string]string // service account token → sandbox id
	sandboxes map[string]bool
	policies  map[string]*sandboxv1.SandboxPolicy
	policyVer map[string]uint32
	statuses  []*openshellv1.ReportPolicyStatusRequest
	logs      []*openshellv1.SandboxLogLine
	exits     []*openshellv1.ReportMainProcessExitRequest
	presence  []Presence
	refreshes int
	changed   chan struct{}
}

// Start starts a Gateway on a Unix socket; it stops at test cleanup.
func Start(t testing.TB, opts Options) *Gateway {
	t.Helper()
	dir, err := os.MkdirTemp("", "relaytest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	g := &Gateway{
		opts:      opts,
		sockPath:  filepath.Join(dir, "gw.sock"),
		tokens:    map[string]string{},
		saTokens:  map[string]string{},
		sandboxes: map[string]bool{},
		policies:  map[string]*sandboxv1.SandboxPolicy{},
		policyVer: map[string]uint32{},
		changed:   make(chan struct{}),
	}
	if err := g.serve(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Stop)
	return g
}

// Endpoint is the supervisor's OPENSHELL_ENDPOINT for this gateway.
func (g *Gateway) Endpoint() string {
	switch {
	case !g.opts.TCP:
		return "unix://" + g.sockPath
	case g.opts.TLS != nil:
		return "https://" + g.tcpAddr
	}
	return "http://" + g.tcpAddr
}

// Registry is the live relay registry (a new one after Restart).
func (g *Gateway) Registry() *relay.Registry {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.registry
}

// Dial returns a client connection to the gateway (no credentials).
func (g *Gateway) Dial(t testing.TB) *grpc.ClientConn {
	t.Helper()
	target := "unix://" + g.sockPath
	if g.opts.TCP {
		if g.opts.TLS != nil {
			t.Fatal("relaytest: Dial does not support TLS")
		}
		target = "passthrough:///" + g.tcpAddr
	}
	cc, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecureCreds()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// WithToken returns ctx carrying "authorization: Bearer token".
func WithToken(ctx context.Context, token string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

func (g *Gateway) listen() (net.Listener, error) {
	if g.opts.TCP {
		addr := g.tcpAddr
		if addr == "" {
			addr = "127.0.0.1:0"
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, err
		}
		g.tcpAddr = l.Addr().String()
		return l, nil
	}
	if err := os.Remove(g.sockPath); err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	return net.Listen("unix", g.sockPath)
}

func (g *Gateway) serve() error {
	l, err := g.listen()
	if err != nil {
		return err
	}
	rc := g.opts.Relay
	rc.Logger = g.opts.Logger
	userHook := rc.OnSessionChange
	rc.SandboxExists = func(ctx context.Context, id string) error {
		g.mu.Lock()
		defer g.mu.Unlock()
		if !g.sandboxes[id] {
			return fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
		}
		return nil
	}
	rc.OnSessionChange = func(id string, connected bool, instance string) {
		g.record(func() { g.presence = append(g.presence, Presence{id, connected, instance}) })
		if userHook != nil {
			userHook(id, connected, instance)
		}
	}
	reg := relay.New(rc)
	var serverOpts []grpc.ServerOption
	if g.opts.TLS != nil {
		serverOpts = append(serverOpts, grpc.Creds(credentials.NewTLS(g.opts.TLS)))
	}
	srv := grpc.NewServer(append(serverOpts,
		grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			resp, err := h(g.authenticate(ctx), req)
			return resp, errdefs.ToGRPC(err)
		}),
		grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			return errdefs.ToGRPC(h(srv, &authStream{ss, g.authenticate(ss.Context())}))
		}),
	)...)
	openshellv1.RegisterOpenShellServer(srv, &service{g: g})
	done := make(chan struct{})
	g.mu.Lock()
	g.registry, g.srv, g.srvDone = reg, srv, done
	g.mu.Unlock()
	go func() {
		defer close(done)
		srv.Serve(l) //nolint:errcheck // ends at Stop
	}()
	return nil
}

// Stop stops the server and its registry.
func (g *Gateway) Stop() {
	g.mu.Lock()
	srv, reg, done := g.srv, g.registry, g.srvDone
	g.srv = nil
	g.mu.Unlock()
	if srv == nil {
		return
	}
	reg.Close()
	srv.Stop()
	<-done
}

// Restart stops the server and starts a new one with a fresh registry on
// the same socket, keeping recorded state and tokens.
func (g *Gateway) Restart(t testing.TB) {
	t.Helper()
	g.Stop()
	if err := g.serve(); err != nil {
		t.Fatal(err)
	}
}

// AddSandbox registers a sandbox and returns a bearer token for it.
func (g *Gateway) AddSandbox(id string) string {
	tok := g.mint(id)
	g.mu.Lock()
	g.sandboxes[id] = true
	g.mu.Unlock()
	return tok
}

// AddServiceAccountToken makes sa exchangeable for a token of sandbox id.
func (g *Gateway) AddServiceAccountToken(sa, id string) {
	g.mu.Lock()
	g.saTokens[sa] = id
	g.mu.Unlock()
}

// SetPolicy stores a policy for a sandbox.
func (g *Gateway) SetPolicy(id string, p *sandboxv1.SandboxPolicy) {
	g.record(func() {
		g.policies[id] = p
		g.policyVer[id]++
	})
}

// mint returns an unsigned JWT-shaped token (the stand-in only looks it up).
func (g *Gateway) mint(id string) string {
	now := time.Now()
	claims := map[string]any{"sub": "spiffe://openshell/sandbox/" + id, "sandbox_id": id, "iat": now.Unix(), "jti": uuid.NewString()}
	if g.opts.TokenTTL > 0 {
		claims["exp"] = now.Add(g.opts.TokenTTL).Unix()
	} else {
		claims["exp"] = 0
	}
	b, _ := json.Marshal(claims)
	enc := base64.RawURLEncoding
	tok := enc.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`)) + "." + enc.EncodeToString(b) + ".x"
	g.mu.Lock()
	g.tokens[tok] = id
	g.mu.Unlock()
	return tok
}

func (g *Gateway) record(f func()) {
	g.mu.Lock()
	f()
	close(g.changed)
	g.changed = make(chan struct{})
	g.mu.Unlock()
}

// WaitFor polls cond (under the gateway's lock, on every recorded change)
// until it holds or timeout passes.
func (g *Gateway) WaitFor(t testing.TB, timeout time.Duration, what string, cond func(s *State) bool) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		g.mu.Lock()
		ok := cond(&State{g})
		ch := g.changed
		g.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
	}
}

// State is the recorded state, read inside WaitFor.
type State struct{ g *Gateway }

func (s *State) Logs() []*openshellv1.SandboxLogLine                { return s.g.logs }
func (s *State) Exits() []*openshellv1.ReportMainProcessExitRequest { return s.g.exits }
func (s *State) Presence() []Presence                               { return s.g.presence }
func (s *State) Statuses() []*openshellv1.ReportPolicyStatusRequest { return s.g.statuses }
func (s *State) Refreshes() int                                     { return s.g.refreshes }
func (s *State) Policy(id string) *sandboxv1.SandboxPolicy          { return s.g.policies[id] }

// Connected reports the last presence event of id.
func (s *State) Connected(id string) bool {
	for i := len(s.g.presence) - 1; i >= 0; i-- {
		if s.g.presence[i].SandboxID == id {
			return s.g.presence[i].Connected
		}
	}
	return false
}

// HasLog reports whether a log line of id contains substr.
func (s *State) HasLog(id, substr string) bool {
	for _, l := range s.g.logs {
		if l.GetSandboxId() == id && strings.Contains(l.GetMessage(), substr) {
			return true
		}
	}
	return false
}

func (g *Gateway) authenticate(ctx context.Context) context.Context {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("authorization") {
		tok, ok := strings.CutPrefix(v, "Bearer ")
		if !ok {
			continue
		}
		g.mu.Lock()
		id, isJWT := g.tokens[tok]
		saID, isSA := g.saTokens[tok]
		g.mu.Unlock()
		switch {
		case isJWT:
			return auth.NewContext(ctx, &auth.Principal{Kind: auth.KindSandbox, Source: auth.SourceSandboxJWT, Subject: "spiffe://openshell/sandbox/" + id, SandboxID: id})
		case isSA:
			return auth.NewContext(ctx, &auth.Principal{Kind: auth.KindSandbox, Source: auth.SourceK8sSABootstrap, Subject: "sa", SandboxID: saID})
		}
	}
	return ctx
}

type authStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *authStream) Context() context.Context { return s.ctx }

// sandboxPrincipal returns the principal's sandbox id or Unauthenticated.
func sandboxPrincipal(ctx context.Context) (string, error) {
	p, ok := auth.FromContext(ctx)
	if !ok || !p.IsSandbox() {
		return "", errdefs.Unauthenticated("this method requires a sandbox principal")
	}
	return p.SandboxID, nil
}

func ensureScope(ctx context.Context, id string) error {
	pid, err := sandboxPrincipal(ctx)
	if err != nil {
		return err
	}
	if pid != id {
		return errdefs.PermissionDenied("cross-sandbox access denied: principal does not own this sandbox")
	}
	return nil
}

type service struct {
	openshellv1.UnimplementedOpenShellServer
	g *Gateway
}

func (s *service) ConnectSupervisor(stream openshellv1.OpenShell_ConnectSupervisorServer) error {
	return s.g.Registry().HandleConnect(stream, relay.PrincipalSandboxID(stream.Context()))
}

func (s *service) RelayStream(stream openshellv1.OpenShell_RelayStreamServer) error {
	return s.g.Registry().HandleRelayStream(stream, relay.PrincipalSandboxID(stream.Context()))
}

func (s *service) GetSandboxConfig(ctx context.Context, req *sandboxv1.GetSandboxConfigRequest) (*sandboxv1.GetSandboxConfigResponse, error) {
	if err := ensureScope(ctx, req.GetSandboxId()); err != nil {
		return nil, err
	}
	s.g.mu.Lock()
	defer s.g.mu.Unlock()
	if !s.g.sandboxes[req.GetSandboxId()] {
		return nil, errdefs.NotFound("sandbox not found")
	}
	resp := &sandboxv1.GetSandboxConfigResponse{Version: s.g.policyVer[req.GetSandboxId()]}
	if p := s.g.policies[req.GetSandboxId()]; p != nil {
		resp.Policy = proto.Clone(p).(*sandboxv1.SandboxPolicy)
	}
	return resp, nil
}

func (s *service) UpdateConfig(ctx context.Context, req *openshellv1.UpdateConfigRequest) (*openshellv1.UpdateConfigResponse, error) {
	// The stand-in names sandboxes by id.
	if err := ensureScope(ctx, req.GetName()); err != nil {
		return nil, err
	}
	if req.GetPolicy() == nil {
		return nil, errdefs.InvalidArgument("policy is required")
	}
	s.g.SetPolicy(req.GetName(), req.GetPolicy())
	s.g.mu.Lock()
	defer s.g.mu.Unlock()
	return &openshellv1.UpdateConfigResponse{Version: s.g.policyVer[req.GetName()]}, nil
}

func (s *service) ReportPolicyStatus(ctx context.Context, req *openshellv1.ReportPolicyStatusRequest) (*openshellv1.ReportPolicyStatusResponse, error) {
	if err := ensureScope(ctx, req.GetSandboxId()); err != nil {
		return nil, err
	}
	s.g.record(func() { s.g.statuses = append(s.g.statuses, req) })
	return &openshellv1.ReportPolicyStatusResponse{}, nil
}

func (s *service) PushSandboxLogs(stream openshellv1.OpenShell_PushSandboxLogsServer) error {
	for {
		req, err := stream.Recv()
		if err != nil {
			return stream.SendAndClose(&openshellv1.PushSandboxLogsResponse{})
		}
		if err := ensureScope(stream.Context(), req.GetSandboxId()); err != nil {
			return err
		}
		s.g.record(func() { s.g.logs = append(s.g.logs, req.GetLogs()...) })
	}
}

func (s *service) ReportMainProcessExit(ctx context.Context, req *openshellv1.ReportMainProcessExitRequest) (*openshellv1.ReportMainProcessExitResponse, error) {
	if req.GetSandboxId() == "" || req.GetInstanceId() == "" {
		return nil, errdefs.InvalidArgument("sandbox_id and instance_id are required")
	}
	if err := ensureScope(ctx, req.GetSandboxId()); err != nil {
		return nil, err
	}
	s.g.record(func() { s.g.exits = append(s.g.exits, req) })
	return &openshellv1.ReportMainProcessExitResponse{}, nil
}

func (s *service) IssueSandboxToken(ctx context.Context, _ *openshellv1.IssueSandboxTokenRequest) (*openshellv1.IssueSandboxTokenResponse, error) {
	p, ok := auth.FromContext(ctx)
	if !ok || p.Source != auth.SourceK8sSABootstrap {
		return nil, errdefs.PermissionDenied("this principal cannot mint a sandbox token; use RefreshSandboxToken")
	}
	return &openshellv1.IssueSandboxTokenResponse{Token: s.g.mint(p.SandboxID)}, nil
}

func (s *service) RefreshSandboxToken(ctx context.Context, _ *openshellv1.RefreshSandboxTokenRequest) (*openshellv1.RefreshSandboxTokenResponse, error) {
	id, err := sandboxPrincipal(ctx)
	if err != nil {
		return nil, err
	}
	tok := s.g.mint(id)
	s.g.record(func() { s.g.refreshes++ })
	return &openshellv1.RefreshSandboxTokenResponse{Token: tok}, nil
}
