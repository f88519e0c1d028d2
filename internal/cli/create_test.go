package cli

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/structpb"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

type createFake struct {
	*forwardFake
	mu       sync.Mutex
	created  *openshellv1.CreateSandboxRequest
	watchReq *openshellv1.WatchSandboxRequest
	deleted  []string
	watching chan struct{}
}

// newCreateFake answers CreateSandbox with a provisioning sandbox and
// streams the given phases (and one platform event) on WatchSandbox.
func newCreateFake(phases ...openshellv1.SandboxPhase) *createFake {
	cf := &createFake{forwardFake: newForwardFake(), watching: make(chan struct{}, 1)}
	cf.createSandbox = func(_ context.Context, r *openshellv1.CreateSandboxRequest) (*openshellv1.SandboxResponse, error) {
		cf.mu.Lock()
		cf.created = r
		cf.mu.Unlock()
		name := r.GetName()
		if name == "" {
			name = "brave-otter"
		}
		sb := testSandbox(name, openshellv1.SandboxPhase_SANDBOX_PHASE_PROVISIONING)
		sb.Spec = r.GetSpec()
		return &openshellv1.SandboxResponse{Sandbox: sb}, nil
	}
	cf.watchSandbox = func(r *openshellv1.WatchSandboxRequest, s grpc.ServerStreamingServer[openshellv1.SandboxStreamEvent]) error {
		cf.mu.Lock()
		cf.watchReq = r
		cf.mu.Unlock()
		cf.watching <- struct{}{}
		name := strings.TrimPrefix(r.GetId(), "id-")
		_ = s.Send(&openshellv1.SandboxStreamEvent{Payload: &openshellv1.SandboxStreamEvent_Event{Event: &openshellv1.PlatformEvent{Reason: "Scheduled", Message: "supervisor started"}}})
		for _, ph := range phases {
			sb := testSandbox(name, ph)
			if ph == openshellv1.SandboxPhase_SANDBOX_PHASE_ERROR {
				sb.Status.Conditions = []*openshellv1.SandboxCondition{{Type: "Ready", Status: "False", Reason: "ImagePullBackOff", Message: "image ghcr.io/nope not found"}}
			}
			if err := s.Send(&openshellv1.SandboxStreamEvent{Payload: &openshellv1.SandboxStreamEvent_Sandbox{Sandbox: sb}}); err != nil {
				return err
			}
		}
		<-s.Context().Done() // hold the stream open like a real watch
		return nil
	}
	cf.deleteSandbox = func(_ context.Context, r *openshellv1.DeleteSandboxRequest) (*openshellv1.DeleteSandboxResponse, error) {
		cf.mu.Lock()
		cf.deleted = append(cf.deleted, r.GetName())
		cf.mu.Unlock()
		return &openshellv1.DeleteSandboxResponse{Deleted: true}, nil
	}
	return cf
}

func TestCreateDetach(t *testing.T) {
	cf := newCreateFake(openshellv1.SandboxPhase_SANDBOX_PHASE_PROVISIONING, openshellv1.SandboxPhase_SANDBOX_PHASE_READY)
	ep := cf.serve(t)
	tt := newTester(t)
	r := tt.run("--gateway-endpoint", ep, "sandbox", "create", "--name", "dev", "--image", "img:1",
		"--label", "team=ml", "--env", "A=1", "--provider", "claude", "--detach", "--", "claude", "--yolo")
	if r.err != nil {
		t.Fatalf("create: %v (%q)", r.err, r.stderr)
	}
	wantReq := &openshellv1.CreateSandboxRequest{
		Name: "dev", Labels: map[string]string{"team": "ml"},
		Spec: &openshellv1.SandboxSpec{
			Template: &openshellv1.SandboxTemplate{Image: "img:1"}, Environment: map[string]string{"A": "1"},
			Providers: []string{"claude"}, Command: []string{"claude", "--yolo"}, Tty: false,
		},
	}
	if diff := cmp.Diff(wantReq, cf.created, protocmp.Transform()); diff != "" {
		t.Errorf("CreateSandbox request (-want +got):\n%s", diff)
	}
	wantWatch := &openshellv1.WatchSandboxRequest{Id: "id-dev", FollowStatus: true, FollowEvents: true, StopOnTerminal: true}
	if diff := cmp.Diff(wantWatch, cf.watchReq, protocmp.Transform()); diff != "" {
		t.Errorf("WatchSandbox request (-want +got):\n%s", diff)
	}
	wantErr := "Created sandbox dev\n" +
		"sandbox dev: Provisioning\n" +
		"  Scheduled: supervisor started\n" +
		"sandbox dev: Ready\n" +
		"Sandbox dev is ready\n" +
		"Connect with: openshell sandbox connect dev\n"
	if diff := cmp.Diff(wantErr, r.stderr); diff != "" {
		t.Errorf("create progress (-want +got):\n%s", diff)
	}
}

