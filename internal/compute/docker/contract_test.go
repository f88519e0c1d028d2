package docker_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/volume"
	"github.com/google/go-cmp/cmp"

	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/compute/computetest"
	"github.com/openshell-go/openshell/internal/compute/docker"
	"github.com/openshell-go/openshell/internal/compute/docker/dockertest"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/supervisor/egress/hostdial"
)

// TestContainerContract checks what the supervisor finds in its container
// and what the Engine records about it: the environment contract, the
// token as a root-only 0600 file (never in env or labels), no network, the
// callback socket reachable, the dropped capabilities, labels and limits.
func TestContainerContract(t *testing.T) {
	e := newEnv(t)
	d := e.open(t, map[string]any{"sandbox_pids_limit": 256})
	cleanupSandboxes(t, d)
	sb := goodSandbox(computetest.NewID(), computetest.NewName())
	sb.Spec.Command = []string{"/bin/sh", "-c", "echo hi"}
	sb.Spec.LogLevel = "debug"
	sb.Spec.Environment["OPENSHELL_SANDBOX_TOKEN"] = "smuggled"
	sb.Spec.Environment["OPENSHELL_EGRESS_TEST_HOSTS"] = "smuggled=127.0.0.1"
	sb.Spec.Template.Resources = compute.Resources{CPURequest: "250m", CPULimit: "500m", MemoryRequest: "64Mi", MemoryLimit: "128Mi"}
	if err := d.Create(t.Context(), sb); err != nil {
		t.Fatalf("Create() error = %v", err)
	}
	waitReady(t, d, sb.ID)
	r := reports(t, e.cli, sb.ID, 1)[0]

	wantEnv := map[string]string{
		"OPENSHELL_SANDBOX_ID":         sb.ID,
		"OPENSHELL_SANDBOX_NAME":       sb.Name,
		"OPENSHELL_ENDPOINT":           "unix://" + docker.CallbackDir + "/gateway.sock",
		"OPENSHELL_SANDBOX_TOKEN_FILE": docker.TokenDir + "/token",
		"OPENSHELL_SANDBOX_COMMAND":    `["/bin/sh","-c","echo hi"]`,
		"OPENSHELL_SANDBOX_TTY":        "false",
		"OPENSHELL_LOG_LEVEL":          "debug",
		"OPENSHELL_WORKSPACE_DIR":      "/sandbox",
		"OPENSHELL_PRIVATE_NETWORK":    "true",
		"OPENSHELL_EGRESS_DIALER_PATH": docker.EgressDir + "/dialer.sock",
		"HOME":                         "/sandbox",
		"FROM_TEMPLATE":                "t",
		"FROM_SPEC":                    "s",
	}
	for k, v := range wantEnv {
		if r.Env[k] != v {
			t.Errorf("env %s = %q, want %q", k, r.Env[k], v)
		}
	}
	for _, k := range []string{"OPENSHELL_SANDBOX_TOKEN", "OPENSHELL_EGRESS_TEST_HOSTS"} {
		if v, ok := r.Env[k]; ok {
			t.Errorf("env %s = %q, want unset (the spec's value is dropped)", k, v)
		}
	}
	if r.Token != sb.Spec.SandboxToken || r.TokenMode != "600" || r.TokenDir != "700" || r.TokenUID != 0 {
		t.Errorf("token file = %q mode %s (dir %s) uid %d, want the spec token, 600 in 700, uid 0", r.Token, r.TokenMode, r.TokenDir, r.TokenUID)
	}
	if r.UID != 0 || r.Cwd != "/sandbox" || r.Hostname != sb.Name || len(r.Args) != 0 {
		t.Errorf("uid %d cwd %q hostname %q args %q, want 0 /sandbox %q none", r.UID, r.Cwd, r.Hostname, r.Args, sb.Name)
	}
	if diff := cmp.Diff([]string{"lo"}, r.Interfaces); diff != "" {
		t.Errorf("network interfaces (-want +got):\n%s", diff)
	}
	if r.Callback != "ok" {
		t.Errorf("dial the gateway callback socket: %s", r.Callback)
	}
	// CHOWN(0) KILL(5) SETGID(6) SETUID(7) SETPCAP(8).
	if r.CapEff != "00000000000001e1" {
		t.Errorf("CapEff = %s, want 00000000000001e1 (CHOWN KILL SETGID SETUID SETPCAP)", r.CapEff)
	}
	if r.NoNewPrivs != "1" {
		t.Errorf("NoNewPrivs = %q, want 1", r.NoNewPrivs)
	}
	if r.PidsMax != "256" {
		t.Errorf("pids.max = %q, want 256", r.PidsMax)
	}

	info, err := e.cli.ContainerInspect(t.Context(), "openshell-"+sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range info.Config.Env {
		if strings.Contains(kv, sb.Spec.SandboxToken) || strings.Contains(kv, "smuggled") {
			t.Errorf("container env holds the token: %q", kv)
		}
	}
	for k, v := range info.Config.Labels {
		if strings.Contains(v, sb.Spec.SandboxToken) {
			t.Errorf("label %s holds the token", k)
		}
	}
	wantLabels := map[string]string{docker.LabelSandboxID: sb.ID, docker.LabelSandboxName: sb.Name, docker.LabelGatewayID: d.GatewayID(), docker.LabelWorkspace: "default"}
	for k, v := range wantLabels {
		if info.Config.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, info.Config.Labels[k], v)
		}
	}
	if info.HostConfig.NetworkMode != "none" {
		t.Errorf("network mode = %q, want none", info.HostConfig.NetworkMode)
	}
	if got := info.HostConfig.Resources; got.NanoCPUs != 500_000_000 || got.CPUShares != 256 || got.Memory != 128<<20 || got.MemoryReservation != 64<<20 {
		t.Errorf("resources = cpus %d shares %d memory %d reservation %d, want 5e8 256 128Mi 64Mi", got.NanoCPUs, got.CPUShares, got.Memory, got.MemoryReservation)
	}
	var supervisorRO, egressRO bool
	for _, m := range info.Mounts {
		switch m.Destination {
		case docker.SupervisorPath:
			supervisorRO = !m.RW
		case docker.EgressDir:
			egressRO = !m.RW && m.Source == filepath.Join(e.stateDir, "docker", "egress", sb.ID)
		}
	}
	if !egressRO {
		t.Errorf("host dialer directory is not mounted read-only from the state dir at %s: %+v", docker.EgressDir, info.Mounts)
	}
	if !supervisorRO {
		t.Errorf("supervisor binary is not mounted read-only at %s: %+v", docker.SupervisorPath, info.Mounts)
	}
	if info.Path != docker.SupervisorPath || len(info.Args) != 0 {
		t.Errorf("container runs %q %q, want the supervisor without arguments", info.Path, info.Args)
	}
}

