package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

func TestExitCodes(t *testing.T) {
	ep := listFake().serve(t)
	for _, tc := range []struct {
		name string
		args []string
		want int
	}{
		{"help", []string{"--help"}, 0},
		{"group without subcommand prints help", []string{"sandbox"}, 0},
		{"unknown command", []string{"frobnicate"}, 2},
		{"unknown subcommand", []string{"sandbox", "frobnicate"}, 2},
		{"unknown flag", []string{"sandbox", "list", "--bogus"}, 2},
		{"missing arg", []string{"sandbox", "get"}, 2},
		{"too many args", []string{"sandbox", "get", "a", "b"}, 2},
		{"bad output", []string{"-o", "xml", "sandbox", "list"}, 2},
		{"exec without name", []string{"sandbox", "exec", "--", "ls"}, 2},
		{"exec without command", []string{"sandbox", "exec", "--name", "x"}, 2},
		{"bad env", []string{"sandbox", "exec", "--name", "x", "--env", "NOEQUALS", "--", "ls"}, 2},
		{"bad port spec", []string{"forward", "start", "x", "abc"}, 2},
		{"bad completion shell", []string{"completion", "tcsh"}, 2},
		{"completion", []string{"completion", "bash"}, 0},
		{"list ok", []string{"--gateway-endpoint", ep, "sandbox", "list"}, 0},
		{"gateway unreachable", []string{"--gateway-endpoint", "http://127.0.0.1:1", "sandbox", "list"}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newTester(t).run(tc.args...)
			if got := r.code(); got != tc.want {
				t.Errorf("openshell %v: exit code %d, want %d (err %v)", tc.args, got, tc.want, r.err)
			}
			if tc.want == 2 && !strings.Contains(r.err.Error(), "--help' for usage") {
				t.Errorf("usage error %q lacks a pointer to --help", r.err)
			}
		})
	}
	if ExitCode(nil) != 0 || ExitCode(&ExitError{Code: 42}) != 42 || ExitCode(fmt.Errorf("x: %w", context.Canceled)) != 130 || ExitCode(errors.New("x")) != 1 {
		t.Error("ExitCode mapping is wrong")
	}
}

func execFake() *fakeGateway {
	f := listFake()
	f.execSandbox = func(r *openshellv1.ExecSandboxRequest, s grpc.ServerStreamingServer[openshellv1.ExecSandboxEvent]) error {
		if r.GetSandboxId() != "id-box" {
			return status.Error(codes.NotFound, "sandbox not found")
		}
		send := func(ev *openshellv1.ExecSandboxEvent) {
			_ = s.Send(ev)
		}
		send(&openshellv1.ExecSandboxEvent{Payload: &openshellv1.ExecSandboxEvent_Stdout{Stdout: &openshellv1.ExecSandboxStdout{Data: []byte("out:" + strings.Join(r.GetCommand(), " ") + "\n")}}})
		send(&openshellv1.ExecSandboxEvent{Payload: &openshellv1.ExecSandboxEvent_Stderr{Stderr: &openshellv1.ExecSandboxStderr{Data: []byte("err:" + r.GetWorkdir() + "\n")}}})
		if len(r.GetStdin()) > 0 {
			send(&openshellv1.ExecSandboxEvent{Payload: &openshellv1.ExecSandboxEvent_Stdout{Stdout: &openshellv1.ExecSandboxStdout{Data: r.GetStdin()}}})
		}
		code := int32(0)
		fmt.Sscanf(r.GetEnvironment()["CODE"], "%d", &code)
		send(&openshellv1.ExecSandboxEvent{Payload: &openshellv1.ExecSandboxEvent_Exit{Exit: &openshellv1.ExecSandboxExit{ExitCode: code}}})
		return nil
	}
	return f
}

