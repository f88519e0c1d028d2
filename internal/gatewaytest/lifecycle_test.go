package gatewaytest

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// supervisorPID reads the pid the process driver recorded for a sandbox.
func supervisorPID(t *testing.T, g *Gateway, id string) int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(g.StateDir, "sandboxes", id, "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		PID int `json:"pid"`
	}
	if err := json.Unmarshal(data, &rec); err != nil {
		t.Fatal(err)
	}
	if rec.PID == 0 {
		t.Fatalf("no pid recorded for %s", id)
	}
	return rec.PID
}

// alive reports whether pid runs. A zombie is dead: a supervisor whose
// gateway was killed is reparented and reaped by whoever inherits it.
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	s := string(data)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(fields) > 0 && fields[0] != "Z"
}

// sandboxDirs lists the process driver's per-sandbox directories.
func sandboxDirs(t *testing.T, g *Gateway) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(g.StateDir, "sandboxes"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

func TestStopStartKeepsWorkspace(t *testing.T) {
	g := Start(t, Options{})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	sb := readySandbox(ctx, t, c, "keeper")
	id := sb.GetMetadata().GetId()
	if _, _, code, err := Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: []string{"sh", "-c", "echo kept > state.txt"}}); err != nil || code != 0 {
		t.Fatalf("write file: %d %v", code, err)
	}
	oldPID := supervisorPID(t, g, id)
	for range 2 {
		resp, err := c.StopSandbox(ctx, &openshellv1.StopSandboxRequest{Name: "keeper"})
		if err != nil {
			t.Fatalf("StopSandbox: %v", err)
		}
		if p := resp.GetSandbox().GetStatus().GetPhase(); p != openshellv1.SandboxPhase_SANDBOX_PHASE_STOPPED && p != openshellv1.SandboxPhase_SANDBOX_PHASE_STOPPING {
			t.Fatalf("after stop: %v", p)
		}
	}
	WaitPhase(ctx, t, c, "keeper", openshellv1.SandboxPhase_SANDBOX_PHASE_STOPPED, 30*time.Second)
	if alive(oldPID) {
		t.Fatalf("supervisor %d still alive after stop", oldPID)
	}
	if _, err := c.StartSandbox(ctx, &openshellv1.StartSandboxRequest{Name: "keeper"}); err != nil {
		t.Fatalf("StartSandbox: %v", err)
	}
	WaitPhase(ctx, t, c, "keeper", openshellv1.SandboxPhase_SANDBOX_PHASE_READY, 30*time.Second)
	out, _, code, err := Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: []string{"cat", "state.txt"}})
	if err != nil || code != 0 || out != "kept\n" {
		t.Fatalf("after restart: %q %d %v, want workspace kept", out, code, err)
	}
	if _, err := c.DeleteSandbox(ctx, &openshellv1.DeleteSandboxRequest{Name: "keeper"}); err != nil {
		t.Fatal(err)
	}
	if dirs := sandboxDirs(t, g); len(dirs) != 0 {
		t.Fatalf("sandbox state left after delete: %v", dirs)
	}
}

func TestCreateBadInputLeavesNothing(t *testing.T) {
	g := Start(t, Options{})
	c := g.Client()
	ctx := t.Context()
	if _, err := c.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: "taken", Spec: &openshellv1.SandboxSpec{Command: []string{"sleep", "infinity"}}}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		req  *openshellv1.CreateSandboxRequest
		code codes.Code
		msg  string
	}{
		{"too long", &openshellv1.CreateSandboxRequest{Name: "a-name-of-twenty-chr"}, codes.InvalidArgument, "name exceeds maximum length (20 > 19)"},
		{"uppercase", &openshellv1.CreateSandboxRequest{Name: "Upper"}, codes.InvalidArgument, "lowercase"},
		{"duplicate", &openshellv1.CreateSandboxRequest{Name: "taken"}, codes.AlreadyExists, `sandbox "taken" already exists`},
		{"label value", &openshellv1.CreateSandboxRequest{Name: "lbl", Labels: map[string]string{"team": "bad value"}}, codes.InvalidArgument, `label "team" value`},
		{"label key", &openshellv1.CreateSandboxRequest{Name: "lbl", Labels: map[string]string{"-k": "v"}}, codes.InvalidArgument, "label key"},
		{"unknown provider", &openshellv1.CreateSandboxRequest{Name: "prov", Spec: &openshellv1.SandboxSpec{Providers: []string{"github"}}}, codes.FailedPrecondition, "provider 'github' not found"},
		{"registry image", &openshellv1.CreateSandboxRequest{Name: "img", Spec: &openshellv1.SandboxSpec{Template: &openshellv1.SandboxTemplate{Image: "ghcr.io/nvidia/base:latest"}}}, codes.InvalidArgument, "process driver cannot pull images; use a local rootfs directory or another driver"},
		{"service account", &openshellv1.CreateSandboxRequest{Name: "sa", Spec: &openshellv1.SandboxSpec{Template: &openshellv1.SandboxTemplate{ServiceAccountName: "sa"}}}, codes.InvalidArgument, "template.service_account_name is not supported by the process compute driver"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := c.CreateSandbox(ctx, tt.req)
			if status.Code(err) != tt.code || !strings.Contains(status.Convert(err).Message(), tt.msg) {
				t.Fatalf("CreateSandbox = %v, want %v containing %q", err, tt.code, tt.msg)
			}
		})
	}
	list, err := c.ListSandboxes(ctx, &openshellv1.ListSandboxesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.GetSandboxes()) != 1 || len(sandboxDirs(t, g)) != 1 {
		t.Fatalf("rejected creates left rows %d, dirs %v; want only \"taken\"", len(list.GetSandboxes()), sandboxDirs(t, g))
	}
}

