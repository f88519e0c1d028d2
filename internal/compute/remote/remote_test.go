package remote_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/openshell-go/openshell/internal/citest"
	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/compute/computetest"
	"github.com/openshell-go/openshell/internal/compute/process"
	"github.com/openshell-go/openshell/internal/compute/remote"
	"github.com/openshell-go/openshell/internal/errdefs"
)

var fakeSupervisor string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "remote-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if runtime.GOOS == "linux" {
		fakeSupervisor = filepath.Join(dir, "openshell-sandbox")
		out, err := exec.Command("go", "build", "-o", fakeSupervisor, "../process/testdata/fakesupervisor").CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "build fake supervisor: %v\n%s", err, out)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), nil))
}

// socketPath returns a short socket path (sun_path is limited to 108 bytes).
func socketPath(t testing.TB) string {
	dir, err := os.MkdirTemp("", "rd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "driver.sock")
}

// serve runs remote.Serve for d and returns a dialed client; cleanup stops
// both and checks the socket is gone.
func serve(t *testing.T, d compute.Driver) *remote.Driver {
	t.Helper()
	path := socketPath(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- remote.Serve(ctx, d, path, testLogger(t)) }()
	client, err := remote.Dial(t.Context(), path, testLogger(t))
	if err != nil {
		cancel()
		t.Fatalf("Dial(%s) error = %v (serve: %v)", path, err, <-done)
	}
	t.Cleanup(func() {
		client.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve() = %v, want nil after cancel", err)
		}
		if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("socket %s after Serve returned: %v, want removed", path, err)
		}
	})
	return client
}

func TestProcessConformanceOverSocket(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the process driver needs Linux")
	}
	probe, err := process.New(map[string]any{"supervisor_path": fakeSupervisor}, compute.FactoryDeps{StateDir: t.TempDir(), GatewayEndpoint: "unix:///run/openshell/sandbox.sock"})
	if err != nil {
		t.Fatal(err)
	}
	defer probe.(io.Closer).Close()
	if err := probe.ValidateCreate(t.Context(), compute.Sandbox{ID: "p", Name: "p"}); err != nil {
		citest.SkipOrFail(t, "process driver unusable here: %v", err)
	}
	computetest.Run(t, func(t *testing.T) compute.Driver {
		d, err := process.New(map[string]any{"supervisor_path": fakeSupervisor, "stop_grace_secs": 5},
			compute.FactoryDeps{Logger: testLogger(t), StateDir: t.TempDir(), GatewayEndpoint: "unix:///run/openshell/sandbox.sock"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			list, _ := d.List(context.Background())
			for _, sb := range list {
				_, _ = d.Delete(context.Background(), compute.Ref{ID: sb.ID})
			}
			d.(io.Closer).Close()
		})
		return serve(t, d)
	}, computetest.Options{
		Sandbox: func(id, name string) compute.Sandbox {
			return compute.Sandbox{ID: id, Name: name, Spec: compute.Spec{SandboxToken: "tok", Command: []string{"sleep", "1"}}}
		},
		Invalid: map[string]func(id, name string) compute.Sandbox{
			"registry image": func(id, name string) compute.Sandbox {
				return compute.Sandbox{ID: id, Name: name, Spec: compute.Spec{Template: compute.Template{Image: "busybox"}}}
			},
		},
		Timeout: 20 * time.Second,
	})
}

// fakeDriver is a compute.Driver whose behaviour the test sets.
type fakeDriver struct {
	err      error
	mu       sync.Mutex
	created  []compute.Sandbox
	watchErr error
	events   []compute.Event
}

func (f *fakeDriver) Capabilities(context.Context) (compute.Capabilities, error) {
	return compute.Capabilities{DriverName: "fake", DriverVersion: "1", DefaultImage: "img", GatewayManagesLifecycle: true}, nil
}
func (f *fakeDriver) ListenerRequirements(context.Context) ([]compute.ListenerRequirement, error) {
	return []compute.ListenerRequirement{{Reason: "callback", ExactBindAddress: "172.17.0.1:0"}, {Reason: "lo", LoopbackInterface: true}}, f.err
}
func (f *fakeDriver) ValidateCreate(context.Context, compute.Sandbox) error { return f.err }
func (f *fakeDriver) Create(_ context.Context, sb compute.Sandbox) error {
	f.mu.Lock()
	f.created = append(f.created, sb)
	f.mu.Unlock()
	return f.err
}
func (f *fakeDriver) Get(_ context.Context, ref compute.Ref) (compute.Sandbox, error) {
	return compute.Sandbox{ID: ref.ID, Name: ref.Name}, f.err
}
func (f *fakeDriver) List(context.Context) ([]compute.Sandbox, error) { return nil, f.err }
func (f *fakeDriver) Stop(context.Context, compute.Ref) error         { return f.err }
func (f *fakeDriver) Start(context.Context, compute.Ref) error        { return f.err }
func (f *fakeDriver) Delete(context.Context, compute.Ref) (bool, error) {
	return f.err == nil, f.err
}
func (f *fakeDriver) Watch(ctx context.Context) (<-chan compute.Event, func() error, error) {
	if f.err != nil {
		return nil, nil, f.err
	}
	ch := make(chan compute.Event, len(f.events))
	for _, ev := range f.events {
		ch <- ev
	}
	close(ch)
	return ch, func() error { return f.watchErr }, nil
}
func (f *fakeDriver) EnsureWorkspace(context.Context, string) error { return f.err }
func (f *fakeDriver) DeleteWorkspace(context.Context, string) error { return f.err }

