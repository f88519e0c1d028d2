package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/securityevent"
)

// Secrets the test sends or answers with; none may reach the sink.
const (
	secretArg      = "argv-secret-4f1d"
	secretEnv      = "env-secret-9c2e"
	secretStdin    = "stdin-secret-77aa"
	secretSetting  = "setting-secret-5b6c"
	secretFwdToken = "forward-token-3e8d"
	secretIssued   = "issued-token-a1b2"
	secretSSHToken = "ssh-token-c3d4"
)

// eventAPI answers the RPCs of the test with fixed data.
type eventAPI struct {
	openshellv1.UnimplementedOpenShellServer
}

func sandboxResp(id, name string) *openshellv1.SandboxResponse {
	return &openshellv1.SandboxResponse{Sandbox: &openshellv1.Sandbox{Metadata: &datamodelv1.ObjectMeta{Id: id, Name: name, Workspace: "default"}}}
}

func (eventAPI) CreateSandbox(_ context.Context, r *openshellv1.CreateSandboxRequest) (*openshellv1.SandboxResponse, error) {
	return sandboxResp("sb-created", r.GetName()), nil
}

func (eventAPI) AdoptSandbox(_ context.Context, r *openshellv1.AdoptSandboxRequest) (*openshellv1.SandboxResponse, error) {
	return sandboxResp("sb-adopted", r.GetName()), nil
}

func (eventAPI) DeleteSandbox(context.Context, *openshellv1.DeleteSandboxRequest) (*openshellv1.DeleteSandboxResponse, error) {
	return &openshellv1.DeleteSandboxResponse{Deleted: true}, nil
}

func (eventAPI) GetSandbox(context.Context, *openshellv1.GetSandboxRequest) (*openshellv1.SandboxResponse, error) {
	return nil, errdefs.PermissionDenied("sandbox belongs to another workspace")
}

func (eventAPI) ExecSandbox(_ *openshellv1.ExecSandboxRequest, st openshellv1.OpenShell_ExecSandboxServer) error {
	return st.Send(&openshellv1.ExecSandboxEvent{Payload: &openshellv1.ExecSandboxEvent_Exit{Exit: &openshellv1.ExecSandboxExit{ExitCode: 0}}})
}

