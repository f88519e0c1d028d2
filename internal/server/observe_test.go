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
	opts.Logger = slog.New(slog.NewTextHandler(&buf, nil))
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