// adoptingDriver adds the Adopter and ServiceAccountSelector abilities.
type adoptingDriver struct{ fakeDriver }

func (a *adoptingDriver) SelectsServiceAccounts() {}

func (a *adoptingDriver) AdoptionEnabled(context.Context) error { return nil }

func (a *adoptingDriver) Adopt(_ context.Context, req compute.AdoptRequest) (compute.AdoptResult, error) {
	sb := req.Sandbox
	sb.Namespace = req.Namespace
	return compute.AdoptResult{Sandbox: sb, BackendUID: "uid-" + req.AgentContainer}, nil
}

func TestErrorsSurviveTheWire(t *testing.T) {
	tests := []struct {
		name     string
		err      error
		wantCode codes.Code
		wantMsg  string
		wantKind error
	}{
		{"not found", fmt.Errorf("sandbox %q: %w", "x", errdefs.ErrNotFound), codes.NotFound, `sandbox "x"`, errdefs.ErrNotFound},
		{"already exists", errdefs.AlreadyExists(`sandbox "x" already exists`), codes.AlreadyExists, `sandbox "x" already exists`, errdefs.ErrAlreadyExists},
		{"invalid argument", errdefs.InvalidArgument("process driver cannot pull images; use a local rootfs directory or another driver"),
			codes.InvalidArgument, "process driver cannot pull images; use a local rootfs directory or another driver", errdefs.ErrInvalidArgument},
		{"failed precondition", errdefs.FailedPrecondition(`memory limit requested but cgroup v2 controller "memory" is not available`),
			codes.FailedPrecondition, `memory limit requested but cgroup v2 controller "memory" is not available`, errdefs.ErrFailedPrecondition},
		{"unknown is internal", errors.New("open /secret/path: permission denied"), codes.Internal, "internal error", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := serve(t, &fakeDriver{err: tt.err})
			calls := map[string]error{
				"ValidateCreate":  d.ValidateCreate(t.Context(), compute.Sandbox{ID: "a", Name: "b"}),
				"Create":          d.Create(t.Context(), compute.Sandbox{ID: "a", Name: "b"}),
				"Stop":            d.Stop(t.Context(), compute.Ref{ID: "a"}),
				"Start":           d.Start(t.Context(), compute.Ref{ID: "a"}),
				"EnsureWorkspace": d.EnsureWorkspace(t.Context(), "w"),
			}
			_, calls["Get"] = d.Get(t.Context(), compute.Ref{ID: "a"})
			_, calls["List"] = d.List(t.Context())
			_, calls["Delete"] = d.Delete(t.Context(), compute.Ref{ID: "a"})
			_, _, calls["Watch"] = d.Watch(t.Context())
			for op, err := range calls {
				msg := status.Convert(errdefs.ToGRPC(err)).Message()
				if errdefs.Code(err) != tt.wantCode || msg != tt.wantMsg {
					t.Errorf("%s() error = %q (%v), want %q (%v)", op, err, errdefs.Code(err), tt.wantMsg, tt.wantCode)
				}
				if tt.wantKind != nil && !errors.Is(err, tt.wantKind) {
					t.Errorf("%s(): errors.Is(%v, %v) = false", op, err, tt.wantKind)
				}
			}
		})
	}
}

