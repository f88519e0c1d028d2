package gatewaytest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[int(float64(len(s)-1)*p)]
}

// rssKiB reads VmRSS of a process.
func rssKiB(pid int) int {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			n, _ := strconv.Atoi(f[1])
			return n
		}
	}
	return 0
}

// BenchmarkCreateToReady measures CreateSandbox → READY (backend ready and
// supervisor session connected, seen on a WatchSandbox stream) through the
// whole gateway on the process driver, against a bare fork/exec of the
// same supervisor binary (to its exit on a missing gateway) in the same
// run.
func BenchmarkCreateToReady(b *testing.B) {
	g := Start(b, Options{})
	c := g.Client()
	ctx := b.Context()
	sup := filepath.Join(g.BinDir, "openshell-sandbox")
	var lat, base []time.Duration
	i := 0
	for b.Loop() {
		name := fmt.Sprintf("bench-%d", i)
		i++
		start := time.Now()
		resp, err := c.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: name, Spec: &openshellv1.SandboxSpec{Command: []string{"sleep", "infinity"}}})
		if err != nil {
			b.Fatal(err)
		}
		waitReadyWatch(ctx, b, c, resp.GetSandbox().GetMetadata().GetId())
		lat = append(lat, time.Since(start))

		start = time.Now()
		cmd := exec.Command(sup, "--version")
		if err := cmd.Run(); err != nil {
			b.Fatal(err)
		}
		base = append(base, time.Since(start))
		if _, err := c.DeleteSandbox(ctx, &openshellv1.DeleteSandboxRequest{Name: name}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(percentile(lat, 0.5).Microseconds()), "p50-us")
	b.ReportMetric(float64(percentile(lat, 0.95).Microseconds()), "p95-us")
	b.ReportMetric(float64(percentile(base, 0.5).Microseconds()), "forkexec-p50-us")
	b.ReportMetric(float64(percentile(lat, 0.5))/float64(percentile(base, 0.5)), "ratio-p50")
}

// waitReadyWatch follows the status of sandbox id on a WatchSandbox
// stream until it is READY: the same READY as waitReadyFast, without a
// poll loading the gateway or rounding the time up to its period.
func waitReadyWatch(ctx context.Context, tb testing.TB, c openshellv1.OpenShellClient, id string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	stream, err := c.WatchSandbox(ctx, &openshellv1.WatchSandboxRequest{Id: id, FollowStatus: true})
	if err != nil {
		tb.Fatal(err)
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			tb.Fatalf("%s not ready: %v", id, err)
		}
		if ev.GetSandbox().GetStatus().GetPhase() == openshellv1.SandboxPhase_SANDBOX_PHASE_READY {
			return
		}
	}
}

// BenchmarkCreateToReadyPaired compares two builds under the same load:
// a gateway from this tree and one from OPENSHELL_BENCH_BASELINE_BIN_DIR
// (make build of the baseline, same binaries) run side by side, and each
// iteration creates one sandbox on each, in alternating order, to READY
// (WatchSandbox). It reports both p50s and the p50 of the per-pair
// differences (this tree minus the baseline).
func BenchmarkCreateToReadyPaired(b *testing.B) {
	baseDir := os.Getenv("OPENSHELL_BENCH_BASELINE_BIN_DIR")
	if baseDir == "" {
		b.Skip("OPENSHELL_BENCH_BASELINE_BIN_DIR is not set")
	}
	gws := [2]*Gateway{Start(b, Options{}), Start(b, Options{BinDir: baseDir})}
	ctx := b.Context()
	var lat [2][]time.Duration
	var diff []time.Duration
	i := 0
	for b.Loop() {
		var took [2]time.Duration
		for k := range 2 {
			j := (i + k) % 2
			c := gws[j].Client()
			name := fmt.Sprintf("pair-%d", i)
			start := time.Now()
			resp, err := c.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: name, Spec: &openshellv1.SandboxSpec{Command: []string{"sleep", "infinity"}}})
			if err != nil {
				b.Fatal(err)
			}
			waitReadyWatch(ctx, b, c, resp.GetSandbox().GetMetadata().GetId())
			took[j] = time.Since(start)
			if _, err := c.DeleteSandbox(ctx, &openshellv1.DeleteSandboxRequest{Name: name}); err != nil {
				b.Fatal(err)
			}
		}
		i++
		lat[0], lat[1] = append(lat[0], took[0]), append(lat[1], took[1])
		diff = append(diff, took[0]-took[1])
	}
	b.ReportMetric(float64(percentile(lat[0], 0.5).Microseconds()), "p50-us")
	b.ReportMetric(float64(percentile(lat[1], 0.5).Microseconds()), "baseline-p50-us")
	b.ReportMetric(float64(percentile(diff, 0.5).Microseconds()), "diff-p50-us")
}