// TestStopStartKeepsWorkspace: stop and start run the same container
// again with its workspace volume; delete leaves no container and no
// volume behind.
func TestStopStartKeepsWorkspace(t *testing.T) {
	e := newEnv(t)
	d := e.open(t, nil)
	cleanupSandboxes(t, d)
	sb := goodSandbox(computetest.NewID(), computetest.NewName())
	if err := d.Create(t.Context(), sb); err != nil {
		t.Fatal(err)
	}
	first := waitReady(t, d, sb.ID)
	reports(t, e.cli, sb.ID, 1)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	_ = tw.WriteHeader(&tar.Header{Name: "kept.txt", Mode: 0o644, Size: 4, ModTime: time.Now()})
	_, _ = tw.Write([]byte("kept"))
	_ = tw.Close()
	if err := e.cli.CopyToContainer(t.Context(), "openshell-"+sb.ID, "/sandbox", &buf, container.CopyToContainerOptions{}); err != nil {
		t.Fatal(err)
	}
	before := containersOf(t, e.cli, sb.ID)

	if err := d.Stop(t.Context(), compute.Ref{ID: sb.ID}); err != nil {
		t.Fatalf("Stop() error = %v", err)
	}
	got, err := d.Get(t.Context(), compute.Ref{ID: sb.ID})
	if err != nil || !computetest.IsStopped(got) {
		t.Fatalf("Get after Stop = %+v, %v, want stopped", got.Status, err)
	}
	if c, ok := computetest.Cond(got, compute.ConditionSuspended); !ok || c.Status != "True" {
		t.Errorf("Suspended condition after Stop = %+v, want True", c)
	}
	if err := d.Start(t.Context(), compute.Ref{Name: sb.Name}); err != nil {
		t.Fatalf("Start() error = %v", err)
	}
	second := waitReady(t, d, sb.ID)
	if second.Status.InstanceID == first.Status.InstanceID {
		t.Errorf("InstanceID after Start = %q, want a new one", second.Status.InstanceID)
	}
	reports(t, e.cli, sb.ID, 2)
	if b := readFile(t, e.cli, "openshell-"+sb.ID, "/sandbox/kept.txt"); string(b) != "kept" {
		t.Errorf("workspace file after stop/start = %q, want kept", b)
	}
	after := containersOf(t, e.cli, sb.ID)
	if len(before) != 1 || len(after) != 1 || before[0].ID != after[0].ID {
		t.Errorf("containers before %v after %v, want the same one", before, after)
	}

	deleted, err := d.Delete(t.Context(), compute.Ref{ID: sb.ID})
	if err != nil || !deleted {
		t.Fatalf("Delete() = %v, %v", deleted, err)
	}
	if c := containersOf(t, e.cli, sb.ID); len(c) != 0 {
		t.Errorf("containers after Delete = %v, want none", c)
	}
	if v := volumesOf(t, e.cli, sb.ID); len(v) != 0 {
		t.Errorf("volumes after Delete = %v, want none", v)
	}
}