func TestCreateDefaultsAndJSON(t *testing.T) {
	cf := newCreateFake(openshellv1.SandboxPhase_SANDBOX_PHASE_READY)
	ep := cf.serve(t)
	tt := newTester(t)
	tt.setup = func(a *app) { a.stdinTerminal = func() bool { return true } }
	r := tt.run("--gateway-endpoint", ep, "-o", "json", "sandbox", "create")
	if r.err != nil {
		t.Fatalf("create: %v", r.err)
	}
	// No command: the supervisor picks the login shell (bash, else sh), so an
	// image without bash still works. No template either.
	if got := cf.created.GetSpec(); got.GetCommand() != nil || !got.GetTty() || got.GetTemplate() != nil || got.GetResourceRequirements() != nil {
		t.Errorf("default spec = %v, want no command, no template, no resources and tty (stdin is a terminal)", got)
	}
	var sb map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &sb); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, r.stdout)
	}
	if sb["metadata"].(map[string]any)["name"] != "brave-otter" || sb["status"].(map[string]any)["phase"] != "SANDBOX_PHASE_READY" {
		t.Errorf("create -o json = %s", r.stdout)
	}
}

func TestCreateAttachesShell(t *testing.T) {
	cf := newCreateFake(openshellv1.SandboxPhase_SANDBOX_PHASE_READY)
	cf.sshTarget = fakeSSHServer(t)
	ep := cf.serve(t)
	tt := newTester(t)
	tt.stdin = strings.NewReader("ls\n")
	r := tt.run("--gateway-endpoint", ep, "sandbox", "create", "--name", "dev")
	if r.code() != 3 || r.stdout != "sandbox got: LS\n" {
		t.Errorf("create+attach = code %d stdout %q (err %v)", r.code(), r.stdout, r.err)
	}
}

func TestCreateError(t *testing.T) {
	cf := newCreateFake(openshellv1.SandboxPhase_SANDBOX_PHASE_ERROR)
	ep := cf.serve(t)
	r := newTester(t).run("--gateway-endpoint", ep, "sandbox", "create", "--name", "bad", "--detach")
	if r.code() != 1 || !strings.Contains(r.err.Error(), "sandbox bad failed: ImagePullBackOff: image ghcr.io/nope not found") {
		t.Errorf("create error = %v (code %d)", r.err, r.code())
	}
}

func TestCreatePollsWithoutWatch(t *testing.T) {
	cf := newCreateFake()
	cf.watchSandbox = nil // Unimplemented
	ep := cf.serve(t)
	r := newTester(t).run("--gateway-endpoint", ep, "sandbox", "create", "--name", "box", "--detach")
	if r.err != nil || !strings.Contains(r.stderr, "Sandbox box is ready") {
		t.Errorf("create with polling = %v (%q)", r.err, r.stderr)
	}
}

func TestCreateInterrupted(t *testing.T) {
	for _, tc := range []struct {
		name        string
		terminal    bool
		answer      string
		wantDeleted bool
		wantMsg     string
	}{
		{"not a terminal leaves it", false, "", false, "Delete it with: openshell sandbox delete slow"},
		{"terminal, answer no", true, "n\n", false, "delete sandbox slow? [y/N] Sandbox slow was left in place"},
		{"terminal, answer yes", true, "y\n", true, "delete sandbox slow? [y/N] Deleted sandbox slow"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cf := newCreateFake(openshellv1.SandboxPhase_SANDBOX_PHASE_PROVISIONING)
			ep := cf.serve(t)
			tt := newTester(t)
			tt.stdin = strings.NewReader(tc.answer)
			tt.setup = func(a *app) { a.stdinTerminal = func() bool { return tc.terminal } }
			ctx, cancel := context.WithCancel(t.Context())
			go func() {
				select {
				case <-cf.watching:
				case <-time.After(10 * time.Second):
				}
				cancel() // Ctrl-C
			}()
			r := tt.runCtx(ctx, "--gateway-endpoint", ep, "sandbox", "create", "--name", "slow", "--detach")
			if r.code() != 130 {
				t.Errorf("exit code %d, want 130 (err %v)", r.code(), r.err)
			}
			if !strings.Contains(r.stderr, tc.wantMsg) {
				t.Errorf("stderr = %q, want %q", r.stderr, tc.wantMsg)
			}
			cf.mu.Lock()
			deleted := len(cf.deleted) == 1 && cf.deleted[0] == "slow"
			cf.mu.Unlock()
			if deleted != tc.wantDeleted {
				t.Errorf("deleted = %v, want %v", deleted, tc.wantDeleted)
			}
		})
	}
}

func TestCreateRejectsBadInput(t *testing.T) {
	cf := newCreateFake()
	cf.createSandbox = func(context.Context, *openshellv1.CreateSandboxRequest) (*openshellv1.SandboxResponse, error) {
		return nil, status.Error(codes.AlreadyExists, "sandbox already exists")
	}
	ep := cf.serve(t)
	tt := newTester(t)
	if r := tt.run("--gateway-endpoint", ep, "sandbox", "create", "--name", "dup", "--detach"); r.code() != 1 || !strings.Contains(r.err.Error(), `sandbox "dup" already exists in workspace "default"`) {
		t.Errorf("duplicate = %v", r.err)
	}
	if r := tt.run("--gateway-endpoint", ep, "sandbox", "create", "ls"); r.code() != 2 || !strings.Contains(r.err.Error(), "after --") {
		t.Errorf("command without -- = %v", r.err)
	}
	if r := tt.run("--gateway-endpoint", ep, "sandbox", "create", "--tty", "--no-tty"); r.code() != 2 {
		t.Errorf("--tty --no-tty = %v", r.err)
	}
}