func TestSupervisorKilledMovesToError(t *testing.T) {
	g := Start(t, Options{})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	sb := readySandbox(ctx, t, c, "victim")
	pid := supervisorPID(t, g, sb.GetMetadata().GetId())
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	got := WaitPhase(ctx, t, c, "victim", openshellv1.SandboxPhase_SANDBOX_PHASE_ERROR, 30*time.Second)
	cond := got.GetStatus().GetConditions()[0]
	if !strings.Contains(cond.GetMessage(), "signal 9") {
		t.Fatalf("error condition = %v, want the exit status", cond)
	}
}

func TestMainProcessExitMovesToError(t *testing.T) {
	g := Start(t, Options{})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if _, err := c.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: "short", Spec: &openshellv1.SandboxSpec{Command: []string{"sh", "-c", "sleep 1; exit 7"}}}); err != nil {
		t.Fatal(err)
	}
	got := WaitPhase(ctx, t, c, "short", openshellv1.SandboxPhase_SANDBOX_PHASE_ERROR, 30*time.Second)
	if got.GetStatus().ExitCode == nil || got.GetStatus().GetExitCode() != 7 {
		t.Fatalf("exit code = %v, want 7", got.GetStatus().ExitCode)
	}
}

func TestGatewayKilledSupervisorsReconnect(t *testing.T) {
	g := Start(t, Options{})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	sb := readySandbox(ctx, t, c, "survivor")
	id := sb.GetMetadata().GetId()
	pid := supervisorPID(t, g, id)

	g.Kill()
	g2 := Start(t, Options{StateDir: g.StateDir, TLSDir: g.TLSDir, Port: g.Port})
	c2 := g2.Client()
	WaitPhase(ctx, t, c2, "survivor", openshellv1.SandboxPhase_SANDBOX_PHASE_READY, time.Minute)
	if got := supervisorPID(t, g2, id); got != pid || !alive(pid) {
		t.Fatalf("supervisor pid %d (alive %v), want the original %d: no duplicate, no orphan", got, alive(pid), pid)
	}
	out, _, code, err := Exec(ctx, t, c2, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: []string{"echo", "back"}})
	if err != nil || code != 0 || out != "back\n" {
		t.Fatalf("exec after restart = %q %d %v", out, code, err)
	}
}

func TestGracefulRestartRestartsManagedSandboxes(t *testing.T) {
	g := Start(t, Options{})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	sb := readySandbox(ctx, t, c, "managed")
	readySandbox(ctx, t, c, "parked")
	if _, err := c.StopSandbox(ctx, &openshellv1.StopSandboxRequest{Name: "parked"}); err != nil {
		t.Fatal(err)
	}
	WaitPhase(ctx, t, c, "parked", openshellv1.SandboxPhase_SANDBOX_PHASE_STOPPED, 30*time.Second)
	pid := supervisorPID(t, g, sb.GetMetadata().GetId())

	g.Stop() // graceful: the gateway stops the sandboxes it manages
	if alive(pid) {
		t.Fatalf("supervisor %d survived a graceful gateway stop", pid)
	}
	g2 := Start(t, Options{StateDir: g.StateDir, TLSDir: g.TLSDir, Port: g.Port})
	c2 := g2.Client()
	WaitPhase(ctx, t, c2, "managed", openshellv1.SandboxPhase_SANDBOX_PHASE_READY, time.Minute)
	got := WaitPhase(ctx, t, c2, "parked", openshellv1.SandboxPhase_SANDBOX_PHASE_STOPPED, 5*time.Second)
	if got.GetStatus().GetPhase() != openshellv1.SandboxPhase_SANDBOX_PHASE_STOPPED {
		t.Fatalf("explicitly stopped sandbox restarted")
	}
}

// TestGatewayKilledDuringCreate kills the gateway while creates are in
// flight; after a restart every row has a workload and every workload a
// row.
func TestGatewayKilledDuringCreate(t *testing.T) {
	g := Start(t, Options{})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() {
			_, _ = c.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{
				Name: "race-" + string(rune('a'+i)), Spec: &openshellv1.SandboxSpec{Command: []string{"sleep", "infinity"}},
			})
		})
	}
	time.Sleep(15 * time.Millisecond) // let some creates reach the driver, not all
	g.Kill()
	wg.Wait()

	g2 := Start(t, Options{StateDir: g.StateDir, TLSDir: g.TLSDir, Port: g.Port})
	c2 := g2.Client()
	list, err := c2.ListSandboxes(ctx, &openshellv1.ListSandboxesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]bool{}
	for _, sb := range list.GetSandboxes() {
		rows[sb.GetMetadata().GetId()] = true
		WaitPhase(ctx, t, c2, sb.GetMetadata().GetName(), openshellv1.SandboxPhase_SANDBOX_PHASE_READY, time.Minute)
	}
	dirs := sandboxDirs(t, g2)
	for _, d := range dirs {
		if !rows[d] {
			t.Errorf("workload %s has no row (orphan)", d)
		}
	}
	if len(dirs) != len(rows) {
		t.Errorf("%d rows, %d workloads", len(rows), len(dirs))
	}
	t.Logf("after kill -9 during create: %d of 6 sandboxes survived consistently", len(rows))
}