// TestExitedOnItsOwn: a supervisor that exits is reported with its exit
// code, not as stopped.
func TestExitedOnItsOwn(t *testing.T) {
	e := newEnv(t)
	d := e.open(t, nil)
	cleanupSandboxes(t, d)
	sb := goodSandbox(computetest.NewID(), computetest.NewName())
	sb.Spec.Environment["FAKE_SUPERVISOR_EXIT"] = "3"
	if err := d.Create(t.Context(), sb); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, err := d.Get(t.Context(), compute.Ref{ID: sb.ID})
		if err != nil {
			t.Fatal(err)
		}
		if c, _ := computetest.Cond(got, compute.ConditionReady); c.Reason == "ProcessExited" {
			if !strings.Contains(c.Message, "code 3") || computetest.IsReady(got) {
				t.Errorf("Ready condition = %+v, want False with exit code 3", c)
			}
			if _, ok := computetest.Cond(got, compute.ConditionSuspended); ok {
				t.Errorf("Suspended condition on a sandbox nobody stopped")
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no ProcessExited condition: %+v", got.Status)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRecoverAfterCrash: a second driver on the same state directory (a
// gateway restarted after kill -9; Close never touches containers) finds
// the same running containers by label, and refuses duplicates.
func TestRecoverAfterCrash(t *testing.T) {
	e := newEnv(t)
	d1 := e.open(t, nil)
	var ids []string
	for range 3 {
		sb := goodSandbox(computetest.NewID(), computetest.NewName())
		if err := d1.Create(t.Context(), sb); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	for _, id := range ids {
		waitReady(t, d1, id)
	}
	before := map[string]string{}
	for _, id := range ids {
		before[id] = containersOf(t, e.cli, id)[0].ID
	}
	d1.Close()

	d2 := e.open(t, nil)
	cleanupSandboxes(t, d2)
	if d2.GatewayID() != d1.GatewayID() {
		t.Errorf("gateway id after restart = %s, want %s", d2.GatewayID(), d1.GatewayID())
	}
	list, err := d2.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, sb := range list {
		got = append(got, sb.ID)
		if !computetest.IsReady(sb) {
			t.Errorf("sandbox %s after restart: %+v, want ready", sb.ID, sb.Status)
		}
	}
	slices.Sort(got)
	slices.Sort(ids)
	if diff := cmp.Diff(ids, got); diff != "" {
		t.Errorf("List after restart (-want +got):\n%s", diff)
	}
	for _, id := range ids {
		c := containersOf(t, e.cli, id)
		if len(c) != 1 || c[0].ID != before[id] || c[0].State != "running" {
			t.Errorf("containers of %s after restart = %+v, want the same running one %s", id, c, before[id])
		}
	}
	dup := goodSandbox(ids[0], computetest.NewName())
	if err := d2.Create(t.Context(), dup); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("Create(existing id) after restart = %v, want AlreadyExists", err)
	}
}

// TestOrphanVolumeSwept: a workspace volume of this gateway without its
// container (a create cut short between the two) is removed when the
// driver opens; another gateway's volume is left alone.
func TestOrphanVolumeSwept(t *testing.T) {
	e := newEnv(t)
	d1 := e.open(t, nil)
	mine, theirs := computetest.NewID(), computetest.NewID()
	for id, gw := range map[string]string{mine: d1.GatewayID(), theirs: "another-gateway"} {
		_, err := e.cli.VolumeCreate(t.Context(), volume.CreateOptions{Name: "openshell-" + id + "-workspace", Labels: map[string]string{
			docker.LabelGatewayID: gw, docker.LabelSandboxID: id,
		}})
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _ = e.cli.VolumeRemove(context.Background(), "openshell-"+theirs+"-workspace", true) })
	d1.Close()
	e.open(t, nil)
	if v := volumesOf(t, e.cli, mine); len(v) != 0 {
		t.Errorf("orphan volume of this gateway after Open: %v, want removed", v)
	}
	if v := volumesOf(t, e.cli, theirs); len(v) != 1 {
		t.Errorf("another gateway's volume after Open: %v, want kept", v)
	}
}

// TestUnstartedContainerSwept: a container of this gateway that was
// created but never started (the gateway died inside Create) is removed,
// with its volume, when the driver opens.
func TestUnstartedContainerSwept(t *testing.T) {
	e := newEnv(t)
	d1 := e.open(t, nil)
	id := computetest.NewID()
	labels := map[string]string{docker.LabelGatewayID: d1.GatewayID(), docker.LabelSandboxID: id, docker.LabelSandboxName: "cut-short"}
	if _, err := e.cli.VolumeCreate(t.Context(), volume.CreateOptions{Name: "openshell-" + id + "-workspace", Labels: labels}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cli.ContainerCreate(t.Context(), &container.Config{Image: dockertest.BusyboxImage, Labels: labels, Cmd: []string{"true"}},
		&container.HostConfig{NetworkMode: "none"}, nil, nil, "openshell-"+id); err != nil {
		t.Fatal(err)
	}
	d1.Close()
	d2 := e.open(t, nil)
	if c := containersOf(t, e.cli, id); len(c) != 0 {
		t.Errorf("unstarted container after Open: %+v, want removed", c)
	}
	if v := volumesOf(t, e.cli, id); len(v) != 0 {
		t.Errorf("its volume after Open: %v, want removed", v)
	}
	if _, err := d2.Get(t.Context(), compute.Ref{ID: id}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get(interrupted create) = %v, want NotFound", err)
	}
}

// TestConcurrentCreateSameName: of several creates of one name under
// different ids at once, exactly one succeeds; the others are
// AlreadyExists and leave nothing behind.
func TestConcurrentCreateSameName(t *testing.T) {
	e := newEnv(t)
	d := e.open(t, nil)
	cleanupSandboxes(t, d)
	name := computetest.NewName()
	const n = 4
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		ids[i] = computetest.NewID()
		wg.Go(func() { errs[i] = d.Create(t.Context(), goodSandbox(ids[i], name)) })
	}
	wg.Wait()
	ok := 0
	for i, err := range errs {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, errdefs.ErrAlreadyExists):
			if c := containersOf(t, e.cli, ids[i]); len(c) != 0 {
				t.Errorf("refused create %s left containers %+v", ids[i], c)
			}
		default:
			t.Errorf("Create(%s) = %v, want nil or AlreadyExists", ids[i], err)
		}
	}
	if ok != 1 {
		t.Errorf("%d creates of %s succeeded, want exactly 1 (errors %v)", ok, name, errs)
	}
}