func TestExec(t *testing.T) {
	ep := execFake().serve(t)
	for _, tc := range []struct {
		name       string
		args       []string
		stdin      string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		{"exit 0", []string{"--name", "box", "--", "echo", "hi"}, "", 0, "out:echo hi\n", "err:\n"},
		{"remote exit code", []string{"--name", "box", "--env", "CODE=7", "--workdir", "/w", "--", "false"}, "", 7, "out:false\n", "err:/w\n"},
		{"flags after name without --", []string{"--name", "box", "ls", "-la"}, "", 0, "out:ls -la\n", "err:\n"},
		{"stdin piped", []string{"--name", "box", "--", "cat"}, "piped input", 0, "out:cat\npiped input", "err:\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tt := newTester(t)
			tt.stdin = strings.NewReader(tc.stdin)
			r := tt.run(append([]string{"--gateway-endpoint", ep, "sandbox", "exec"}, tc.args...)...)
			if r.code() != tc.wantCode {
				t.Errorf("exit code %d, want %d (err %v)", r.code(), tc.wantCode, r.err)
			}
			if r.stdout != tc.wantStdout {
				t.Errorf("stdout = %q, want %q", r.stdout, tc.wantStdout)
			}
			if r.stderr != tc.wantStderr {
				t.Errorf("stderr = %q, want %q", r.stderr, tc.wantStderr)
			}
		})
	}
}

func TestErrorSentences(t *testing.T) {
	f := &fakeGateway{
		getSandbox: func(_ context.Context, r *openshellv1.GetSandboxRequest) (*openshellv1.SandboxResponse, error) {
			switch r.GetName() {
			case "unauth":
				return nil, status.Error(codes.Unauthenticated, "missing authorization header")
			case "denied":
				return nil, status.Error(codes.PermissionDenied, "role user required")
			case "notready":
				return nil, status.Error(codes.FailedPrecondition, "sandbox is not ready")
			case "dbdown":
				return nil, status.Error(codes.Unavailable, "database unavailable")
			}
			return nil, status.Error(codes.NotFound, "sandbox not found")
		},
	}
	ep := f.serve(t)
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"not found", []string{"--gateway-endpoint", ep, "sandbox", "get", "foo"}, `sandbox "foo" not found in workspace "default"`},
		{"not found in workspace", []string{"--gateway-endpoint", ep, "--workspace", "team", "sandbox", "get", "foo"}, `sandbox "foo" not found in workspace "team"`},
		{"unauthenticated", []string{"--gateway-endpoint", ep, "sandbox", "get", "unauth"}, "rejected the request as unauthenticated: missing authorization header\nhint: this gateway requires authentication"},
		{"permission denied", []string{"--gateway-endpoint", ep, "sandbox", "get", "denied"}, "permission denied: role user required\nhint: 'openshell whoami'"},
		{"failed precondition", []string{"--gateway-endpoint", ep, "sandbox", "get", "notready"}, `sandbox "notready": sandbox is not ready`},
		{"database unavailable", []string{"--gateway-endpoint", ep, "sandbox", "get", "dbdown"}, `gateway at ` + ep + ` is up, but its database is unavailable: database unavailable`},
		{"unavailable endpoint", []string{"--gateway-endpoint", "http://" + deadAddr, "sandbox", "list"}, `cannot reach gateway at http://` + deadAddr + `: connection refused (is openshell-gateway running?)`},
		{"unavailable unix", []string{"--gateway-endpoint", "unix:///nonexistent/gw.sock", "status"}, `cannot reach gateway at unix:///nonexistent/gw.sock: no such file or directory (is openshell-gateway running?)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newTester(t).run(tc.args...)
			if r.code() != 1 || r.err == nil || !strings.Contains(r.err.Error(), tc.want) {
				t.Errorf("error = %v (code %d), want it to contain %q", r.err, r.code(), tc.want)
			}
		})
	}
	t.Run("unavailable local", func(t *testing.T) {
		// Nothing registered and nothing on 17670 in this test: the message names "local".
		tt := newTester(t)
		c, err := net.Dial("tcp", LocalGatewayAddr)
		if err == nil {
			c.Close()
			t.Skip("something listens on 127.0.0.1:17670")
		}
		r := tt.run("status")
		want := `cannot reach gateway "local" at http://127.0.0.1:17670: connection refused (is openshell-gateway running?)`
		if r.err == nil || r.err.Error() != want {
			t.Errorf("status error = %v, want %q", r.err, want)
		}
	})
}

