package cli

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/testing/protocmp"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// adoptFake adds AdoptSandbox to the fake gateway.
type adoptFake struct {
	*fakeGateway
	amu   sync.Mutex
	req   *openshellv1.AdoptSandboxRequest
	adopt func(*openshellv1.AdoptSandboxRequest) (*openshellv1.SandboxResponse, error)
}

func (f *adoptFake) AdoptSandbox(_ context.Context, r *openshellv1.AdoptSandboxRequest) (*openshellv1.SandboxResponse, error) {
	f.record("AdoptSandbox")
	f.amu.Lock()
	f.req = r
	f.amu.Unlock()
	return f.adopt(r)
}

func (f *adoptFake) serve(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	openshellv1.RegisterOpenShellServer(srv, f)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() { srv.Stop(); <-done })
	return "http://" + ln.Addr().String()
}

func newAdoptFake() *adoptFake {
	f := &adoptFake{fakeGateway: &fakeGateway{}}
	f.adopt = func(r *openshellv1.AdoptSandboxRequest) (*openshellv1.SandboxResponse, error) {
		return &openshellv1.SandboxResponse{Sandbox: testSandbox(r.GetName(), openshellv1.SandboxPhase_SANDBOX_PHASE_PROVISIONING)}, nil
	}
	f.watchSandbox = func(_ *openshellv1.WatchSandboxRequest, s grpc.ServerStreamingServer[openshellv1.SandboxStreamEvent]) error {
		_ = s.Send(&openshellv1.SandboxStreamEvent{Payload: &openshellv1.SandboxStreamEvent_Event{Event: &openshellv1.PlatformEvent{Reason: "Adopted", Message: "Adopted Sandbox ns/bare"}}})
		return s.Send(&openshellv1.SandboxStreamEvent{Payload: &openshellv1.SandboxStreamEvent_Sandbox{Sandbox: testSandbox("bare", openshellv1.SandboxPhase_SANDBOX_PHASE_READY)}})
	}
	return f
}

func TestAdoptWaitsUntilReady(t *testing.T) {
	f := newAdoptFake()
	ep := f.serve(t)
	r := newTester(t).run("--gateway-endpoint", ep, "--workspace", "team", "sandbox", "adopt", "bare", "--namespace", "agents", "--container", "main", "--reenrich")
	if r.err != nil {
		t.Fatalf("adopt: %v (%s)", r.err, r.stderr)
	}
	want := &openshellv1.AdoptSandboxRequest{Name: "bare", Namespace: "agents", Workspace: "team", AgentContainer: "main", Reenrich: true}
	if diff := cmp.Diff(want, f.req, protocmp.Transform()); diff != "" {
		t.Errorf("AdoptSandbox request (-want +got):\n%s", diff)
	}
	wantErr := "Adopted sandbox bare (id id-bare)\n" +
		"sandbox bare: Provisioning\n" +
		"  Adopted: Adopted Sandbox ns/bare\n" +
		"sandbox bare: Ready\n" +
		"Sandbox bare is ready\n"
	if diff := cmp.Diff(wantErr, r.stderr); diff != "" {
		t.Errorf("adopt progress (-want +got):\n%s", diff)
	}
}

func TestAdoptDetachAndErrors(t *testing.T) {
	f := newAdoptFake()
	ep := f.serve(t)
	r := newTester(t).run("--gateway-endpoint", ep, "sandbox", "adopt", "bare", "--detach")
	if r.err != nil || !strings.Contains(r.stderr, "Adopted sandbox bare") {
		t.Fatalf("adopt --detach = %v, %q", r.err, r.stderr)
	}
	if got := f.Calls(); !cmp.Equal(got, []string{"AdoptSandbox"}) {
		t.Errorf("calls with --detach = %v, want only AdoptSandbox", got)
	}

	for _, args := range [][]string{{"sandbox", "adopt"}, {"sandbox", "adopt", "a", "b"}, {"sandbox", "adopt", "a", "--bogus"}} {
		if r := newTester(t).run(append([]string{"--gateway-endpoint", ep}, args...)...); r.code() != 2 {
			t.Errorf("%v: exit %d (%v), want 2", args, r.code(), r.err)
		}
	}

	f.adopt = func(*openshellv1.AdoptSandboxRequest) (*openshellv1.SandboxResponse, error) {
		return nil, errdefs.ToGRPC(errdefs.FailedPrecondition("adoption is only supported by the kubernetes driver"))
	}
	r = newTester(t).run("--gateway-endpoint", ep, "sandbox", "adopt", "bare")
	if r.code() != 1 || !strings.Contains(r.err.Error(), "adoption is only supported by the kubernetes driver") {
		t.Errorf("adopt on a process gateway = %d %v", r.code(), r.err)
	}

	// A missing Sandbox resource is reported in the namespace the gateway
	// looked in, not as missing from the workspace.
	f.adopt = func(*openshellv1.AdoptSandboxRequest) (*openshellv1.SandboxResponse, error) {
		return nil, errdefs.ToGRPC(errdefs.NotFound(`sandbox "bare" not found in namespace agents`))
	}
	r = newTester(t).run("--gateway-endpoint", ep, "sandbox", "adopt", "bare", "--namespace", "agents")
	if r.code() != 1 || !strings.Contains(r.err.Error(), `sandbox "bare" not found in namespace agents`) || strings.Contains(r.err.Error(), "workspace") {
		t.Errorf("adopt of a missing Sandbox = %d %v, want the gateway's namespace text", r.code(), r.err)
	}
}
