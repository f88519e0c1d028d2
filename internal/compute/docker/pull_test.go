package docker_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/compute/computetest"
	"github.com/openshell-go/openshell/internal/compute/docker"
	"github.com/openshell-go/openshell/internal/compute/docker/dockertest"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// unreachableImage names a registry on a loopback port nothing listens
// on, so its pull fails at once.
func unreachableImage(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr + "/openshell/absent:1"
}

// TestPullFailureIsReported: an image that is absent and cannot be pulled
// leaves the sandbox reported with Ready=False/ErrImagePull and a
// warning event naming the image, until it is deleted.
func TestPullFailureIsReported(t *testing.T) {
	e := newEnv(t)
	d := e.open(t, nil)
	cleanupSandboxes(t, d)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	events, _, err := d.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sb := goodSandbox(computetest.NewID(), computetest.NewName())
	img := unreachableImage(t)
	sb.Spec.Template.Image = img
	if err := d.Create(t.Context(), sb); err != nil {
		t.Fatalf("Create() error = %v, want nil (the pull runs after)", err)
	}
	var warned, failed bool
	timeout := time.After(60 * time.Second)
	for !warned || !failed {
		select {
		case ev := <-events:
			if ev.SandboxID != sb.ID {
				continue
			}
			switch ev.Kind {
			case compute.EventPlatform:
				if ev.Platform.Type == "Warning" && ev.Platform.Reason == "ErrImagePull" {
					if !strings.Contains(ev.Platform.Message, img) {
						t.Errorf("pull failure message %q does not name %s", ev.Platform.Message, img)
					}
					warned = true
				}
			case compute.EventSandbox:
				if c, _ := computetest.Cond(ev.Sandbox, compute.ConditionReady); c.Reason == "ErrImagePull" && c.Status == "False" {
					failed = true
				}
			}
		case <-timeout:
			t.Fatalf("no pull failure reported (warning %v, condition %v)", warned, failed)
		}
	}
	got, err := d.Get(t.Context(), compute.Ref{Name: sb.Name})
	if c, _ := computetest.Cond(got, compute.ConditionReady); err != nil || c.Reason != "ErrImagePull" {
		t.Errorf("Get after failed pull = %+v, %v, want ErrImagePull", got.Status, err)
	}
	dup := goodSandbox(sb.ID, computetest.NewName())
	if err := d.Create(t.Context(), dup); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("Create(same id while failed) = %v, want AlreadyExists", err)
	}
	if err := d.Start(t.Context(), compute.Ref{ID: sb.ID}); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), img) {
		t.Errorf("Start(failed pull) = %v, want FailedPrecondition naming %s", err, img)
	}
	if deleted, err := d.Delete(t.Context(), compute.Ref{ID: sb.ID}); err != nil || !deleted {
		t.Errorf("Delete() = %v, %v, want true", deleted, err)
	}
	if _, err := d.Get(t.Context(), compute.Ref{ID: sb.ID}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get after Delete = %v, want NotFound", err)
	}
}

// TestPullAbsentImage: an image absent from the Engine is pulled (from a
// registry on loopback), with the pull's progress as platform events, and
// the sandbox then runs from it. The create returns before the pull ends.
func TestPullAbsentImage(t *testing.T) {
	e := newEnv(t)
	d := e.open(t, nil)
	cleanupSandboxes(t, d)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	events, _, err := d.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	img := serveImage(t, "openshell/pulled", computetest.NewName(), nil)
	sb := goodSandbox(computetest.NewID(), computetest.NewName())
	sb.Spec.Template.Image = img
	if err := d.Create(t.Context(), sb); err != nil {
		t.Fatalf("Create() error = %v", err)
	}
	var reasons []string
	timeout := time.After(60 * time.Second)
	for ready := false; !ready; {
		select {
		case ev := <-events:
			if ev.SandboxID != sb.ID {
				continue
			}
			switch ev.Kind {
			case compute.EventPlatform:
				reasons = append(reasons, ev.Platform.Reason)
			case compute.EventSandbox:
				ready = computetest.IsReady(ev.Sandbox)
			}
		case <-timeout:
			t.Fatalf("sandbox from pulled image %s not ready; events %v", img, reasons)
		}
	}
	for _, want := range []string{"Pulling", "PullProgress", "Pulled"} {
		if !slices.Contains(reasons, want) {
			t.Errorf("platform events %v lack %s", reasons, want)
		}
	}
	if b := readFile(t, e.cli, "openshell-"+sb.ID, "/etc/served"); string(b) != "served by the test registry\n" {
		t.Errorf("file from the pulled image = %q", b)
	}
}