func TestCreateResourceFlags(t *testing.T) {
	cf := newCreateFake(openshellv1.SandboxPhase_SANDBOX_PHASE_READY)
	ep := cf.serve(t)
	tt := newTester(t)
	r := tt.run("--gateway-endpoint", ep, "sandbox", "create", "--name", "gpu", "--detach",
		"--cpu", "500m", "--memory", "2Gi", "--gpu", "2",
		"--driver-config-json", `{"kubernetes":{"pod":{"node_selector":{"pool":"gpu"}}}}`, "--", "python3", "train.py")
	if r.err != nil {
		t.Fatalf("create: %v", r.err)
	}
	two := uint32(2)
	resources, _ := structpb.NewStruct(map[string]any{"limits": map[string]any{"cpu": "500m", "memory": "2Gi"}})
	dc, _ := structpb.NewStruct(map[string]any{"kubernetes": map[string]any{"pod": map[string]any{"node_selector": map[string]any{"pool": "gpu"}}}})
	want := &openshellv1.SandboxSpec{
		Command:              []string{"python3", "train.py"},
		Template:             &openshellv1.SandboxTemplate{Resources: resources, DriverConfig: dc},
		ResourceRequirements: &openshellv1.ResourceRequirements{Gpu: &openshellv1.GpuResourceRequirements{Count: &two}},
	}
	if diff := cmp.Diff(want, cf.created.GetSpec(), protocmp.Transform()); diff != "" {
		t.Errorf("spec (-want +got):\n%s", diff)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--cpu", "0"}, "--cpu must be greater than zero"},
		{[]string{"--cpu", "0m"}, "--cpu must be greater than zero"},
		{[]string{"--cpu", "half"}, `invalid --cpu "half"`},
		{[]string{"--memory", "1.5Gi"}, `invalid --memory "1.5Gi"`},
		{[]string{"--memory", "0Gi"}, "--memory must be greater than zero"},
		{[]string{"--gpu"}, "flag needs an argument: --gpu"},
		{[]string{"--gpu", "0"}, `invalid --gpu "0"`},
		{[]string{"--driver-config-json", `["kubernetes"]`}, "keyed by driver name"},
		{[]string{"--driver-config-json", `{"kubernetes":`}, "must be valid JSON"},
		{[]string{"--forward", "x"}, `invalid port spec "x"`},
		{[]string{"-o", "json", "--forward", "8080"}, "--forward cannot be combined with -o json"},
	} {
		cf.created = nil
		args := append([]string{"--gateway-endpoint", ep, "sandbox", "create", "--detach"}, tc.args...)
		r := tt.run(args...)
		if r.code() != 2 || !strings.Contains(r.err.Error(), tc.want) {
			t.Errorf("%v: %v (code %d), want usage error containing %q", tc.args, r.err, r.code(), tc.want)
		}
		if cf.created != nil {
			t.Errorf("%v: a sandbox was created", tc.args)
		}
	}
}

// TestCreateForward: --forward starts a background forward once the
// sandbox is ready.
func TestCreateForward(t *testing.T) {
	bin := buildOpenshell(t)
	cf := newCreateFake(openshellv1.SandboxPhase_SANDBOX_PHASE_READY)
	ep := cf.serve(t)
	tt := newTester(t)
	tt.setup = func(a *app) { a.executable = func() (string, error) { return bin, nil } }
	port := strconv.Itoa(freePort(t))
	r := tt.run("--gateway-endpoint", ep, "sandbox", "create", "--name", "box", "--detach", "--forward", port+":8080")
	if r.err != nil {
		t.Fatalf("create --forward: %v (%q)", r.err, r.stderr)
	}
	m := regexp.MustCompile(`\(pid (\d+)\)`).FindStringSubmatch(r.stdout)
	if m == nil || !strings.Contains(r.stdout, "Forwarding 127.0.0.1:"+port+" -> sandbox box port 8080 in the background") {
		t.Fatalf("create --forward stdout = %q", r.stdout)
	}
	t.Cleanup(func() { _ = tt.run("forward", "stop", port) })
	if !strings.Contains(r.stderr, "Sandbox box is ready\n") {
		t.Errorf("stderr = %q", r.stderr)
	}
	c, err := net.Dial("tcp", "127.0.0.1:"+port)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("ping via create --forward")); err != nil {
		t.Fatal(err)
	}
	_ = c.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(c)
	_ = c.Close()
	if err != nil || string(got) != "ping via create --forward" {
		t.Errorf("echo = %q (%v)", got, err)
	}
	if r := tt.run("forward", "list"); !strings.Contains(r.stdout, "box") || !strings.Contains(r.stdout, m[1]) {
		t.Errorf("forward list = %q", r.stdout)
	}
}