// BenchmarkCreateToReadySteps is BenchmarkCreateToReady with the
// supervisor at log level debug: besides the p50 to READY it reports the
// p50 of each step of the supervisor's "supervisor startup" line (see
// docs/supervisor.md), read back with GetSandboxLogs, in µs.
func BenchmarkCreateToReadySteps(b *testing.B) {
	g := Start(b, Options{})
	c := g.Client()
	ctx := b.Context()
	steps := map[string][]time.Duration{}
	var lat []time.Duration
	i := 0
	for b.Loop() {
		name := fmt.Sprintf("steps-%d", i)
		i++
		start := time.Now()
		resp, err := c.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: name, Spec: &openshellv1.SandboxSpec{LogLevel: "debug", Command: []string{"sleep", "infinity"}}})
		if err != nil {
			b.Fatal(err)
		}
		id := resp.GetSandbox().GetMetadata().GetId()
		waitReadyWatch(ctx, b, c, id)
		lat = append(lat, time.Since(start))
		b.StopTimer()
		fields := startupLine(ctx, b, c, id)
		for k, v := range fields {
			if d, err := time.ParseDuration(v); err == nil {
				steps[k] = append(steps[k], d)
			}
		}
		if _, err := c.DeleteSandbox(ctx, &openshellv1.DeleteSandboxRequest{Name: name}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(percentile(lat, 0.5).Microseconds()), "p50-us")
	for k, d := range steps {
		b.ReportMetric(float64(percentile(d, 0.5).Microseconds()), k+"-p50-us")
	}
}

// startupLine returns the fields of sandbox id's "supervisor startup"
// log line once the gateway has it.
func startupLine(ctx context.Context, tb testing.TB, c openshellv1.OpenShellClient, id string) map[string]string {
	tb.Helper()
	return logFields(ctx, tb, c, id, "supervisor startup")
}

func waitReadyFast(ctx context.Context, tb testing.TB, c openshellv1.OpenShellClient, name string) {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := c.GetSandbox(ctx, &openshellv1.GetSandboxRequest{Name: name})
		if err == nil && resp.GetSandbox().GetStatus().GetPhase() == openshellv1.SandboxPhase_SANDBOX_PHASE_READY {
			return
		}
		time.Sleep(time.Millisecond)
	}
	tb.Fatalf("%s not ready", name)
}

// BenchmarkExecTrue measures an ExecSandbox of `true` round trip (relay +
// SSH session) against a Health call on the same connection.
func BenchmarkExecTrue(b *testing.B) {
	g := Start(b, Options{})
	c := g.Client()
	ctx := b.Context()
	sb := readySandboxTB(ctx, b, c, "exec-bench")
	var lat, base []time.Duration
	for b.Loop() {
		start := time.Now()
		_, _, code, err := Exec(ctx, b, c, &openshellv1.ExecSandboxRequest{SandboxId: sb.GetMetadata().GetId(), Command: []string{"true"}})
		if err != nil || code != 0 {
			b.Fatal(code, err)
		}
		lat = append(lat, time.Since(start))
		start = time.Now()
		if _, err := c.Health(ctx, &openshellv1.HealthRequest{}); err != nil {
			b.Fatal(err)
		}
		base = append(base, time.Since(start))
	}
	b.ReportMetric(float64(percentile(lat, 0.5).Microseconds()), "p50-us")
	b.ReportMetric(float64(percentile(lat, 0.95).Microseconds()), "p95-us")
	b.ReportMetric(float64(percentile(base, 0.5).Microseconds()), "health-p50-us")
}

func readySandboxTB(ctx context.Context, tb testing.TB, c openshellv1.OpenShellClient, name string) *openshellv1.Sandbox {
	tb.Helper()
	resp, err := c.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: name, Spec: &openshellv1.SandboxSpec{Command: []string{"sleep", "infinity"}}})
	if err != nil {
		tb.Fatal(err)
	}
	waitReadyFast(ctx, tb, c, name)
	return resp.GetSandbox()
}

// BenchmarkConcurrentSandboxes creates N sandboxes at once (N from
// OPENSHELL_BENCH_SANDBOXES, default 200), waits for all to be READY with
// live supervisor sessions, and reports wall time, the gateway's RSS, and
// the gateway's CPU use while they sit idle (heartbeats only) for 10 s.
func BenchmarkConcurrentSandboxes(b *testing.B) {
	n := 200
	if v, err := strconv.Atoi(os.Getenv("OPENSHELL_BENCH_SANDBOXES")); err == nil && v > 0 {
		n = v
	}
	for b.Loop() {
		g := Start(b, Options{})
		c := g.Client()
		ctx := b.Context()
		rss0 := rssKiB(g.cmd.Process.Pid)
		start := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := range n {
			wg.Go(func() {
				name := fmt.Sprintf("c-%d", i)
				if _, err := c.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: name, Spec: &openshellv1.SandboxSpec{Command: []string{"sleep", "infinity"}}}); err != nil {
					errs <- err
					return
				}
				waitReadyFast(ctx, b, c, name)
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
		wall := time.Since(start)
		pid := g.cmd.Process.Pid
		cpu0 := procCPU(pid)
		time.Sleep(10 * time.Second)
		cpu1 := procCPU(pid)
		b.ReportMetric(wall.Seconds(), "wall-s")
		b.ReportMetric(float64(rssKiB(pid))/1024, "gateway-rss-MiB")
		b.ReportMetric(float64(rss0)/1024, "gateway-rss-idle0-MiB")
		b.ReportMetric(float64(cpu1-cpu0)/100/10*100, "idle-cpu-%")
		b.ReportMetric(float64(n), "sandboxes")
		g.Stop()
	}
}

// procCPU returns utime+stime in clock ticks.
func procCPU(pid int) int {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	u, _ := strconv.Atoi(f[11])
	st, _ := strconv.Atoi(f[12])
	return u + st
}