func (eventAPI) ForwardTcp(st openshellv1.OpenShell_ForwardTcpServer) error {
	if _, err := st.Recv(); err != nil {
		return err
	}
	for {
		if _, err := st.Recv(); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

func (eventAPI) UpdateConfig(context.Context, *openshellv1.UpdateConfigRequest) (*openshellv1.UpdateConfigResponse, error) {
	return &openshellv1.UpdateConfigResponse{}, nil
}

func (eventAPI) RefreshSandboxToken(context.Context, *openshellv1.RefreshSandboxTokenRequest) (*openshellv1.RefreshSandboxTokenResponse, error) {
	return &openshellv1.RefreshSandboxTokenResponse{Token: secretIssued}, nil
}

func (eventAPI) CreateSshSession(_ context.Context, r *openshellv1.CreateSshSessionRequest) (*openshellv1.CreateSshSessionResponse, error) {
	return &openshellv1.CreateSshSessionResponse{SandboxId: r.GetSandboxId(), Token: secretSSHToken}, nil
}

type sinkFixture struct {
	path string
	reg  *prometheus.Registry
	log  *securityevent.Log
}

func newSink(t *testing.T) *sinkFixture {
	t.Helper()
	path := filepath.Join(t.TempDir(), "events.jsonl")
	sink, err := securityevent.OpenSink(path, 1, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sink.Close() })
	reg := prometheus.NewRegistry()
	l, err := securityevent.New(securityevent.Options{Sink: sink, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	return &sinkFixture{path: path, reg: reg, log: l}
}

// events reads the sink and returns the records (and the raw bytes).
func (s *sinkFixture) events(t *testing.T) ([]securityevent.Record, []byte) {
	t.Helper()
	data, err := os.ReadFile(s.path)
	if err != nil {
		t.Fatal(err)
	}
	var out []securityevent.Record
	for _, line := range bytes.Split(bytes.TrimSpace(data), []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var r securityevent.Record
		if err := json.Unmarshal(line, &r); err != nil {
			t.Fatalf("sink line %q: %v", line, err)
		}
		out = append(out, r)
	}
	return out, data
}

// TestSecurityEvents drives each listed action through a real gRPC server
// and checks that it leaves exactly one event with the documented fields,
// and that no secret the test sent or received is in the sink.
func TestSecurityEvents(t *testing.T) {
	f := newFixture(t)
	sf := newSink(t)
	opts := f.fullOptions(t, false)
	opts.Deps.API = eventAPI{}
	opts.SecurityEvents = sf.log
	_, addr := startServer(t, opts)
	c := openshellv1.NewOpenShellClient(dial(t, addr, f.clientTLS()))
	admin := f.oidc.token(t, "root", []string{auth.DefaultAdminRole}, "openshell:all")
	sbJWT, _, err := f.issuer.Mint("sb-own")
	if err != nil {
		t.Fatal(err)
	}
	adminCtx := bearer(t.Context(), admin)
	sbCtx := bearer(t.Context(), sbJWT)

	type want struct {
		class    securityevent.Class
		activity string
		outcome  securityevent.Outcome
		actor    string
		unmapped map[string]string
	}
	steps := []struct {
		name string
		call func() error
		want *want // nil: no event
	}{
		{"authentication failure", func() error {
			_, err := c.GetCurrentUser(bearer(t.Context(), admin[:len(admin)-4]+"AAAA"), &openshellv1.GetCurrentUserRequest{})
			return wantCode(err, codes.Unauthenticated)
		}, &want{securityevent.HTTPActivity, "Post", securityevent.Denied, "", nil}},
		{"authorization denial at admission", func() error {
			_, err := c.CreateSandbox(sbCtx, &openshellv1.CreateSandboxRequest{Name: "x"})
			return wantCode(err, codes.PermissionDenied)
		}, &want{securityevent.HTTPActivity, "Post", securityevent.Denied, "spiffe://openshell/sandbox/sb-own", nil}},
		{"authorization denial by a handler", func() error {
			_, err := c.GetSandbox(adminCtx, &openshellv1.GetSandboxRequest{Name: "theirs"})
			return wantCode(err, codes.PermissionDenied)
		}, &want{securityevent.HTTPActivity, "Post", securityevent.Denied, "root", nil}},
		{"unlisted RPC leaves nothing", func() error {
			_, err := c.GetCurrentUser(adminCtx, &openshellv1.GetCurrentUserRequest{})
			return err
		}, nil},
		{"sandbox create", func() error {
			_, err := c.CreateSandbox(adminCtx, &openshellv1.CreateSandboxRequest{Name: "web", Workspace: "default"})
			return err
		}, &want{securityevent.ProcessActivity, "Launch", securityevent.Success, "root", map[string]string{"sandbox_id": "sb-created", "sandbox_name": "web", "workspace": "default"}}},
		{"sandbox adopt", func() error {
			_, err := c.AdoptSandbox(adminCtx, &openshellv1.AdoptSandboxRequest{Name: "bare", Namespace: "agents"})
			return err
		}, &want{securityevent.ProcessActivity, "Adopt", securityevent.Success, "root", map[string]string{"sandbox_id": "sb-adopted", "sandbox_name": "bare", "namespace": "agents", "workspace": "default"}}},
		{"sandbox delete", func() error {
			_, err := c.DeleteSandbox(adminCtx, &openshellv1.DeleteSandboxRequest{Name: "web"})
			return err
		}, &want{securityevent.ProcessActivity, "Terminate", securityevent.Success, "root", map[string]string{"sandbox_name": "web"}}},
		{"exec", func() error {
			st, err := c.ExecSandbox(adminCtx, &openshellv1.ExecSandboxRequest{
				SandboxId: "sb-created", Command: []string{"/usr/bin/env", secretArg},
				Environment: map[string]string{"TOKEN": secretEnv}, Stdin: []byte(secretStdin),
			})
			if err != nil {
				return err
			}
			for {
				if _, err := st.Recv(); err != nil {
					if errors.Is(err, io.EOF) {
						return nil
					}
					return err
				}
			}
		}, &want{securityevent.ProcessActivity, "Launch", securityevent.Success, "root", map[string]string{"sandbox_id": "sb-created", "process_name": "env", "tty": "false"}}},
		{"ssh session token", func() error {
			_, err := c.CreateSshSession(adminCtx, &openshellv1.CreateSshSessionRequest{SandboxId: "sb-created"})
			return err
		}, &want{securityevent.HTTPActivity, "Post", securityevent.Success, "root", map[string]string{"sandbox_id": "sb-created"}}},
		{"ssh session", func() error {
			return forward(t, c, adminCtx, &openshellv1.TcpForwardInit{SandboxId: "sb-created", Target: &openshellv1.TcpForwardInit_Ssh{Ssh: &openshellv1.SshRelayTarget{}}, AuthorizationToken: secretFwdToken})
		}, &want{securityevent.SSHActivity, "Open", securityevent.Success, "root", map[string]string{"sandbox_id": "sb-created"}}},
		{"tcp forward", func() error {
			return forward(t, c, adminCtx, &openshellv1.TcpForwardInit{SandboxId: "sb-created", Target: &openshellv1.TcpForwardInit_Tcp{Tcp: &openshellv1.TcpRelayTarget{Host: "127.0.0.1", Port: 8080}}, AuthorizationToken: secretFwdToken})
		}, &want{securityevent.NetworkActivity, "Open", securityevent.Success, "root", map[string]string{"sandbox_id": "sb-created", "dst_host": "127.0.0.1", "dst_port": "8080"}}},
		{"setting change", func() error {
			_, err := c.UpdateConfig(adminCtx, &openshellv1.UpdateConfigRequest{Global: true, SettingKey: "api_key", SettingValue: &sandboxv1.SettingValue{Value: &sandboxv1.SettingValue_StringValue{StringValue: secretSetting}}})
			return err
		}, &want{securityevent.ConfigStateChange, "Log", securityevent.Success, "root", map[string]string{"scope": "global", "change": "setting", "setting_key": "api_key"}}},
		{"policy change", func() error {
			_, err := c.UpdateConfig(adminCtx, &openshellv1.UpdateConfigRequest{Name: "web", Policy: &sandboxv1.SandboxPolicy{}})
			return err
		}, &want{securityevent.ConfigStateChange, "Log", securityevent.Success, "root", map[string]string{"scope": "sandbox", "change": "policy", "sandbox_name": "web"}}},
		{"token issuance", func() error {
			_, err := c.RefreshSandboxToken(sbCtx, &openshellv1.RefreshSandboxTokenRequest{})
			return err
		}, &want{securityevent.HTTPActivity, "Post", securityevent.Success, "spiffe://openshell/sandbox/sb-own", map[string]string{"sandbox_id": "sb-own"}}},
	}
	seen := 0
	for _, st := range steps {
		if err := st.call(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		evs, _ := sf.events(t)
		n := 0
		if st.want != nil {
			n = 1
		}
		if got := len(evs) - seen; got != n {
			t.Fatalf("%s: %d new events, want %d: %+v", st.name, got, n, evs[seen:])
		}
		if st.want == nil {
			continue
		}
		ev := evs[seen]
		seen = len(evs)
		w := st.want
		if ev.ClassUID != int(w.class) || ev.ClassName != w.class.String() || ev.ActivityName != w.activity || ev.TypeUID != ev.ClassUID*100+ev.ActivityID {
			t.Errorf("%s: class %d %q activity %q type %d, want %d %q %q", st.name, ev.ClassUID, ev.ClassName, ev.ActivityName, ev.TypeUID, w.class, w.class, w.activity)
		}
		wantStatus, wantAction := "Success", "Allowed"
		if w.outcome != securityevent.Success {
			wantStatus = "Failure"
		}
		if w.outcome == securityevent.Denied {
			wantAction = "Denied"
		}
		if ev.Status != wantStatus || ev.Action != wantAction {
			t.Errorf("%s: status %q action %q, want %q %q", st.name, ev.Status, ev.Action, wantStatus, wantAction)
		}
		gotActor := ""
		if ev.Actor != nil {
			gotActor = ev.Actor.User.UID
		}
		if gotActor != w.actor {
			t.Errorf("%s: actor %q, want %q", st.name, gotActor, w.actor)
		}
		if ev.Metadata.CorrelationUID == "" || ev.Metadata.UID == "" || ev.Metadata.Version != securityevent.OCSFVersion || ev.Time == 0 {
			t.Errorf("%s: metadata %+v time %d: want request id, uid, version and time", st.name, ev.Metadata, ev.Time)
		}
		if ev.API == nil || !strings.HasPrefix(ev.API.Operation, "/openshell.v1.OpenShell/") || ev.SrcEndpoint == nil || ev.SrcEndpoint.IP != "127.0.0.1" {
			t.Errorf("%s: api %+v src %+v", st.name, ev.API, ev.SrcEndpoint)
		}
		for k, v := range w.unmapped {
			if ev.Unmapped[k] != v {
				t.Errorf("%s: unmapped[%q] = %q, want %q (all: %v)", st.name, k, ev.Unmapped[k], v, ev.Unmapped)
			}
		}
	}
	_, raw := sf.events(t)
	for _, s := range []string{secretArg, secretEnv, secretStdin, secretSetting, secretFwdToken, secretIssued, secretSSHToken, admin[len(admin)-20:], sbJWT[len(sbJWT)-20:]} {
		if bytes.Contains(raw, []byte(s)) {
			t.Errorf("sink contains secret %q:\n%s", s, raw)
		}
	}
	if got := counterValue(t, sf.reg, "Process Activity", "success"); got != 4 {
		t.Errorf("openshell_security_events_total{Process Activity,success} = %v, want 4", got)
	}
	if got := counterValue(t, sf.reg, "HTTP Activity", "denied"); got != 3 {
		t.Errorf("openshell_security_events_total{HTTP Activity,denied} = %v, want 3", got)
	}
}

// TestSecurityEventRateLimit: a call refused by the rate limit is a
// Detection Finding.
func TestSecurityEventRateLimit(t *testing.T) {
	f := newFixture(t)
	sf := newSink(t)
	opts := f.fullOptions(t, true)
	opts.RateLimit = RateLimit{Requests: 1, Window: 3600e9}
	opts.SecurityEvents = sf.log
	_, addr := startServer(t, opts)
	c := openshellv1.NewOpenShellClient(dial(t, addr, f.clientTLS()))
	if _, err := c.GetCurrentUser(t.Context(), &openshellv1.GetCurrentUserRequest{}); err != nil {
		t.Fatal(err)
	}
	_, err := c.GetCurrentUser(t.Context(), &openshellv1.GetCurrentUserRequest{})
	if err := wantCode(err, codes.ResourceExhausted); err != nil {
		t.Fatal(err)
	}
	evs, _ := sf.events(t)
	if len(evs) != 1 || evs[0].ClassUID != int(securityevent.DetectionFinding) || evs[0].Message != "rate limit exceeded" {
		t.Fatalf("events = %+v, want one Detection Finding", evs)
	}
}

func wantCode(err error, code codes.Code) error {
	if status.Code(err) != code {
		return errors.New("got " + status.Code(err).String() + " (" + errString(err) + "), want " + code.String())
	}
	return nil
}

func errString(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}

func forward(t *testing.T, c openshellv1.OpenShellClient, ctx context.Context, init *openshellv1.TcpForwardInit) error {
	t.Helper()
	st, err := c.ForwardTcp(ctx)
	if err != nil {
		return err
	}
	if err := st.Send(&openshellv1.TcpForwardFrame{Payload: &openshellv1.TcpForwardFrame_Init{Init: init}}); err != nil {
		return err
	}
	if err := st.Send(&openshellv1.TcpForwardFrame{Payload: &openshellv1.TcpForwardFrame_Data{Data: []byte("x")}}); err != nil {
		return err
	}
	if err := st.CloseSend(); err != nil {
		return err
	}
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

func counterValue(t *testing.T, reg *prometheus.Registry, class, outcome string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "openshell_security_events_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["class"] == class && labels["outcome"] == outcome {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}