func TestStatusWhoamiVersion(t *testing.T) {
	f := &fakeGateway{
		getGatewayInfo: func(context.Context, *openshellv1.GetGatewayInfoRequest) (*openshellv1.GetGatewayInfoResponse, error) {
			return nil, status.Error(codes.PermissionDenied, "platform_admin required")
		},
		getCurrentUser: func(context.Context, *openshellv1.GetCurrentUserRequest) (*openshellv1.GetCurrentUserResponse, error) {
			return &openshellv1.GetCurrentUserResponse{Subject: "alice", IdentityProvider: "mtls", Roles: []string{"user"}}, nil
		},
	}
	ep := f.serve(t)
	tt := newTester(t)
	r := tt.run("--gateway-endpoint", ep, "status")
	if r.err != nil {
		t.Fatalf("status: %v", r.err)
	}
	for _, want := range []string{"Status:     Connected", "Version:    v9.9.9-fake", "Auth:       authenticated"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("status output %q lacks %q", r.stdout, want)
		}
	}
	f.getGatewayInfo = func(context.Context, *openshellv1.GetGatewayInfoRequest) (*openshellv1.GetGatewayInfoResponse, error) {
		return &openshellv1.GetGatewayInfoResponse{GatewayVersion: "v1.2.3", ComputeDrivers: []*openshellv1.ComputeDriverInfo{{Name: "process"}}}, nil
	}
	r = tt.run("--gateway-endpoint", ep, "status")
	if !strings.Contains(r.stdout, "Driver:     process") || !strings.Contains(r.stdout, "Version:    v1.2.3") {
		t.Errorf("status output %q lacks driver/version", r.stdout)
	}
	r = tt.run("--gateway-endpoint", ep, "whoami")
	if r.err != nil || !strings.Contains(r.stdout, "Subject:    alice") || !strings.Contains(r.stdout, "Provider:   mtls") {
		t.Errorf("whoami = %q (%v)", r.stdout, r.err)
	}
	r = tt.run("--gateway-endpoint", ep, "version")
	if r.err != nil || !strings.Contains(r.stdout, "Gateway: v9.9.9-fake") || !strings.Contains(r.stdout, "Client:") {
		t.Errorf("version = %q (%v)", r.stdout, r.err)
	}
	r = tt.run("--gateway-endpoint", "http://127.0.0.1:1", "version")
	if r.err != nil || !strings.Contains(r.stdout, "Client:") || !strings.Contains(r.stderr, "gateway version unavailable") {
		t.Errorf("version without gateway = %q / %q (%v)", r.stdout, r.stderr, r.err)
	}
}

func TestDebugLogsMethodsNotSecrets(t *testing.T) {
	f := execFake()
	f.createSSH = func(_ context.Context, r *openshellv1.CreateSshSessionRequest) (*openshellv1.CreateSshSessionResponse, error) {
		return &openshellv1.CreateSshSessionResponse{SandboxId: r.GetSandboxId(), Token: "SECRET-TOKEN-123"}, nil
	}
	ep := f.serve(t)
	tt := newTester(t)
	r := tt.run("--debug", "--gateway-endpoint", ep, "sandbox", "ssh-config", "box")
	if r.err != nil {
		t.Fatal(r.err)
	}
	if !strings.Contains(r.stderr, "method=/openshell.v1.OpenShell/CreateSshSession code=OK") {
		t.Errorf("debug log lacks the RPC: %q", r.stderr)
	}
	if strings.Contains(r.stderr+r.stdout, "SECRET-TOKEN-123") {
		t.Errorf("token leaked to output: stdout %q stderr %q", r.stdout, r.stderr)
	}
}

