package cli

import (
	"bytes"
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// fakeGateway is a hand-written fake of the OpenShell service for CLI unit
// tests: each RPC the CLI calls is a func field; an unset field answers
// Unimplemented. It is served over real gRPC on loopback.
type fakeGateway struct {
	openshellv1.UnimplementedOpenShellServer

	health         func(context.Context, *openshellv1.HealthRequest) (*openshellv1.HealthResponse, error)
	getGatewayInfo func(context.Context, *openshellv1.GetGatewayInfoRequest) (*openshellv1.GetGatewayInfoResponse, error)
	getCurrentUser func(context.Context, *openshellv1.GetCurrentUserRequest) (*openshellv1.GetCurrentUserResponse, error)
	createSandbox  func(context.Context, *openshellv1.CreateSandboxRequest) (*openshellv1.SandboxResponse, error)
	getSandbox     func(context.Context, *openshellv1.GetSandboxRequest) (*openshellv1.SandboxResponse, error)
	listSandboxes  func(context.Context, *openshellv1.ListSandboxesRequest) (*openshellv1.ListSandboxesResponse, error)
	deleteSandbox  func(context.Context, *openshellv1.DeleteSandboxRequest) (*openshellv1.DeleteSandboxResponse, error)
	createSSH      func(context.Context, *openshellv1.CreateSshSessionRequest) (*openshellv1.CreateSshSessionResponse, error)
	execSandbox    func(*openshellv1.ExecSandboxRequest, grpc.ServerStreamingServer[openshellv1.ExecSandboxEvent]) error
	execInteract   func(grpc.BidiStreamingServer[openshellv1.ExecSandboxInput, openshellv1.ExecSandboxEvent]) error
	forwardTCP     func(grpc.BidiStreamingServer[openshellv1.TcpForwardFrame, openshellv1.TcpForwardFrame]) error
	watchSandbox   func(*openshellv1.WatchSandboxRequest, grpc.ServerStreamingServer[openshellv1.SandboxStreamEvent]) error
	getLogs        func(context.Context, *openshellv1.GetSandboxLogsRequest) (*openshellv1.GetSandboxLogsResponse, error)

	mu    sync.Mutex
	calls []string
}

func (f *fakeGateway) record(m string) {
	f.mu.Lock()
	f.calls = append(f.calls, m)
	f.mu.Unlock()
}

func (f *fakeGateway) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

func unimpl(m string) error {
	return status.Errorf(codes.Unimplemented, "%s is not implemented by the fake", m)
}

func (f *fakeGateway) Health(ctx context.Context, r *openshellv1.HealthRequest) (*openshellv1.HealthResponse, error) {
	f.record("Health")
	if f.health == nil {
		return &openshellv1.HealthResponse{Status: openshellv1.ServiceStatus_SERVICE_STATUS_HEALTHY, Version: "v9.9.9-fake"}, nil
	}
	return f.health(ctx, r)
}

func (f *fakeGateway) GetGatewayInfo(ctx context.Context, r *openshellv1.GetGatewayInfoRequest) (*openshellv1.GetGatewayInfoResponse, error) {
	f.record("GetGatewayInfo")
	if f.getGatewayInfo == nil {
		return nil, unimpl("GetGatewayInfo")
	}
	return f.getGatewayInfo(ctx, r)
}

func (f *fakeGateway) GetCurrentUser(ctx context.Context, r *openshellv1.GetCurrentUserRequest) (*openshellv1.GetCurrentUserResponse, error) {
	f.record("GetCurrentUser")
	if f.getCurrentUser == nil {
		return nil, unimpl("GetCurrentUser")
	}
	return f.getCurrentUser(ctx, r)
}

func (f *fakeGateway) CreateSandbox(ctx context.Context, r *openshellv1.CreateSandboxRequest) (*openshellv1.SandboxResponse, error) {
	f.record("CreateSandbox")
	if f.createSandbox == nil {
		return nil, unimpl("CreateSandbox")
	}
	return f.createSandbox(ctx, r)
}

func (f *fakeGateway) GetSandbox(ctx context.Context, r *openshellv1.GetSandboxRequest) (*openshellv1.SandboxResponse, error) {
	f.record("GetSandbox")
	if f.getSandbox == nil {
		return nil, unimpl("GetSandbox")
	}
	return f.getSandbox(ctx, r)
}

func (f *fakeGateway) ListSandboxes(ctx context.Context, r *openshellv1.ListSandboxesRequest) (*openshellv1.ListSandboxesResponse, error) {
	f.record("ListSandboxes")
	if f.listSandboxes == nil {
		return nil, unimpl("ListSandboxes")
	}
	return f.listSandboxes(ctx, r)
}

func (f *fakeGateway) DeleteSandbox(ctx context.Context, r *openshellv1.DeleteSandboxRequest) (*openshellv1.DeleteSandboxResponse, error) {
	f.record("DeleteSandbox")
	if f.deleteSandbox == nil {
		return nil, unimpl("DeleteSandbox")
	}
	return f.deleteSandbox(ctx, r)
}

func (f *fakeGateway) CreateSshSession(ctx context.Context, r *openshellv1.CreateSshSessionRequest) (*openshellv1.CreateSshSessionResponse, error) {
	f.record("CreateSshSession")
	if f.createSSH == nil {
		return &openshellv1.CreateSshSessionResponse{SandboxId: r.GetSandboxId(), Token: "tok-" + r.GetSandboxId()}, nil
	}
	return f.createSSH(ctx, r)
}

func (f *fakeGateway) ExecSandbox(r *openshellv1.ExecSandboxRequest, s grpc.ServerStreamingServer[openshellv1.ExecSandboxEvent]) error {
	f.record("ExecSandbox")
	if f.execSandbox == nil {
		return unimpl("ExecSandbox")
	}
	return f.execSandbox(r, s)
}

func (f *fakeGateway) ExecSandboxInteractive(s grpc.BidiStreamingServer[openshellv1.ExecSandboxInput, openshellv1.ExecSandboxEvent]) error {
	f.record("ExecSandboxInteractive")
	if f.execInteract == nil {
		return unimpl("ExecSandboxInteractive")
	}
	return f.execInteract(s)
}

func (f *fakeGateway) ForwardTcp(s grpc.BidiStreamingServer[openshellv1.TcpForwardFrame, openshellv1.TcpForwardFrame]) error {
	f.record("ForwardTcp")
	if f.forwardTCP == nil {
		return unimpl("ForwardTcp")
	}
	return f.forwardTCP(s)
}

func (f *fakeGateway) WatchSandbox(r *openshellv1.WatchSandboxRequest, s grpc.ServerStreamingServer[openshellv1.SandboxStreamEvent]) error {
	f.record("WatchSandbox")
	if f.watchSandbox == nil {
		return unimpl("WatchSandbox")
	}
	return f.watchSandbox(r, s)
}

func (f *fakeGateway) GetSandboxLogs(ctx context.Context, r *openshellv1.GetSandboxLogsRequest) (*openshellv1.GetSandboxLogsResponse, error) {
	f.record("GetSandboxLogs")
	if f.getLogs == nil {
		return nil, unimpl("GetSandboxLogs")
	}
	return f.getLogs(ctx, r)
}

// serve starts f on a loopback port and returns its http:// endpoint.
func (f *fakeGateway) serve(t testing.TB) string {
	t.Helper()
	return serveOpenShell(t, f)
}

// serveOpenShell serves srv over gRPC on loopback until the test ends and
// returns its endpoint.
func serveOpenShell(t testing.TB, impl openshellv1.OpenShellServer) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	srv := grpc.NewServer()
	openshellv1.RegisterOpenShellServer(srv, impl)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return "http://" + ln.Addr().String()
}