// TestHostDialerServedAgain: the driver serves each sandbox's host dialer
// on <state_dir>/docker/egress/<id>/dialer.sock (directory 0700, socket
// 0600), which dials from the host; a driver opened again after the first
// is gone (a gateway restart) serves the same socket again, removes the
// directory of a sandbox that has no container, and Delete removes the
// sandbox's directory.
func TestHostDialerServedAgain(t *testing.T) {
	e := newEnv(t)
	d1 := e.open(t, nil)
	sb := goodSandbox(computetest.NewID(), computetest.NewName())
	if err := d1.Create(t.Context(), sb); err != nil {
		t.Fatal(err)
	}
	waitReady(t, d1, sb.ID)
	dir := filepath.Join(e.stateDir, "docker", "egress", sb.ID)
	sock := filepath.Join(dir, "dialer.sock")
	upstream, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer upstream.Close()
	go func() {
		for {
			c, err := upstream.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("up"))
			c.Close()
		}
	}()
	dial := func(what string) {
		t.Helper()
		for p, want := range map[string]os.FileMode{dir: 0o700 | os.ModeDir, sock: 0o600 | os.ModeSocket} {
			if st, err := os.Stat(p); err != nil || st.Mode() != want {
				t.Fatalf("%s: %s = %v %v, want mode %v", what, p, st, err, want)
			}
		}
		c := hostdial.NewSocketClient(sock)
		defer c.Close()
		conn, err := c.Dial(t.Context(), netip.MustParseAddrPort(upstream.Addr().String()))
		if err != nil {
			t.Fatalf("%s: dial through the host dialer: %v", what, err)
		}
		defer conn.Close()
		if b, err := io.ReadAll(conn); err != nil || string(b) != "up" {
			t.Fatalf("%s: read %q %v, want up", what, b, err)
		}
	}
	dial("first driver")
	stale := filepath.Join(e.stateDir, "docker", "egress", computetest.NewID())
	if err := os.MkdirAll(stale, 0o700); err != nil {
		t.Fatal(err)
	}
	d1.Close()
	if _, err := hostdial.NewSocketClient(sock).Dial(t.Context(), netip.MustParseAddrPort(upstream.Addr().String())); err == nil {
		t.Fatal("dial after the driver closed succeeded, want an error")
	}

	d2 := e.open(t, nil)
	cleanupSandboxes(t, d2)
	dial("driver opened again")
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("dialer directory of a sandbox without container: %v, want removed", err)
	}
	if _, err := d2.Delete(t.Context(), compute.Ref{ID: sb.ID}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("dialer directory after Delete: %v, want removed", err)
	}
}