func TestSSHConfig(t *testing.T) {
	ep := execFake().serve(t)
	tt := newTester(t)
	r := tt.run("--gateway-endpoint", ep, "sandbox", "ssh-config", "box")
	if r.err != nil {
		t.Fatal(r.err)
	}
	tokenFile := filepath.Join(tt.env["XDG_CONFIG_HOME"], "openshell", "ssh", "id-box.token")
	want := "Host openshell-box\n" +
		"    User sandbox\n" +
		"    StrictHostKeyChecking no\n" +
		"    UserKnownHostsFile /dev/null\n" +
		"    LogLevel ERROR\n" +
		"    ProxyCommand /usr/local/bin/openshell --gateway-endpoint " + ep + " ssh-proxy --sandbox-id id-box --token-file " + tokenFile + "\n"
	if diff := cmp.Diff(want, r.stdout); diff != "" {
		t.Errorf("ssh-config (-want +got):\n%s", diff)
	}
	b, err := os.ReadFile(tokenFile)
	if err != nil || strings.TrimSpace(string(b)) != "tok-id-box" {
		t.Errorf("token file = %q (%v)", b, err)
	}
	if m := mode(t, tokenFile); m != 0o600 {
		t.Errorf("token file mode %o, want 600", m)
	}
	if m := mode(t, filepath.Dir(tokenFile)); m != 0o700 {
		t.Errorf("token dir mode %o, want 700", m)
	}
}