// fixedNow is the clock of golden tests.
var fixedNow = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

func testSandbox(name string, phase openshellv1.SandboxPhase) *openshellv1.Sandbox {
	return &openshellv1.Sandbox{
		Metadata: &datamodelv1.ObjectMeta{
			Id: "id-" + name, Name: name, Workspace: "default",
			CreatedAtMs: fixedNow.Add(-90 * time.Minute).UnixMilli(), Labels: map[string]string{"team": "ml", "env": "dev"},
			ResourceVersion: 3,
		},
		Spec: &openshellv1.SandboxSpec{
			Template: &openshellv1.SandboxTemplate{Image: "ghcr.io/example/base:1"},
			Command:  []string{"/bin/bash", "-l"}, Tty: true,
		},
		Status: &openshellv1.SandboxStatus{
			Phase: phase,
			Conditions: []*openshellv1.SandboxCondition{{
				Type: "Ready", Status: "True", Reason: "DependenciesReady", Message: "Supervisor session connected",
				LastTransitionTime: "2026-11-01T10:31:00Z",
			}},
		},
	}
}

// tester runs the CLI in-process with a private environment.
type tester struct {
	t     testing.TB
	env   map[string]string
	stdin io.Reader
	setup func(*app)
}

func newTester(t testing.TB) *tester {
	t.Helper()
	home := t.TempDir()
	return &tester{t: t, env: map[string]string{
		"HOME":                         home,
		"XDG_CONFIG_HOME":              home + "/config",
		"XDG_STATE_HOME":               home + "/state",
		"OPENSHELL_SYSTEM_GATEWAY_DIR": home + "/system",
	}}
}

type result struct {
	stdout, stderr string
	err            error
}

func (r result) code() int { return ExitCode(r.err) }

func (tt *tester) run(args ...string) result {
	return tt.runCtx(tt.t.(interface{ Context() context.Context }).Context(), args...)
}

func (tt *tester) runCtx(ctx context.Context, args ...string) result {
	var stdout, stderr bytes.Buffer
	stdin := tt.stdin
	if stdin == nil {
		stdin = strings.NewReader("")
	}
	a := newApp(stdin, &stdout, &stderr)
	a.getenv = func(k string) string { return tt.env[k] }
	a.lookupEnv = func(k string) (string, bool) { v, ok := tt.env[k]; return v, ok }
	a.now = func() time.Time { return fixedNow }
	a.stdinTerminal = func() bool { return false }
	a.executable = func() (string, error) { return "/usr/local/bin/openshell", nil }
	if tt.setup != nil {
		tt.setup(a)
	}
	err := a.run(ctx, args)
	return result{stdout: stdout.String(), stderr: stderr.String(), err: err}
}