// TestDeleteDuringPull: a sandbox deleted while its image is being pulled
// is gone at once, and nothing of it appears once the pull would have
// ended.
func TestDeleteDuringPull(t *testing.T) {
	e := newEnv(t)
	d := e.open(t, nil)
	hold := make(chan struct{})
	img := serveImage(t, "openshell/held", computetest.NewName(), hold)
	sb := goodSandbox(computetest.NewID(), computetest.NewName())
	sb.Spec.Template.Image = img
	if err := d.Create(t.Context(), sb); err != nil {
		t.Fatal(err)
	}
	if got, err := d.Get(t.Context(), compute.Ref{ID: sb.ID}); err != nil {
		t.Fatalf("Get(pulling) error = %v", err)
	} else if c, _ := computetest.Cond(got, compute.ConditionReady); c.Reason != "Pulling" {
		t.Errorf("Ready condition while pulling = %+v, want Pulling", c)
	}
	deleted, err := d.Delete(t.Context(), compute.Ref{Name: sb.Name})
	if err != nil || !deleted {
		t.Fatalf("Delete(pulling) = %v, %v, want true", deleted, err)
	}
	if _, err := d.Get(t.Context(), compute.Ref{ID: sb.ID}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get after Delete = %v, want NotFound", err)
	}
	close(hold)
	d.Close() // joins the pull
	if c := containersOf(t, e.cli, sb.ID); len(c) != 0 {
		t.Errorf("containers after delete during pull: %+v", c)
	}
	if v := volumesOf(t, e.cli, sb.ID); len(v) != 0 {
		t.Errorf("volumes after delete during pull: %v", v)
	}
}

// TestPullNeverRefusesAbsentImage: with image_pull_policy = "Never" an
// absent image fails validation before anything is created.
func TestPullNeverRefusesAbsentImage(t *testing.T) {
	e := newEnv(t)
	d := e.open(t, map[string]any{"image_pull_policy": "Never"})
	sb := goodSandbox(computetest.NewID(), computetest.NewName())
	sb.Spec.Template.Image = "openshell-test/absent:1"
	err := d.ValidateCreate(t.Context(), sb)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "openshell-test/absent:1") {
		t.Errorf("ValidateCreate(absent image) = %v, want FailedPrecondition naming the image", err)
	}
	sb.Spec.Template.Image = ""
	if err := d.ValidateCreate(t.Context(), sb); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("ValidateCreate(no image, no default_image) = %v, want InvalidArgument", err)
	}
	d2 := e.open(t, map[string]any{"image_pull_policy": "Never", "default_image": dockertest.BusyboxImage})
	if err := d2.ValidateCreate(t.Context(), sb); err != nil {
		t.Errorf("ValidateCreate(default image present) = %v, want nil", err)
	}
}

// TestGPURequestWithoutGPUs: a GPU request the Engine cannot serve fails
// the create with a clear error and leaves nothing behind.
func TestGPURequestWithoutGPUs(t *testing.T) {
	e := newEnv(t)
	d := e.open(t, nil)
	cleanupSandboxes(t, d)
	sb := goodSandbox(computetest.NewID(), computetest.NewName())
	sb.Spec.Template.Resources.GPUs = 1
	err := d.Create(t.Context(), sb)
	if err == nil {
		t.Skip("this Docker Engine has GPUs")
	}
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "GPU") {
		t.Errorf("Create(1 GPU) = %v, want FailedPrecondition about GPUs", err)
	}
	if c := containersOf(t, e.cli, sb.ID); len(c) != 0 {
		t.Errorf("containers after failed create = %v", c)
	}
	if v := volumesOf(t, e.cli, sb.ID); len(v) != 0 {
		t.Errorf("volumes after failed create = %v", v)
	}
}

// TestDaemonErrors: a missing or dead Docker socket is a clear
// FailedPrecondition at Open.
func TestDaemonErrors(t *testing.T) {
	dir := t.TempDir()
	dead := filepath.Join(dir, "dead.sock")
	ln, err := net.Listen("unix", dead)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	for _, tc := range []struct{ name, socket, want string }{
		{"missing", filepath.Join(dir, "missing.sock"), "does not exist"},
		{"nobody listens", dead, "nothing listens"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := docker.Open(map[string]any{"socket_path": tc.socket, "supervisor_bin": "/bin/true"},
				compute.FactoryDeps{StateDir: t.TempDir(), GatewayEndpoint: "unix:///run/gw.sock"})
			if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), tc.socket) {
				t.Errorf("Open(%s) = %v, want FailedPrecondition naming the socket and %q", tc.socket, err, tc.want)
			}
		})
	}
}