func TestShellQuote(t *testing.T) {
	for in, want := range map[string]string{"/usr/bin/openshell": "/usr/bin/openshell", "/a b/c": "'/a b/c'", "it's": `'it'\''s'`, "": "''"} {
		if got := shellQuote(in); got != want {
			t.Errorf("shellQuote(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestLogs(t *testing.T) {
	f := listFake()
	var gotReq *openshellv1.GetSandboxLogsRequest
	f.getLogs = func(_ context.Context, r *openshellv1.GetSandboxLogsRequest) (*openshellv1.GetSandboxLogsResponse, error) {
		gotReq = r
		return &openshellv1.GetSandboxLogsResponse{Logs: []*openshellv1.SandboxLogLine{
			{TimestampMs: fixedNow.UnixMilli(), Level: "info", Source: "gateway", Target: "compute", Message: "sandbox created", Fields: map[string]string{"b": "2", "a": "1"}},
			{TimestampMs: fixedNow.Add(1500e6).UnixMilli(), Level: "warn", Source: "sandbox", Message: "policy reloaded"},
		}}, nil
	}
	f.watchSandbox = func(r *openshellv1.WatchSandboxRequest, s grpc.ServerStreamingServer[openshellv1.SandboxStreamEvent]) error {
		if !r.GetFollowLogs() || r.GetLogTailLines() != 5 {
			return status.Error(codes.InvalidArgument, "bad watch request")
		}
		for i := range 3 {
			_ = s.Send(&openshellv1.SandboxStreamEvent{Payload: &openshellv1.SandboxStreamEvent_Log{Log: &openshellv1.SandboxLogLine{TimestampMs: fixedNow.UnixMilli(), Level: "info", Message: fmt.Sprintf("line %d", i)}}})
		}
		return nil
	}
	ep := f.serve(t)
	tt := newTester(t)
	r := tt.run("--gateway-endpoint", ep, "logs", "box", "--tail", "10", "--since", "1h", "--source", "sandbox", "--level", "warn")
	if r.err != nil {
		t.Fatal(r.err)
	}
	want := "2026-11-01T12:00:00.000Z INFO  [gateway] compute: sandbox created a=1 b=2\n" +
		"2026-11-01T12:00:01.500Z WARN  [sandbox] policy reloaded\n"
	if diff := cmp.Diff(want, r.stdout); diff != "" {
		t.Errorf("logs (-want +got):\n%s", diff)
	}
	wantReq := &openshellv1.GetSandboxLogsRequest{SandboxId: "id-box", Lines: 10, SinceMs: fixedNow.Add(-3600e9).UnixMilli(), Sources: []string{"sandbox"}, MinLevel: "warn"}
	if diff := cmp.Diff(wantReq, gotReq, protocmp.Transform()); diff != "" {
		t.Errorf("GetSandboxLogs request (-want +got):\n%s", diff)
	}
	r = tt.run("--gateway-endpoint", ep, "logs", "box", "-f", "--tail", "5")
	if r.err != nil || strings.Count(r.stdout, "\n") != 3 || !strings.Contains(r.stdout, "line 2") {
		t.Errorf("logs --follow = %q (%v)", r.stdout, r.err)
	}
	if r := tt.run("--gateway-endpoint", ep, "logs", "box", "--source", "kernel"); r.code() != 2 {
		t.Errorf("bad --source: code %d", r.code())
	}
}

func TestDeleteReportsEachFailure(t *testing.T) {
	f := &fakeGateway{deleteSandbox: func(_ context.Context, r *openshellv1.DeleteSandboxRequest) (*openshellv1.DeleteSandboxResponse, error) {
		if r.GetName() == "gone" {
			return nil, status.Error(codes.NotFound, "sandbox not found")
		}
		return &openshellv1.DeleteSandboxResponse{Deleted: true}, nil
	}}
	ep := f.serve(t)
	r := newTester(t).run("--gateway-endpoint", ep, "sandbox", "delete", "a", "gone", "b")
	if r.code() != 1 || !strings.Contains(r.err.Error(), `sandbox "gone" not found`) {
		t.Errorf("delete = %v", r.err)
	}
	if r.stdout != "Deleted sandbox a\nDeleted sandbox b\n" {
		t.Errorf("stdout = %q", r.stdout)
	}
}

var _ = io.EOF

func TestExecTTYUsesInteractiveStream(t *testing.T) {
	f := execFake()
	var start *openshellv1.ExecSandboxRequest
	f.execInteract = func(s grpc.BidiStreamingServer[openshellv1.ExecSandboxInput, openshellv1.ExecSandboxEvent]) error {
		first, err := s.Recv()
		if err != nil {
			return err
		}
		start = first.GetStart()
		if start == nil {
			return status.Error(codes.InvalidArgument, "start must come first")
		}
		var in []byte
		for {
			msg, err := s.Recv()
			if err != nil {
				break // client closed stdin
			}
			in = append(in, msg.GetStdin()...)
		}
		_ = s.Send(&openshellv1.ExecSandboxEvent{Payload: &openshellv1.ExecSandboxEvent_Stdout{Stdout: &openshellv1.ExecSandboxStdout{Data: append([]byte("tty:"), in...)}}})
		return s.Send(&openshellv1.ExecSandboxEvent{Payload: &openshellv1.ExecSandboxEvent_Exit{Exit: &openshellv1.ExecSandboxExit{ExitCode: 5}}})
	}
	ep := f.serve(t)
	tt := newTester(t)
	tt.stdin = strings.NewReader("typed keys")
	r := tt.run("--gateway-endpoint", ep, "sandbox", "exec", "--name", "box", "--tty", "--", "bash")
	if r.code() != 5 || r.stdout != "tty:typed keys" {
		t.Errorf("exec --tty = code %d stdout %q (err %v)", r.code(), r.stdout, r.err)
	}
	if start.GetSandboxId() != "id-box" || !start.GetTty() || !cmp.Equal(start.GetCommand(), []string{"bash"}) {
		t.Errorf("start = %v", start)
	}
}

func TestConnectRefusesSandboxNotReady(t *testing.T) {
	f := &fakeGateway{getSandbox: func(_ context.Context, r *openshellv1.GetSandboxRequest) (*openshellv1.SandboxResponse, error) {
		return &openshellv1.SandboxResponse{Sandbox: testSandbox(r.GetName(), openshellv1.SandboxPhase_SANDBOX_PHASE_STOPPED)}, nil
	}}
	ep := f.serve(t)
	r := newTester(t).run("--gateway-endpoint", ep, "sandbox", "connect", "box")
	if r.code() != 1 || !strings.Contains(r.err.Error(), `sandbox "box" is Stopped, not Ready`) {
		t.Errorf("connect to a stopped sandbox = %v", r.err)
	}
	for _, c := range f.Calls() {
		if c == "CreateSshSession" {
			t.Error("connect created an SSH session for a sandbox that is not ready")
		}
	}
}

// TestStatusStates: 'openshell status' in the four states of the Health +
// GetGatewayInfo probe.
func TestStatusStates(t *testing.T) {
	admin := func(context.Context, *openshellv1.GetGatewayInfoRequest) (*openshellv1.GetGatewayInfoResponse, error) {
		return &openshellv1.GetGatewayInfoResponse{GatewayVersion: "v1.2.3", ComputeDrivers: []*openshellv1.ComputeDriverInfo{{Name: "process"}}}, nil
	}
	rejected := func(context.Context, *openshellv1.GetGatewayInfoRequest) (*openshellv1.GetGatewayInfoResponse, error) {
		return nil, status.Error(codes.Unauthenticated, "missing authorization header")
	}
	notAdmin := func(context.Context, *openshellv1.GetGatewayInfoRequest) (*openshellv1.GetGatewayInfoResponse, error) {
		return nil, status.Error(codes.PermissionDenied, "platform_admin role required")
	}
	for _, tc := range []struct {
		name     string
		info     func(context.Context, *openshellv1.GetGatewayInfoRequest) (*openshellv1.GetGatewayInfoResponse, error)
		health   func(context.Context, *openshellv1.HealthRequest) (*openshellv1.HealthResponse, error)
		want     string
		wantJSON map[string]any
	}{
		{
			name: "healthy and authenticated", info: admin,
			want:     "Gateway:    -\nEndpoint:   %s\nStatus:     Connected\nVersion:    v1.2.3\nDriver:     process\nAuth:       authenticated\n",
			wantJSON: map[string]any{"status": "connected", "health": "Healthy", "auth": "authenticated", "version": "v1.2.3", "drivers": []any{"process"}},
		},
		{
			name: "connected, not authenticated", info: rejected,
			want: "Gateway:    -\nEndpoint:   %s\nStatus:     Connected\nVersion:    v9.9.9-fake\nAuth:       not authenticated: missing authorization header\n" +
				"hint: this gateway requires authentication: use its https:// endpoint with a client certificate ('openshell gateway add NAME --endpoint https://HOST:PORT --ca ca.crt --cert tls.crt --key tls.key'), or start it with allow_unauthenticated_users for local development\n",
			wantJSON: map[string]any{"status": "connected", "health": "Healthy", "auth": "not_authenticated", "auth_error": "missing authorization header", "version": "v9.9.9-fake"},
		},
		{
			name: "health rejected too", info: rejected,
			health: func(context.Context, *openshellv1.HealthRequest) (*openshellv1.HealthResponse, error) {
				return nil, status.Error(codes.Unauthenticated, "invalid token: expired")
			},
			want:     "Gateway:    -\nEndpoint:   %s\nStatus:     Connected\nVersion:    -\nAuth:       not authenticated: invalid token: expired\nhint: ",
			wantJSON: map[string]any{"status": "connected", "auth": "not_authenticated", "auth_error": "invalid token: expired"},
		},
		{
			name: "authenticated without admin", info: notAdmin,
			want:     "Gateway:    -\nEndpoint:   %s\nStatus:     Connected\nVersion:    v9.9.9-fake\nAuth:       authenticated (gateway details need the platform_admin role)\n",
			wantJSON: map[string]any{"status": "connected", "health": "Healthy", "auth": "authenticated_not_admin", "version": "v9.9.9-fake"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeGateway{getGatewayInfo: tc.info, health: tc.health}
			ep := f.serve(t)
			tt := newTester(t)
			r := tt.run("--gateway-endpoint", ep, "status")
			want := fmt.Sprintf(tc.want, ep)
			if r.err != nil || !strings.HasPrefix(r.stdout, want) {
				t.Errorf("status = %q (%v), want prefix %q", r.stdout, r.err, want)
			}
			r = tt.run("--gateway-endpoint", ep, "status", "-o", "json")
			var got map[string]any
			if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || r.err != nil {
				t.Fatalf("status -o json = %q (%v, %v)", r.stdout, r.err, err)
			}
			for k, v := range tc.wantJSON {
				if diff := cmp.Diff(v, got[k]); diff != "" {
					t.Errorf("json %s (-want +got):\n%s", k, diff)
				}
			}
			if tc.wantJSON["auth"] == "not_authenticated" && got["hint"] == nil {
				t.Errorf("json lacks the hint: %v", got)
			}
		})
	}
	t.Run("unreachable", func(t *testing.T) {
		dead, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		deadAddr := dead.Addr().String()
		_ = dead.Close()
		r := newTester(t).run("--gateway-endpoint", "http://"+deadAddr, "status")
		want := `cannot reach gateway at http://` + deadAddr + `: connection refused (is openshell-gateway running?)`
		if r.code() != 1 || r.err == nil || r.err.Error() != want || r.stdout != "" {
			t.Errorf("status = %q, %v (code %d), want error %q", r.stdout, r.err, r.code(), want)
		}
	})
}
