package isolation_test

import (
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"
)

// BenchmarkConfinedSpawn measures starting and reaping `true` through the
// trampoline (re-exec, Landlock ruleset, privilege drop, seccomp) against
// a raw fork/exec of the same `true` in the same loop, and reports the
// ratio and the added cost per spawn.
func BenchmarkConfinedSpawn(b *testing.B) {
	if os.Geteuid() != 0 {
		skipOrFail(b, "needs root: the confinement drops privileges for real")
	}
	c, err := isolationConfinement()
	if err != nil {
		b.Fatal(err)
	}
	var confined, raw []time.Duration
	for b.Loop() {
		start := time.Now()
		cmd, l, err := c.Command([]string{"/bin/true"}, []string{"PATH=/usr/bin:/bin"}, "/")
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Started(l.Start(cmd)); err != nil {
			b.Fatal(err)
		}
		if err := cmd.Wait(); err != nil {
			b.Fatal(err)
		}
		confined = append(confined, time.Since(start))

		start = time.Now()
		if err := exec.Command("/bin/true").Run(); err != nil {
			b.Fatal(err)
		}
		raw = append(raw, time.Since(start))
	}
	pct := func(d []time.Duration, p float64) time.Duration {
		s := slices.Clone(d)
		slices.Sort(s)
		return s[int(float64(len(s)-1)*p)]
	}
	p50 := func(d []time.Duration) time.Duration { return pct(d, 0.5) }
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(p50(confined)), "confined-p50-ms")
	b.ReportMetric(ms(pct(confined, 0.95)), "confined-p95-ms")
	b.ReportMetric(ms(p50(raw)), "forkexec-p50-ms")
	b.ReportMetric(ms(p50(confined)-p50(raw)), "setup-ms")
	b.ReportMetric(float64(p50(confined))/float64(p50(raw)), "x-forkexec")
}