// envDeniedChild makes the test binary a child that opens the driver on
// the socket it names and prints the error (see TestDaemonPermissionDenied).
const envDeniedChild = "OPENSHELL_DOCKER_TEST_DENIED_SOCKET"

func init() {
	if sock := os.Getenv(envDeniedChild); sock != "" {
		_, err := docker.Open(map[string]any{"socket_path": sock, "supervisor_bin": "/bin/true"},
			compute.FactoryDeps{StateDir: os.TempDir(), GatewayEndpoint: "unix:///run/gw.sock"})
		fmt.Print(err, " kind=", errdefs.Code(err))
		os.Exit(0)
	}
}

// TestDaemonPermissionDenied: a Docker socket the gateway's user may not
// open is a FailedPrecondition saying so and naming the socket. The check
// runs the test binary as nobody against a root-only socket.
func TestDaemonPermissionDenied(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a child as another user")
	}
	dir, err := os.MkdirTemp("", "openshell-denied-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "docker.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := os.Chmod(sock, 0o600); err != nil {
		t.Fatal(err)
	}
	// A copy of the test binary nobody may run (the build directory is
	// root's).
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(dir, "docker.test")
	if err := os.WriteFile(exe, data, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), envDeniedChild+"="+sock)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child as nobody: %v\n%s", err, out)
	}
	if got := string(out); !strings.Contains(got, "permission denied on Docker socket "+sock) || !strings.Contains(got, "kind=FailedPrecondition") {
		t.Errorf("Open(root-only socket) as nobody = %q, want FailedPrecondition: permission denied naming the socket", got)
	}
}

func TestConfigRefusals(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  map[string]any
		deps compute.FactoryDeps
	}{
		{"unknown key", map[string]any{"privileged": true}, compute.FactoryDeps{}},
		{"supervisor_image", map[string]any{"supervisor_image": "ghcr.io/x/supervisor:1"}, compute.FactoryDeps{}},
		{"host_gateway_ip", map[string]any{"host_gateway_ip": "172.17.0.1"}, compute.FactoryDeps{}},
		{"pull policy", map[string]any{"image_pull_policy": "Sometimes"}, compute.FactoryDeps{}},
		{"pids limit", map[string]any{"sandbox_pids_limit": -1}, compute.FactoryDeps{}},
		{"tcp callback", nil, compute.FactoryDeps{GatewayEndpoint: "http://127.0.0.1:17670"}},
		{"relative supervisor", map[string]any{"supervisor_bin": "openshell-sandbox"}, compute.FactoryDeps{}},
		{"openshell bind mounts", map[string]any{"enable_bind_mounts": true}, compute.FactoryDeps{}},
		{"openshell network", map[string]any{"network_name": "openshell"}, compute.FactoryDeps{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			deps := tc.deps
			deps.StateDir = t.TempDir()
			if deps.GatewayEndpoint == "" {
				deps.GatewayEndpoint = "unix:///run/gw.sock"
			}
			cfg := map[string]any{"socket_path": filepath.Join(t.TempDir(), "none.sock")}
			for k, v := range tc.cfg {
				cfg[k] = v
			}
			_, err := docker.Open(cfg, deps)
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("Open(%v) = %v, want InvalidArgument", tc.cfg, err)
			}
		})
	}
}

func init() {
	// The daemon-error cases must not pick up a DOCKER_HOST of the
	// environment through socket_path's fallback.
	_ = os.Unsetenv("DOCKER_HOST")
}

// TestConfigZeroOpenShellKeys: an OpenShell-only key at its zero value
// does nothing and is accepted (the error is then the missing socket).
func TestConfigZeroOpenShellKeys(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "none.sock")
	_, err := docker.Open(map[string]any{"socket_path": sock, "enable_bind_mounts": false, "network_name": "", "sandbox_pids_limit": 0},
		compute.FactoryDeps{StateDir: t.TempDir(), GatewayEndpoint: "unix:///run/gw.sock"})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), sock) {
		t.Errorf("Open(zero OpenShell keys, missing socket) = %v, want FailedPrecondition about the socket", err)
	}
}
