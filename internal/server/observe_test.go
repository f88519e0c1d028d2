package server

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/auth"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestAccessLogNeverLogsTokens(t *testing.T) {
	f := newFixture(t)
	var buf syncBuffer
	opts := f.fullOptions(t, false)
	opts.Logger = slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	_, addr := startServer(t, opts)
	c := openshellv1.NewOpenShellClient(dial(t, addr, f.clientTLS()))
	tok := f.oidc.token(t, "bob", []string{auth.DefaultUserRole}, "openshell:all")
	if _, err := c.GetCurrentUser(bearer(t.Context(), tok), &openshellv1.GetCurrentUserRequest{}); err != nil {
		t.Fatal(err)
	}
	bad := tok[:len(tok)-4] + "AAAA"
	if _, err := c.GetCurrentUser(bearer(t.Context(), bad), &openshellv1.GetCurrentUserRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("GetCurrentUser(bad token) = %v, want Unauthenticated", err)
	}
	logs := buf.String()
	for _, want := range []string{"method=/openshell.v1.OpenShell/GetCurrentUser", "code=OK", "principal=bob", "code=Unauthenticated", "request_id="} {
		if !strings.Contains(logs, want) {
			t.Errorf("access log lacks %q:\n%s", want, logs)
		}
	}
	if strings.Contains(logs, tok[len(tok)-20:]) || strings.Contains(logs, bad[len(bad)-20:]) {
		t.Errorf("access log contains a token:\n%s", logs)
	}
}

func TestReflectionBypassesAuthAndUnknownMethodIsUnimplemented(t *testing.T) {
	f := newFixture(t)
	_, addr := startServer(t, f.fullOptions(t, false))
	cc := dial(t, addr, nil)
	stream, err := grpc_reflection_v1.NewServerReflectionClient(cc).ServerReflectionInfo(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&grpc_reflection_v1.ServerReflectionRequest{
		MessageRequest: &grpc_reflection_v1.ServerReflectionRequest_ListServices{},
	}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatalf("anonymous reflection = %v, want it to bypass auth", err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	for _, want := range []string{"openshell.v1.OpenShell", "openshell.inference.v1.Inference", "grpc.health.v1.Health"} {
		if !strings.Contains(strings.Join(names, ","), want) {
			t.Errorf("reflection services = %v, want %s", names, want)
		}
	}
	err = cc.Invoke(t.Context(), "/openshell.v1.OpenShell/NoSuchMethod", &openshellv1.HealthRequest{}, &openshellv1.HealthResponse{})
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("unknown method = %v, want Unimplemented", err)
	}
}

// TestAccessLinesAtDebugWithMetrics: at the default info level a
// successful or refused RPC writes no log line; its count and latency are
// in the metrics, by method and code.
func TestAccessLinesAtDebugWithMetrics(t *testing.T) {
	f := newFixture(t)
	var buf syncBuffer
	opts := f.fullOptions(t, false)
	opts.Logger = slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	s, addr := startServer(t, opts)
	c := openshellv1.NewOpenShellClient(dial(t, addr, f.clientTLS()))
	for range 3 {
		if _, err := c.Health(t.Context(), &openshellv1.HealthRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.GetCurrentUser(t.Context(), &openshellv1.GetCurrentUserRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("GetCurrentUser(no credentials) = %v, want Unauthenticated", err)
	}
	if logs := buf.String(); strings.Contains(logs, "msg=rpc") {
		t.Errorf("info-level log has per-RPC access lines:\n%s", logs)
	}
	const health = "/openshell.v1.OpenShell/Health"
	const user = "/openshell.v1.OpenShell/GetCurrentUser"
	mfs, err := s.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	type key struct{ metric, method, code string }
	got := map[key]uint64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			k := key{metric: mf.GetName()}
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "grpc_method":
					k.method = l.GetValue()
				case "grpc_code":
					k.code = l.GetValue()
				}
			}
			switch {
			case m.GetCounter() != nil:
				got[k] = uint64(m.GetCounter().GetValue())
			case m.GetHistogram() != nil:
				got[k] = m.GetHistogram().GetSampleCount()
			}
		}
	}
	for _, want := range []struct {
		k key
		n uint64
	}{
		{key{"openshell_grpc_server_handled_total", health, "OK"}, 3},
		{key{"openshell_grpc_server_handling_seconds", health, "OK"}, 3},
		{key{"openshell_grpc_server_handled_total", user, "Unauthenticated"}, 1},
		{key{"openshell_grpc_server_handling_seconds", user, "Unauthenticated"}, 1},
	} {
		if got[want.k] != want.n {
			t.Errorf("%s{grpc_method=%q,grpc_code=%q} = %d, want %d", want.k.metric, want.k.method, want.k.code, got[want.k], want.n)
		}
	}
}
