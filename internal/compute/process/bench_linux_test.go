//go:build linux

package process_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/compute/computetest"
)

// BenchmarkCreateReady measures Create → backend Ready (the Ready=True
// event) on the process driver against a bare fork/exec of the same
// supervisor binary (cmd.Start) in the same run, and reports p50/p95 of
// both and their ratio. Run with -benchtime=50x for 50 sandboxes. It uses
// the real supervisor from OPENSHELL_TEST_BIN_DIR when built, else the
// fake one (the real one exits without a gateway, which does not change
// the time to backend-ready).
func BenchmarkCreateReady(b *testing.B) {
	requireNamespaces(b)
	bin := fakeSupervisor
	if dir := os.Getenv("OPENSHELL_TEST_BIN_DIR"); dir != "" {
		if _, err := os.Stat(filepath.Join(dir, "openshell-sandbox")); err == nil {
			bin = filepath.Join(dir, "openshell-sandbox")
		}
	}
	// Not under /tmp: the real supervisor's private /tmp would hide it.
	state, err := os.MkdirTemp("/var/tmp", "openshell-process-bench-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(state) })
	d := open(b, state, map[string]any{"supervisor_path": bin, "stop_grace_secs": 1})
	cleanupSandboxes(b, d)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events, _, err := d.Watch(ctx)
	if err != nil {
		b.Fatal(err)
	}
	var driverLat, forkLat []time.Duration
	for b.Loop() {
		// Baseline: bare fork/exec of the same binary.
		cmd := exec.Command(bin)
		cmd.Env = []string{"OPENSHELL_WORKSPACE_DIR=" + state}
		t0 := time.Now()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		forkLat = append(forkLat, time.Since(t0))
		_ = cmd.Process.Kill()
		_ = cmd.Wait()

		sb := goodSandbox(computetest.NewID(), computetest.NewName())
		t0 = time.Now()
		if err := d.Create(ctx, sb); err != nil {
			b.Fatal(err)
		}
		for ev := range events {
			if ev.Kind == compute.EventSandbox && ev.SandboxID == sb.ID && computetest.IsReady(ev.Sandbox) {
				break
			}
		}
		driverLat = append(driverLat, time.Since(t0))
		if _, err := d.Delete(ctx, compute.Ref{ID: sb.ID}); err != nil {
			b.Fatal(err)
		}
	}
	p := func(lat []time.Duration, q float64) float64 {
		s := slices.Clone(lat)
		slices.Sort(s)
		return float64(s[min(len(s)-1, int(q*float64(len(s))))].Microseconds())
	}
	b.ReportMetric(p(driverLat, 0.50), "create-p50-µs")
	b.ReportMetric(p(driverLat, 0.95), "create-p95-µs")
	b.ReportMetric(p(forkLat, 0.50), "forkexec-p50-µs")
	b.ReportMetric(p(forkLat, 0.95), "forkexec-p95-µs")
	b.ReportMetric(p(driverLat, 0.50)/max(1, p(forkLat, 0.50)), "p50-ratio")
	b.ReportMetric(p(driverLat, 0.95)/max(1, p(forkLat, 0.95)), "p95-ratio")
}
