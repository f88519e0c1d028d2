//go:build linux

package process_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
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

// BenchmarkCreate200Concurrent creates 200 sandboxes at once per iteration
// and reports the wall time until all are backend-ready, against 200
// concurrent bare fork/execs of the same binary, plus the test process RSS
// with 200 sandboxes being watched.
func BenchmarkCreate200Concurrent(b *testing.B) {
	requireNamespaces(b)
	const n = 200
	state, err := os.MkdirTemp("/var/tmp", "openshell-process-bench-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(state) })
	d := open(b, state, map[string]any{"stop_grace_secs": 1})
	cleanupSandboxes(b, d)
	var driverWall, forkWall time.Duration
	var rssKB float64
	for b.Loop() {
		t0 := time.Now()
		var wg sync.WaitGroup
		cmds := make([]*exec.Cmd, n)
		for i := range n {
			wg.Go(func() {
				cmd := exec.Command(fakeSupervisor)
				cmd.Env = []string{"OPENSHELL_WORKSPACE_DIR=" + state}
				if err := cmd.Start(); err == nil {
					cmds[i] = cmd
				}
			})
		}
		wg.Wait()
		forkWall += time.Since(t0)
		for _, c := range cmds {
			if c != nil {
				_ = c.Process.Kill()
				_ = c.Wait()
			}
		}

		ids := make([]string, n)
		errs := make(chan error, n)
		t0 = time.Now()
		for i := range n {
			wg.Go(func() {
				sb := goodSandbox(computetest.NewID(), computetest.NewName())
				ids[i] = sb.ID
				errs <- d.Create(context.Background(), sb)
			})
		}
		wg.Wait()
		driverWall += time.Since(t0)
		close(errs)
		for err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
		rssKB = max(rssKB, vmRSSKB())
		for _, id := range ids {
			wg.Go(func() { _, _ = d.Delete(context.Background(), compute.Ref{ID: id}) })
		}
		wg.Wait()
	}
	iters := float64(b.N)
	b.ReportMetric(driverWall.Seconds()*1000/iters, "create200-ms")
	b.ReportMetric(forkWall.Seconds()*1000/iters, "forkexec200-ms")
	b.ReportMetric(driverWall.Seconds()/max(forkWall.Seconds(), 1e-9), "ratio")
	b.ReportMetric(rssKB/1024, "rss-MiB")
}

func vmRSSKB() float64 {
	data, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			return f
		}
	}
	return 0
}