func TestRoundTrip(t *testing.T) {
	userns := true
	in := compute.Sandbox{
		ID: "id-1", Name: "n1", Namespace: "ns", Workspace: "team",
		Spec: compute.Spec{
			LogLevel: "info", Environment: map[string]string{"A": "1"},
			SandboxToken: "secret-token", Command: []string{"claude", "--yes"}, TTY: true,
			Template: compute.Template{
				Image: "img:1", AgentSocketPath: "/run/agent.sock",
				Labels: map[string]string{"l": "v"}, Environment: map[string]string{"B": "2"},
				Annotations:      map[string]string{"a": "b"},
				Resources:        compute.Resources{CPURequest: "250m", CPULimit: "1", MemoryRequest: "128Mi", MemoryLimit: "1Gi", GPUs: 2},
				RuntimeClassName: "gvisor", ServiceAccountName: "agent-sa", UserNamespaces: &userns,
				DriverConfig: map[string]any{"list": []any{"x", true}},
			},
		},
		Status: compute.Status{SandboxName: "n1", InstanceID: "i1", AgentFD: "3", SandboxFD: "4", Deleting: true,
			Conditions: []compute.Condition{{Type: "Ready", Status: "True", Reason: "Running", Message: "m", LastTransitionTime: "2026-01-01T00:00:00Z"}}},
	}
	ad := &adoptingDriver{}
	f := &ad.fakeDriver
	f.events = []compute.Event{
		{Kind: compute.EventSandbox, SandboxID: in.ID, Sandbox: in},
		{Kind: compute.EventPlatform, SandboxID: in.ID, Platform: compute.PlatformEvent{
			Time: time.UnixMilli(1_700_000_000_123).UTC(), Source: "fake", Type: "Warning", Reason: "ProcessExited", Message: "m",
			Metadata: map[string]string{"exit_code": "137"}}},
		{Kind: compute.EventDeleted, SandboxID: in.ID},
	}
	f.watchErr = errdefs.Unavailable("watch fell behind; watch again")
	d := serve(t, ad)

	if err := d.Create(t.Context(), in); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(in, ad.created[0]); diff != "" {
		t.Errorf("sandbox across the wire (-want +got):\n%s", diff)
	}
	caps, err := d.Capabilities(t.Context())
	if want := (compute.Capabilities{DriverName: "fake", DriverVersion: "1", DefaultImage: "img", GatewayManagesLifecycle: true}); err != nil || caps != want {
		t.Errorf("Capabilities() = %+v, %v, want %+v", caps, err, want)
	}
	reqs, err := d.ListenerRequirements(t.Context())
	if diff := cmp.Diff([]compute.ListenerRequirement{{Reason: "callback", ExactBindAddress: "172.17.0.1:0"}, {Reason: "lo", LoopbackInterface: true}}, reqs); err != nil || diff != "" {
		t.Errorf("ListenerRequirements() (-want +got):\n%s %v", diff, err)
	}

	ch, errf, err := d.Watch(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var got []compute.Event
	for ev := range ch {
		got = append(got, ev)
	}
	wantEvents := append([]compute.Event(nil), f.events...)
	wantEvents[0].Sandbox.Spec.SandboxToken = "" // never sent in status events
	if diff := cmp.Diff(wantEvents, got); diff != "" {
		t.Errorf("watch events (-want +got):\n%s", diff)
	}
	if err := errf(); errdefs.Code(err) != codes.Unavailable {
		t.Errorf("watch error = %v, want Unavailable from the remote", err)
	}

	res, err := d.Adopt(t.Context(), compute.AdoptRequest{Sandbox: compute.Sandbox{ID: "x", Name: "y"}, Namespace: "agents", AgentContainer: "agent"})
	if err != nil || res.BackendUID != "uid-agent" || res.Sandbox.Namespace != "agents" {
		t.Errorf("Adopt() = %+v, %v, want uid-agent in agents", res, err)
	}
	plain := serve(t, &fakeDriver{})
	if _, err := plain.Adopt(t.Context(), compute.AdoptRequest{Sandbox: compute.Sandbox{ID: "x"}}); !errors.Is(err, errdefs.ErrUnimplemented) {
		t.Errorf("Adopt() on a non-adopting driver error = %v, want Unimplemented", err)
	}
}

func TestDialWaitsForServer(t *testing.T) {
	path := socketPath(t)
	dialed := make(chan error, 1)
	go func() {
		d, err := remote.Dial(context.Background(), path, testLogger(t))
		if err == nil {
			d.Close()
		}
		dialed <- err
	}()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- remote.Serve(ctx, &fakeDriver{}, path, testLogger(t)) }()
	if err := <-dialed; err != nil {
		t.Errorf("Dial before Serve error = %v, want success once the server is up", err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("socket mode = %v, %v, want 0600", st, err)
	}
	// A second server on a live socket is refused.
	if err := remote.Serve(context.Background(), &fakeDriver{}, path, testLogger(t)); errdefs.Code(err) != codes.FailedPrecondition {
		t.Errorf("second Serve on a live socket error = %v, want FailedPrecondition", err)
	}
	cancel()
	if err := <-served; err != nil {
		t.Errorf("Serve() = %v", err)
	}

	ctx, cancel = context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	_, err = remote.Dial(ctx, filepath.Join(t.TempDir(), "nobody.sock"), testLogger(t))
	if errdefs.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "did not answer") {
		t.Errorf("Dial(no server) error = %v, want Unavailable", err)
	}
}
