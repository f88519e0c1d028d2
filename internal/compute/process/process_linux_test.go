//go:build linux

package process_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/openshell-go/openshell/internal/citest"
	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/compute/computetest"
	"github.com/openshell-go/openshell/internal/compute/process"
	"github.com/openshell-go/openshell/internal/errdefs"
)

const testToken = "eyJ.test-token.sig"

var fakeSupervisor string

func TestMain(m *testing.M) {
	if p := os.Getenv(envChildSupervisor); p != "" {
		// Re-executed by TestUnprivileged: the parent built everything.
		fakeSupervisor = p
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "process-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fakeSupervisor = filepath.Join(dir, "openshell-sandbox")
	out, err := exec.Command("go", "build", "-o", fakeSupervisor, "./testdata/fakesupervisor").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build fake supervisor: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	// Every test deletes what it created: a supervisor still running now
	// was leaked (killed here, and the run fails).
	if leaked := killLeaked(fakeSupervisor); len(leaked) > 0 {
		fmt.Fprintf(os.Stderr, "supervisors left running by the tests (killed): pids %v\n", leaked)
		code = 1
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// killLeaked kills every process running exe and returns their pids.
func killLeaked(exe string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if target, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe")); err == nil && strings.TrimSuffix(target, " (deleted)") == exe {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			pids = append(pids, pid)
		}
	}
	return pids
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// requireNamespaces skips (or fails under CI=true) when the host cannot
// create the sandbox namespaces.
func requireNamespaces(t testing.TB) {
	t.Helper()
	d, err := process.Open(map[string]any{"supervisor_path": fakeSupervisor}, compute.FactoryDeps{StateDir: t.TempDir(), GatewayEndpoint: "unix:///run/openshell/sandbox.sock"})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	err = d.ValidateCreate(context.Background(), compute.Sandbox{ID: "probe", Name: "probe"})
	if errdefs.Code(err) == codes.FailedPrecondition {
		citest.SkipOrFail(t, "namespaces unavailable: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// open returns a process driver on stateDir with the fake supervisor.
func open(t testing.TB, stateDir string, cfg map[string]any) *process.Driver {
	t.Helper()
	c := map[string]any{"supervisor_path": fakeSupervisor, "stop_grace_secs": 5}
	for k, v := range cfg {
		c[k] = v
	}
	d, err := process.Open(c, compute.FactoryDeps{
		Logger: testLogger(t), StateDir: stateDir, GatewayEndpoint: "unix:///run/openshell/sandbox.sock",
	})
	if err != nil {
		t.Fatalf("process.Open() error = %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// cleanupSandboxes deletes every sandbox of d at test end.
func cleanupSandboxes(t testing.TB, d compute.Driver) {
	t.Cleanup(func() {
		list, _ := d.List(context.Background())
		for _, sb := range list {
			_, _ = d.Delete(context.Background(), compute.Ref{ID: sb.ID})
		}
	})
}

func goodSandbox(id, name string) compute.Sandbox {
	return compute.Sandbox{ID: id, Name: name, Workspace: "default", Spec: compute.Spec{
		LogLevel:     "debug",
		SandboxToken: testToken,
		Command:      []string{"/bin/sh", "-c", "echo hi"},
		Environment:  map[string]string{"FOO": "spec"},
		Template:     compute.Template{Environment: map[string]string{"FOO": "template", "BAR": "template"}},
	}}
}

func TestConformance(t *testing.T) {
	requireNamespaces(t)
	cgroupRoot := fakeCgroupRoot(t, "cpu")
	computetest.Run(t, func(t *testing.T) compute.Driver {
		d := open(t, t.TempDir(), map[string]any{"cgroup_root": cgroupRoot})
		cleanupSandboxes(t, d)
		return d
	}, computetest.Options{
		Sandbox: goodSandbox,
		Invalid: map[string]func(id, name string) compute.Sandbox{
			"registry image": func(id, name string) compute.Sandbox {
				sb := goodSandbox(id, name)
				sb.Spec.Template.Image = "ghcr.io/example/agent:latest"
				return sb
			},
			"missing rootfs": func(id, name string) compute.Sandbox {
				sb := goodSandbox(id, name)
				sb.Spec.Template.Image = "dir:/nonexistent/rootfs"
				return sb
			},
			"memory limit without controller": func(id, name string) compute.Sandbox {
				sb := goodSandbox(id, name)
				sb.Spec.Template.Resources.MemoryLimit = "1Gi"
				return sb
			},
			"bad name": func(id, _ string) compute.Sandbox { return goodSandbox(id, "Not_A_Label") },
			"path id":  func(_, name string) compute.Sandbox { return goodSandbox("../escape", name) },
			"driver config": func(id, name string) compute.Sandbox {
				sb := goodSandbox(id, name)
				sb.Spec.Template.DriverConfig = map[string]any{"privileged": true}
				return sb
			},
		},
		Timeout: 20 * time.Second,
	})
}

// fakeCgroupRoot makes a directory that looks like a cgroup2 root offering
// only the given controllers.
func fakeCgroupRoot(t testing.TB, controllers ...string) string {
	t.Helper()
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "cgroup.controllers"), []byte(strings.Join(controllers, " ")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

func TestValidateCreateErrors(t *testing.T) {
	requireNamespaces(t)
	noMemory := fakeCgroupRoot(t, "cpu", "hugetlb")
	tests := []struct {
		name    string
		cfg     map[string]any
		mutate  func(*compute.Sandbox)
		code    codes.Code
		message string // substring
	}{
		{"registry image", nil, func(sb *compute.Sandbox) { sb.Spec.Template.Image = "ubuntu:24.04" },
			codes.InvalidArgument, "process driver cannot pull images; use a local rootfs directory or another driver"},
		{"relative dir image", nil, func(sb *compute.Sandbox) { sb.Spec.Template.Image = "dir:rootfs" },
			codes.InvalidArgument, "must be an absolute path"},
		{"memory controller missing", map[string]any{"cgroup_root": noMemory},
			func(sb *compute.Sandbox) { sb.Spec.Template.Resources.MemoryLimit = "512Mi" },
			codes.FailedPrecondition, `memory limit requested but cgroup v2 controller "memory" is not available`},
		{"memory request without controller", map[string]any{"cgroup_root": noMemory},
			func(sb *compute.Sandbox) { sb.Spec.Template.Resources.MemoryRequest = "512Mi" },
			codes.FailedPrecondition, `memory request requested but cgroup v2 controller "memory"`},
		{"not a cgroup root", map[string]any{"cgroup_root": t.TempDir()},
			func(sb *compute.Sandbox) { sb.Spec.Template.Resources.CPULimit = "500m" },
			codes.FailedPrecondition, "is not a cgroup v2 hierarchy"},
		{"bad cpu quantity", nil, func(sb *compute.Sandbox) { sb.Spec.Template.Resources.CPULimit = "lots" },
			codes.InvalidArgument, `cpu limit "lots" is not a valid cpu quantity`},
		{"request above limit", nil, func(sb *compute.Sandbox) {
			sb.Spec.Template.Resources.MemoryRequest, sb.Spec.Template.Resources.MemoryLimit = "2Gi", "1Gi"
		}, codes.InvalidArgument, "exceeds memory limit"},
		{"runtime class", nil, func(sb *compute.Sandbox) {
			sb.Spec.Template.RuntimeClassName = "kata"
		}, codes.InvalidArgument, `spec.template.runtime_class_name "kata" is not supported by the process driver`},
		{"annotations", nil, func(sb *compute.Sandbox) { sb.Spec.Template.Annotations = map[string]string{"a": "b"} },
			codes.InvalidArgument, "annotations are not supported by the process driver"},
		{"user namespaces off", nil, func(sb *compute.Sandbox) { off := false; sb.Spec.Template.UserNamespaces = &off },
			codes.InvalidArgument, "user_namespaces=false is not supported by the process driver"},
		{"gpu", nil, func(sb *compute.Sandbox) { sb.Spec.Template.Resources.GPUs = 1 },
			codes.FailedPrecondition, "does not support GPUs"},
		{"env key with =", nil, func(sb *compute.Sandbox) { sb.Spec.Environment = map[string]string{"A=B": "x"} },
			codes.InvalidArgument, "not a valid environment entry"},
		{"missing supervisor", map[string]any{"supervisor_path": "/nonexistent/openshell-sandbox"}, func(*compute.Sandbox) {},
			codes.FailedPrecondition, "supervisor binary /nonexistent/openshell-sandbox does not exist"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			state := t.TempDir()
			d := open(t, state, tt.cfg)
			sb := goodSandbox(computetest.NewID(), computetest.NewName())
			tt.mutate(&sb)
			for _, op := range []string{"ValidateCreate", "Create"} {
				var err error
				if op == "ValidateCreate" {
					err = d.ValidateCreate(t.Context(), sb)
				} else {
					err = d.Create(t.Context(), sb)
				}
				if errdefs.Code(err) != tt.code || !strings.Contains(err.Error(), tt.message) {
					t.Errorf("%s() error = %v (%v), want %v containing %q", op, err, errdefs.Code(err), tt.code, tt.message)
				}
			}
			assertNothingLeft(t, state, sb.ID)
		})
	}
}

// TestValidateCreateUserNamespacesOn: asking for what the driver does
// anyway (a mapped user namespace, as root without an image) is accepted.
func TestValidateCreateUserNamespacesOn(t *testing.T) {
	requireNamespaces(t)
	if os.Geteuid() != 0 {
		t.Skip("only a root gateway maps sandboxes to an unprivileged id range")
	}
	d := open(t, t.TempDir(), nil)
	sb := goodSandbox(computetest.NewID(), computetest.NewName())
	on := true
	sb.Spec.Template.UserNamespaces = &on
	if err := d.ValidateCreate(t.Context(), sb); err != nil {
		t.Errorf("ValidateCreate(user_namespaces=true) = %v, want nil", err)
	}
}

func assertNothingLeft(t *testing.T, stateDir, id string) {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(stateDir, "sandboxes"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("state left behind: %s", filepath.Join(stateDir, "sandboxes", e.Name()))
	}
	if pids := pidsWithEnv(t, "OPENSHELL_SANDBOX_ID="+id); len(pids) > 0 {
		t.Errorf("processes left behind for %s: %v", id, pids)
	}
}

// pidsWithEnv lists processes whose environment contains kv.
func pidsWithEnv(t testing.TB, kv string) []int {
	t.Helper()
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue
		}
		for _, v := range strings.Split(string(data), "\x00") {
			if v == kv {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

func TestFailedCreateLeavesNothing(t *testing.T) {
	requireNamespaces(t)
	notExec := filepath.Join(t.TempDir(), "openshell-sandbox")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	d := open(t, state, map[string]any{"supervisor_path": notExec})
	sb := goodSandbox(computetest.NewID(), computetest.NewName())
	err := d.Create(t.Context(), sb)
	if errdefs.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Create() with non-executable supervisor error = %v, want FailedPrecondition", err)
	}
	assertNothingLeft(t, state, sb.ID)
	if _, err := d.Get(t.Context(), compute.Ref{ID: sb.ID}); errdefs.Code(err) != codes.NotFound {
		t.Errorf("Get after failed Create error = %v, want NotFound", err)
	}
	// The name is free again.
	if list, _ := d.List(t.Context()); len(list) != 0 {
		t.Errorf("List() after failed Create = %d sandboxes, want 0", len(list))
	}
}

// readReport waits for the fake supervisor's report for instance.
func readReport(t testing.TB, d compute.Driver, sb compute.Sandbox, stateDir string) map[string]any {
	t.Helper()
	got, err := d.Get(context.Background(), compute.Ref{ID: sb.ID})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(stateDir, "sandboxes", sb.ID, "workspace", "report-"+got.Status.InstanceID+".json")
	deadline := time.Now().Add(10 * time.Second)
	for {
		data, err := os.ReadFile(path)
		if err == nil {
			var r map[string]any
			if err := json.Unmarshal(data, &r); err != nil {
				t.Fatal(err)
			}
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("no supervisor report at %s: %v", path, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestSupervisorContract(t *testing.T) {
	requireNamespaces(t)
	state := t.TempDir()
	d := open(t, state, nil)
	cleanupSandboxes(t, d)
	sb := goodSandbox(computetest.NewID(), "contract")
	if err := d.Create(t.Context(), sb); err != nil {
		t.Fatal(err)
	}
	r := readReport(t, d, sb, state)
	env := r["env"].(map[string]any)
	ws := filepath.Join(state, "sandboxes", sb.ID, "workspace")
	tokenFile, wsEnv, cwd := filepath.Join(state, "sandboxes", sb.ID, "token"), ws, ws
	endpoint := "unix:///run/openshell/sandbox.sock"
	if os.Geteuid() == 0 {
		endpoint = "unix:///proc/self/fd/7/gateway.sock" // its own socket, forwarded
		// A user namespace of its own: what the sandbox's host ids cannot
		// reach by path comes as inherited fds after the egress dialer
		// (binary 4, workspace 5, token 6, gateway socket directory 7),
		// and it starts in /.
		tokenFile, wsEnv, cwd = "/proc/self/fd/6", "/proc/self/fd/5", "/"
	}
	want := map[string]string{
		"OPENSHELL_SANDBOX_ID":         sb.ID,
		"OPENSHELL_SANDBOX_NAME":       "contract",
		"OPENSHELL_ENDPOINT":           endpoint,
		"OPENSHELL_PRIVATE_NETWORK":    "true",
		"OPENSHELL_SANDBOX_TOKEN_FILE": tokenFile,
		"OPENSHELL_SANDBOX_COMMAND":    `["/bin/sh","-c","echo hi"]`,
		"OPENSHELL_SANDBOX_TTY":        "false",
		"OPENSHELL_LOG_LEVEL":          "debug",
		"OPENSHELL_WORKSPACE_DIR":      wsEnv,
		"OPENSHELL_SANDBOX_HOSTNAME":   "contract",
		"OPENSHELL_PRIVATE_TMP":        "true",
		"HOME":                         "/sandbox",
		"FOO":                          "spec",
		"BAR":                          "template",
	}
	for k, v := range want {
		if env[k] != v {
			t.Errorf("supervisor env %s = %v, want %q", k, env[k], v)
		}
	}
	for k, v := range env {
		if strings.Contains(fmt.Sprint(v), testToken) {
			t.Errorf("token leaked into environment variable %s", k)
		}
	}
	for _, k := range []string{"OPENSHELL_ROOTFS", "OPENSHELL_ROOTFS_LAYER"} {
		if v, ok := env[k]; ok {
			t.Errorf("supervisor env %s = %v without an image, want unset", k, v)
		}
	}
	if r["pid"].(float64) != 1 {
		t.Errorf("supervisor pid in its namespace = %v, want 1 (new pid namespace)", r["pid"])
	}
	if r["hostname"] != "contract" {
		t.Errorf("supervisor hostname = %v (err %v), want contract", r["hostname"], r["hostname_err"])
	}
	if h, _ := os.Hostname(); h == "contract" {
		t.Errorf("host hostname changed to the sandbox name: uts namespace not private")
	}
	if host, _ := os.Readlink("/proc/self/ns/net"); r["net_ns"] == "" || r["net_ns"] == host {
		t.Errorf("supervisor network namespace = %v, host's %s: want one of its own", r["net_ns"], host)
	}
	if ifs := fmt.Sprint(r["interfaces"]); ifs != "[lo]" {
		t.Errorf("supervisor sees interfaces %s, want only [lo]", ifs)
	}
	if r["cwd"] != cwd {
		t.Errorf("supervisor cwd = %v, want %s", r["cwd"], cwd)
	}
	if r["token_mode"] != "-rw-------" || r["token_len"].(float64) != float64(len(testToken)) {
		t.Errorf("token file mode %v len %v, want -rw------- %d", r["token_mode"], r["token_len"], len(testToken))
	}
	got, _ := d.Get(t.Context(), compute.Ref{ID: sb.ID})
	pid := pidOf(t, got)
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if strings.Contains(string(cmdline), testToken) {
		t.Errorf("token on the supervisor command line")
	}
	if pgid, _ := syscall.Getpgid(pid); pgid != pid {
		t.Errorf("supervisor pgid = %d, want its own group %d", pgid, pid)
	}
	for _, ns := range []string{"pid", "mnt", "uts", "ipc"} {
		self, _ := os.Readlink("/proc/self/ns/" + ns)
		child, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pid, ns))
		if self == child {
			t.Errorf("supervisor shares the %s namespace with the gateway (%s)", ns, self)
		}
	}
	// Delete removes the directory with its token and workspace.
	if ok, err := d.Delete(t.Context(), compute.Ref{ID: sb.ID}); !ok || err != nil {
		t.Fatalf("Delete = %v, %v", ok, err)
	}
	if _, err := os.Stat(filepath.Join(state, "sandboxes", sb.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("sandbox directory after Delete: %v, want not exist", err)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("supervisor %d still exists after Delete (kill 0 = %v)", pid, err)
	}
}

// TestSupervisorContractImage: a dir: image names the sandbox's own
// writable layer next to its workspace; the spec cannot point it (or the
// image) elsewhere. Under a root gateway both are inherited fds (the
// supervisor's host ids cannot reach them by path; TestImageUserNamespace
// runs the real supervisor on them).
func TestSupervisorContractImage(t *testing.T) {
	requireNamespaces(t)
	state := t.TempDir()
	d := open(t, state, nil)
	cleanupSandboxes(t, d)
	img := t.TempDir()
	sb := goodSandbox(computetest.NewID(), "contract-image")
	sb.Spec.Template.Image = "dir:" + img
	sb.Spec.Environment["OPENSHELL_ROOTFS_LAYER"] = img
	sb.Spec.Template.Environment["OPENSHELL_ROOTFS"] = "/"
	if err := d.Create(t.Context(), sb); err != nil {
		t.Fatal(err)
	}
	env := readReport(t, d, sb, state)["env"].(map[string]any)
	want := map[string]string{
		"OPENSHELL_ROOTFS":       img,
		"OPENSHELL_ROOTFS_LAYER": filepath.Join(state, "sandboxes", sb.ID, "rootfs-layer"),
		"HOME":                   "/sandbox",
	}
	for k, v := range want {
		got, _ := env[k].(string)
		if os.Geteuid() == 0 && k != "HOME" {
			if !strings.HasPrefix(got, "/proc/self/fd/") {
				t.Errorf("supervisor env %s = %q, want an inherited fd /proc/self/fd/N", k, got)
			}
			continue
		}
		if got != v {
			t.Errorf("supervisor env %s = %q, want %q", k, got, v)
		}
	}
}

// pidOf extracts the pid from the Running condition message.
func pidOf(t testing.TB, sb compute.Sandbox) int {
	t.Helper()
	c, _ := computetest.Cond(sb, compute.ConditionReady)
	var pid int
	if _, err := fmt.Sscanf(c.Message, "supervisor process running (pid %d)", &pid); err != nil {
		t.Fatalf("ready condition %+v has no pid: %v", c, err)
	}
	return pid
}

// TestUserNamespaceRanges: with a root gateway every sandbox's root is
// its own unprivileged host id range, kept across stop, start and a
// driver restart, and its workspace belongs to that range (a workspace of
// the gateway's user, as left by earlier versions, is converted).
func TestUserNamespaceRanges(t *testing.T) {
	requireNamespaces(t)
	if os.Geteuid() != 0 {
		t.Skip("ranges need a root gateway")
	}
	state := t.TempDir()
	d := open(t, state, nil)
	cleanupSandboxes(t, d)
	base := func(sb compute.Sandbox) string {
		t.Helper()
		r := readReport(t, d, sb, state)
		f := strings.Fields(fmt.Sprint(r["uid_map"]))
		if len(f) != 3 || f[0] != "0" || f[2] != "65536" {
			t.Fatalf("supervisor uid_map = %q, want 0 <base> 65536", r["uid_map"])
		}
		if n, err := strconv.ParseUint(f[1], 10, 32); err != nil || n < 1<<30 {
			t.Errorf("sandbox root maps to host id %s, want a range from 2^30", f[1])
		}
		return f[1]
	}
	a, b := goodSandbox(computetest.NewID(), "range-a"), goodSandbox(computetest.NewID(), "range-b")
	for _, sb := range []compute.Sandbox{a, b} {
		if err := d.Create(t.Context(), sb); err != nil {
			t.Fatal(err)
		}
	}
	baseA, baseB := base(a), base(b)
	if baseA == baseB {
		t.Errorf("sandboxes share the host id range %s", baseA)
	}
	ws := filepath.Join(state, "sandboxes", a.ID, "workspace")
	if owner := ownerOf(t, ws); owner != baseA {
		t.Errorf("workspace owner = %s, want host id %s", owner, baseA)
	}
	if err := d.Stop(t.Context(), compute.Ref{ID: a.ID}); err != nil {
		t.Fatal(err)
	}
	// A file of the gateway's user, like a workspace from before ranges.
	if err := os.Chown(ws, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "old.txt"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	d.Close()
	d = open(t, state, nil)
	cleanupSandboxes(t, d) // what this driver starts outlives the first one's cleanup
	if err := d.Start(t.Context(), compute.Ref{ID: a.ID}); err != nil {
		t.Fatal(err)
	}
	if got := base(a); got != baseA {
		t.Errorf("range after stop, restart and start = %s, want %s", got, baseA)
	}
	if owner := ownerOf(t, filepath.Join(ws, "old.txt")); owner != baseA {
		t.Errorf("old workspace file owned by %s, want converted to the sandbox's range %s", owner, baseA)
	}
}

func ownerOf(t *testing.T, p string) string {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return strconv.FormatUint(uint64(fi.Sys().(*syscall.Stat_t).Uid), 10)
}

func TestStopStartKeepsWorkspace(t *testing.T) {
	requireNamespaces(t)
	state := t.TempDir()
	d := open(t, state, nil)
	cleanupSandboxes(t, d)
	sb := goodSandbox(computetest.NewID(), computetest.NewName())
	if err := d.Create(t.Context(), sb); err != nil {
		t.Fatal(err)
	}
	first, _ := d.Get(t.Context(), compute.Ref{ID: sb.ID})
	pid := pidOf(t, first)
	marker := filepath.Join(state, "sandboxes", sb.ID, "workspace", "keep.txt")
	if err := os.WriteFile(marker, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := d.Stop(t.Context(), compute.Ref{ID: sb.ID}); err != nil {
			t.Fatalf("Stop #%d error = %v", i+1, err)
		}
	}
	got, _ := d.Get(t.Context(), compute.Ref{ID: sb.ID})
	if c, _ := computetest.Cond(got, compute.ConditionSuspended); c.Status != "True" {
		t.Errorf("conditions after Stop = %+v, want Suspended=True", got.Status.Conditions)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("supervisor %d alive after Stop", pid)
	}
	// Stopped state is persisted: a new driver keeps it stopped.
	d.Close()
	d = open(t, state, nil)
	cleanupSandboxes(t, d)
	got, err := d.Get(t.Context(), compute.Ref{ID: sb.ID})
	if err != nil || !computetest.IsStopped(got) {
		t.Fatalf("Get after reopen = %+v, %v, want stopped", got.Status, err)
	}
	if err := d.Start(t.Context(), compute.Ref{ID: sb.ID}); err != nil {
		t.Fatal(err)
	}
	got, _ = d.Get(t.Context(), compute.Ref{ID: sb.ID})
	if !computetest.IsReady(got) || got.Status.InstanceID == first.Status.InstanceID {
		t.Errorf("after Start: %+v, want ready with a new instance id", got.Status)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Errorf("workspace file lost across stop/start: %v", err)
	}
	if _, err := d.Delete(t.Context(), compute.Ref{ID: sb.ID}); err != nil {
		t.Fatal(err)
	}
}

func TestStopEscalatesToSIGKILL(t *testing.T) {
	requireNamespaces(t)
	state := t.TempDir()
	d := open(t, state, map[string]any{"stop_grace_secs": 0.2})
	cleanupSandboxes(t, d)
	sb := goodSandbox(computetest.NewID(), computetest.NewName())
	sb.Spec.Environment["FAKE_SUPERVISOR_IGNORE_TERM"] = "1"
	if err := d.Create(t.Context(), sb); err != nil {
		t.Fatal(err)
	}
	readReport(t, d, sb, state) // SIGTERM is ignored from here on
	got, _ := d.Get(t.Context(), compute.Ref{ID: sb.ID})
	pid := pidOf(t, got)
	start := time.Now()
	if err := d.Stop(t.Context(), compute.Ref{ID: sb.ID}); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < 200*time.Millisecond {
		t.Errorf("Stop returned after %v, before the grace period", el)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("supervisor %d alive after Stop", pid)
	}
}

// TestDeleteTerminatesGracefully: Delete lets the supervisor exit on
// SIGTERM and escalates to SIGKILL only after the grace period.
func TestDeleteTerminatesGracefully(t *testing.T) {
	requireNamespaces(t)
	tests := []struct {
		name       string
		ignoreTerm bool
		wantMeta   map[string]string
	}{
		{"exits on SIGTERM", false, map[string]string{"exit_code": "0"}},
		{"ignores SIGTERM", true, map[string]string{"signal": "SIGKILL"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			state := t.TempDir()
			d := open(t, state, map[string]any{"stop_grace_secs": 0.3})
			ch := watch(t, d)
			sb := goodSandbox(computetest.NewID(), computetest.NewName())
			if tt.ignoreTerm {
				sb.Spec.Environment["FAKE_SUPERVISOR_IGNORE_TERM"] = "1"
			}
			if err := d.Create(t.Context(), sb); err != nil {
				t.Fatal(err)
			}
			readReport(t, d, sb, state) // signal handling is set up from here on
			start := time.Now()
			if ok, err := d.Delete(t.Context(), compute.Ref{ID: sb.ID}); !ok || err != nil {
				t.Fatalf("Delete() = %v, %v", ok, err)
			}
			el := time.Since(start)
			if tt.ignoreTerm && el < 300*time.Millisecond {
				t.Errorf("Delete returned after %v, before the grace period", el)
			}
			pe := waitFor(t, ch, "platform event", func(ev compute.Event) bool {
				return ev.Kind == compute.EventPlatform && ev.SandboxID == sb.ID
			})
			for k, v := range tt.wantMeta {
				if pe.Platform.Metadata[k] != v {
					t.Errorf("exit %s = %q, want %q (event %+v)", k, pe.Platform.Metadata[k], v, pe.Platform)
				}
			}
			assertNothingLeft(t, state, sb.ID)
		})
	}
}

func watch(t *testing.T, d compute.Driver) <-chan compute.Event {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	ch, errf, err := d.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		for range ch {
		}
		_ = errf()
	})
	return ch
}

func waitFor(t *testing.T, ch <-chan compute.Event, what string, pred func(compute.Event) bool) compute.Event {
	t.Helper()
	timer := time.NewTimer(20 * time.Second)
	defer timer.Stop()
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("watch closed waiting for %s", what)
			}
			if pred(ev) {
				return ev
			}
		case <-timer.C:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func TestProcessExitReported(t *testing.T) {
	requireNamespaces(t)
	tests := []struct {
		name     string
		env      string
		kill     bool
		wantMsg  string
		wantMeta map[string]string
	}{
		{"sigkill", "", true, "killed by signal 9 (SIGKILL)", map[string]string{"signal": "SIGKILL", "exit_code": "137"}},
		{"exit code", "3", false, "exited with code 3", map[string]string{"exit_code": "3"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := open(t, t.TempDir(), nil)
			cleanupSandboxes(t, d)
			ch := watch(t, d)
			sb := goodSandbox(computetest.NewID(), computetest.NewName())
			if tt.env != "" {
				sb.Spec.Environment["FAKE_SUPERVISOR_EXIT"] = tt.env
			}
			if err := d.Create(t.Context(), sb); err != nil {
				t.Fatal(err)
			}
			if tt.kill {
				got, _ := d.Get(t.Context(), compute.Ref{ID: sb.ID})
				if err := syscall.Kill(pidOf(t, got), syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
			}
			pe := waitFor(t, ch, "platform event", func(ev compute.Event) bool {
				return ev.Kind == compute.EventPlatform && ev.SandboxID == sb.ID
			})
			if pe.Platform.Reason != "ProcessExited" || !strings.Contains(pe.Platform.Message, tt.wantMsg) {
				t.Errorf("platform event = %+v, want ProcessExited %q", pe.Platform, tt.wantMsg)
			}
			for k, v := range tt.wantMeta {
				if pe.Platform.Metadata[k] != v {
					t.Errorf("platform metadata %s = %q, want %q", k, pe.Platform.Metadata[k], v)
				}
			}
			ev := waitFor(t, ch, "not-ready event", func(ev compute.Event) bool {
				return ev.Kind == compute.EventSandbox && ev.SandboxID == sb.ID && !computetest.IsReady(ev.Sandbox)
			})
			c, _ := computetest.Cond(ev.Sandbox, compute.ConditionReady)
			if c.Status != "False" || c.Reason != "ProcessExited" || !strings.Contains(c.Message, tt.wantMsg) {
				t.Errorf("ready condition = %+v, want False/ProcessExited %q", c, tt.wantMsg)
			}
			// Start brings it back with a new incarnation.
			if tt.kill {
				if err := d.Start(t.Context(), compute.Ref{ID: sb.ID}); err != nil {
					t.Fatal(err)
				}
				if got, _ := d.Get(t.Context(), compute.Ref{ID: sb.ID}); !computetest.IsReady(got) {
					t.Errorf("after Start: %+v, want ready", got.Status)
				}
			}
		})
	}
}

func TestRediscoverAfterRestart(t *testing.T) {
	requireNamespaces(t)
	state := t.TempDir()
	d1 := open(t, state, nil)
	alive := goodSandbox(computetest.NewID(), "alive")
	dead := goodSandbox(computetest.NewID(), "dead")
	for _, sb := range []compute.Sandbox{alive, dead} {
		if err := d1.Create(t.Context(), sb); err != nil {
			t.Fatal(err)
		}
	}
	a1, _ := d1.Get(t.Context(), compute.Ref{ID: alive.ID})
	x1, _ := d1.Get(t.Context(), compute.Ref{ID: dead.ID})
	if err := d1.Close(); err != nil {
		t.Fatal(err)
	}
	// The gateway is "down": one supervisor dies meanwhile.
	if err := syscall.Kill(pidOf(t, x1), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}

	d2 := open(t, state, nil)
	cleanupSandboxes(t, d2)
	a2, err := d2.Get(t.Context(), compute.Ref{ID: alive.ID})
	if err != nil || !computetest.IsReady(a2) {
		t.Fatalf("Get(alive) after restart = %+v, %v, want ready", a2.Status, err)
	}
	if pidOf(t, a2) != pidOf(t, a1) || a2.Status.InstanceID != a1.Status.InstanceID {
		t.Errorf("alive after restart: pid %d instance %s, want the original %d %s",
			pidOf(t, a2), a2.Status.InstanceID, pidOf(t, a1), a1.Status.InstanceID)
	}
	// Start on a live record does nothing: no second supervisor.
	if err := d2.Start(t.Context(), compute.Ref{ID: alive.ID}); err != nil {
		t.Fatal(err)
	}
	if pids := pidsWithEnv(t, "OPENSHELL_SANDBOX_ID="+alive.ID); len(pids) != 1 {
		t.Errorf("supervisors for %s after restart + Start = %v, want exactly one", alive.ID, pids)
	}
	// The dead one is reported as exited, eventually (its exit is reaped by
	// the new driver's monitor when it was our child, or found dead at open).
	deadline := time.Now().Add(10 * time.Second)
	for {
		x2, err := d2.Get(t.Context(), compute.Ref{ID: dead.ID})
		if err != nil {
			t.Fatal(err)
		}
		if c, _ := computetest.Cond(x2, compute.ConditionReady); c.Status == "False" && c.Reason == "ProcessExited" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dead sandbox after restart: %+v, want Ready=False/ProcessExited", x2.Status)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The re-attached process is still managed: Stop ends it.
	if err := d2.Stop(t.Context(), compute.Ref{ID: alive.ID}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pidOf(t, a1), 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("re-attached supervisor alive after Stop")
	}
}

func TestRealSupervisor(t *testing.T) {
	d, state := realDriver(t)
	ch := watch(t, d)
	sb := goodSandbox(computetest.NewID(), computetest.NewName())
	// No gateway listens here: the supervisor keeps retrying its first
	// config fetch for this long, which is what the test observes.
	sb.Spec.Environment["OPENSHELL_STARTUP_TIMEOUT"] = "2m"
	if err := d.Create(t.Context(), sb); err != nil {
		t.Fatal(err)
	}
	ev := waitFor(t, ch, "ready", func(ev compute.Event) bool {
		return ev.Kind == compute.EventSandbox && ev.SandboxID == sb.ID && computetest.IsReady(ev.Sandbox)
	})
	pid := pidOf(t, ev.Sandbox)

	// The supervisor applies the start contract: hostname and private /tmp.
	deadline := time.Now().Add(10 * time.Second)
	for {
		host, herr := exec.Command("nsenter", "-t", fmt.Sprint(pid), "-u", "hostname").Output()
		mounts, merr := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
		if herr == nil && merr == nil && strings.TrimSpace(string(host)) == sb.Name && strings.Contains(string(mounts), " /tmp ") {
			break
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(state, "sandboxes", sb.ID, "supervisor.log"))
			t.Fatalf("supervisor did not apply the contract: hostname %q (%v), /tmp mounted %v; log:\n%s",
				strings.TrimSpace(string(host)), herr, strings.Contains(string(mounts), " /tmp "), log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if h, _ := os.Hostname(); h == sb.Name {
		t.Error("the sandbox hostname leaked to the host")
	}
	start := time.Now()
	if err := d.Stop(t.Context(), compute.Ref{ID: sb.ID}); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Errorf("Stop took %v: the supervisor did not exit on SIGTERM", el)
	}
	if _, err := d.Delete(t.Context(), compute.Ref{ID: sb.ID}); err != nil {
		t.Fatal(err)
	}
}

func TestRecoverCrashDuringCreate(t *testing.T) {
	requireNamespaces(t)
	state := t.TempDir()
	d1 := open(t, state, nil)
	sb := goodSandbox(computetest.NewID(), computetest.NewName())
	if err := d1.Create(t.Context(), sb); err != nil {
		t.Fatal(err)
	}
	got, _ := d1.Get(t.Context(), compute.Ref{ID: sb.ID})
	pid := pidOf(t, got)
	d1.Close()

	// Rewind state.json to what a gateway killed between fork and the
	// pid record leaves: instance id known, pid not yet saved.
	statePath := filepath.Join(state, "sandboxes", sb.ID, "state.json")
	data, err := os.ReadFile(statePath)
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal(data, &rec); err != nil {
		t.Fatal(err)
	}
	delete(rec, "pid")
	delete(rec, "start_time")
	data, _ = json.Marshal(rec)
	if err := os.WriteFile(statePath, data, 0o600); err != nil {
		t.Fatal(err)
	}
	// And a directory from a create that never wrote its state.
	orphan := filepath.Join(state, "sandboxes", "orphan-id")
	if err := os.MkdirAll(filepath.Join(orphan, "workspace"), 0o700); err != nil {
		t.Fatal(err)
	}

	d2 := open(t, state, nil)
	cleanupSandboxes(t, d2)
	got, err = d2.Get(t.Context(), compute.Ref{ID: sb.ID})
	if err != nil || !computetest.IsReady(got) || pidOf(t, got) != pid {
		t.Fatalf("after restart: %+v, %v, want ready with the original pid %d", got.Status, err, pid)
	}
	if pids := pidsWithEnv(t, "OPENSHELL_SANDBOX_ID="+sb.ID); len(pids) != 1 {
		t.Errorf("supervisors for %s = %v, want exactly one", sb.ID, pids)
	}
	if _, err := os.Stat(orphan); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("incomplete sandbox directory kept: %v", err)
	}
}

func TestCgroupLimits(t *testing.T) {
	requireNamespaces(t)
	t.Run("host", func(t *testing.T) {
		// Whatever this host offers: either the limit is applied, or the
		// request is refused up front with the reason.
		state := t.TempDir()
		d := open(t, state, nil)
		cleanupSandboxes(t, d)
		sb := goodSandbox(computetest.NewID(), computetest.NewName())
		sb.Spec.Template.Resources = compute.Resources{CPULimit: "500m", MemoryLimit: "256Mi"}
		err := d.ValidateCreate(t.Context(), sb)
		if err != nil {
			if errdefs.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "requested but") {
				t.Fatalf("ValidateCreate(limits) error = %v, want nil or FailedPrecondition naming why", err)
			}
			t.Logf("host cannot enforce limits: %v", err)
			if cerr := d.Create(t.Context(), sb); errdefs.Code(cerr) != codes.FailedPrecondition {
				t.Errorf("Create(limits) error = %v, want FailedPrecondition", cerr)
			}
			assertNothingLeft(t, state, sb.ID)
			return
		}
		if err := d.Create(t.Context(), sb); err != nil {
			t.Fatalf("Create(limits) error = %v", err)
		}
		got, _ := d.Get(t.Context(), compute.Ref{ID: sb.ID})
		cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pidOf(t, got)))
		if err != nil || !strings.Contains(string(cg), "/openshell/"+sb.ID) {
			t.Errorf("supervisor cgroup = %q, %v, want openshell/%s", cg, err, sb.ID)
		}
	})
	t.Run("setup failure leaves nothing", func(t *testing.T) {
		// A directory that claims the controllers but is no cgroupfs:
		// validation passes, the clone into it fails.
		root := fakeCgroupRoot(t, "cpu", "memory")
		state := t.TempDir()
		d := open(t, state, map[string]any{"cgroup_root": root})
		sb := goodSandbox(computetest.NewID(), computetest.NewName())
		sb.Spec.Template.Resources = compute.Resources{MemoryLimit: "256Mi"}
		if err := d.ValidateCreate(t.Context(), sb); err != nil {
			t.Fatalf("ValidateCreate() error = %v", err)
		}
		err := d.Create(t.Context(), sb)
		if errdefs.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "cgroup") {
			t.Fatalf("Create() into a fake cgroup error = %v, want FailedPrecondition naming the cgroup", err)
		}
		assertNothingLeft(t, state, sb.ID)
		if _, err := os.Stat(filepath.Join(root, "openshell", sb.ID)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("sandbox cgroup directory left behind: %v", err)
		}
	})
}

func TestOpenConfigErrors(t *testing.T) {
	deps := compute.FactoryDeps{StateDir: t.TempDir(), GatewayEndpoint: "unix:///run/openshell/sandbox.sock"}
	tests := []struct {
		name string
		cfg  map[string]any
		deps compute.FactoryDeps
	}{
		{"unknown key", map[string]any{"privileged": true}, deps},
		{"grace not a number", map[string]any{"stop_grace_secs": "10"}, deps},
		{"grace negative", map[string]any{"stop_grace_secs": -1}, deps},
		{"relative cgroup root", map[string]any{"cgroup_root": "sys/fs/cgroup"}, deps},
		{"no state dir", nil, compute.FactoryDeps{GatewayEndpoint: "unix:///run/openshell/sandbox.sock"}},
		{"no endpoint", nil, compute.FactoryDeps{StateDir: t.TempDir()}},
		{"tcp endpoint (sandboxes have loopback only)", nil, compute.FactoryDeps{StateDir: t.TempDir(), GatewayEndpoint: "http://127.0.0.1:17670"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := process.New(tt.cfg, tt.deps); errdefs.Code(err) != codes.InvalidArgument {
				t.Errorf("New(%v) error = %v, want InvalidArgument", tt.cfg, err)
			}
		})
	}
	d, err := process.New(map[string]any{"stop_grace_secs": int64(3), "cgroup_root": "/sys/fs/cgroup"}, deps)
	if err != nil {
		t.Fatalf("New(valid) error = %v", err)
	}
	caps, _ := d.Capabilities(t.Context())
	if caps.DriverName != "process" || caps.DefaultImage != "" || !caps.GatewayManagesLifecycle {
		t.Errorf("Capabilities() = %+v, want process, no default image, gateway-managed lifecycle", caps)
	}
	d.(interface{ Close() error }).Close()
}

const envChildSupervisor = "OPENSHELL_PROCESS_TEST_CHILD_SUPERVISOR"

// TestUnprivileged runs the driver as an unprivileged user (uid 65534),
// which takes the user-namespace path, by re-executing this test binary.
func TestUnprivileged(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to switch to an unprivileged uid (when not root, every test here is unprivileged)")
	}
	requireNamespaces(t)
	dir, err := os.MkdirTemp("", "process-unpriv-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "process.test")
	sup := filepath.Join(dir, "openshell-sandbox")
	for src, dst := range map[string]string{self: bin, fakeSupervisor: sup} {
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), bin, "-test.run=^(TestUnprivilegedChild|TestRecoverKeepsUnloadableState)$", "-test.v", "-test.count=1")
	cmd.Dir = dir
	cmd.Env = []string{envChildSupervisor + "=" + sup, "PATH=/usr/bin:/bin", "HOME=/nonexistent", "TMPDIR=/tmp"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestUnprivilegedChild") ||
		!strings.Contains(string(out), "--- PASS: TestRecoverKeepsUnloadableState/state.json_unreadable_(EACCES)") {
		t.Fatalf("unprivileged run failed: %v\n%s", err, out)
	}
	t.Logf("unprivileged run:\n%s", out)
}

// TestUnprivilegedChild is TestUnprivileged's body, run as uid 65534.
func TestUnprivilegedChild(t *testing.T) {
	if os.Getenv(envChildSupervisor) == "" {
		t.Skip("run by TestUnprivileged")
	}
	if os.Getuid() == 0 {
		t.Fatal("child runs as root")
	}
	state := t.TempDir()
	d := open(t, state, nil)
	cleanupSandboxes(t, d)
	sb := goodSandbox(computetest.NewID(), "unpriv")
	if err := d.Create(t.Context(), sb); err != nil {
		t.Fatalf("Create() as uid %d error = %v", os.Getuid(), err)
	}
	r := readReport(t, d, sb, state)
	if r["pid"].(float64) != 1 || r["hostname"] != "unpriv" {
		t.Errorf("unprivileged supervisor: pid %v hostname %v (err %v), want 1 and unpriv", r["pid"], r["hostname"], r["hostname_err"])
	}
	got, _ := d.Get(t.Context(), compute.Ref{ID: sb.ID})
	pid := pidOf(t, got)
	self, _ := os.Readlink("/proc/self/ns/user")
	child, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/user", pid))
	if self == child {
		t.Errorf("unprivileged supervisor shares the user namespace (%s)", self)
	}
	if err := d.Stop(t.Context(), compute.Ref{ID: sb.ID}); err != nil {
		t.Fatal(err)
	}
	if err := d.Start(t.Context(), compute.Ref{ID: sb.ID}); err != nil {
		t.Fatal(err)
	}
	if ok, err := d.Delete(t.Context(), compute.Ref{ID: sb.ID}); !ok || err != nil {
		t.Fatalf("Delete() = %v, %v", ok, err)
	}
}
