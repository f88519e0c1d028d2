package isolation_test

import (
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/openshell-go/openshell/internal/citest"
	"github.com/openshell-go/openshell/internal/supervisor/isolation"
)

// BenchmarkConfinedSpawn measures starting and reaping `true` confined
// (forked from the domain thread, switched to the agent's ids), and the
// first spawn of a fresh Confinement (which confines its domain thread),
// against a raw fork/exec of the same `true` in the same loop, and reports
// the ratio and the added cost per spawn.
func BenchmarkConfinedSpawn(b *testing.B) {
	if os.Geteuid() != 0 {
		citest.SkipOrFail(b, "needs root: the confinement drops privileges for real")
	}
	spawn := func(c *isolation.Confinement) time.Duration {
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
		return time.Since(start)
	}
	// The first spawn of a sandbox also confines its domain thread
	// (Landlock ruleset, capability sets, seccomp filter).
	var first []time.Duration
	for range 5 {
		c, err := isolationConfinement()
		if err != nil {
			b.Fatal(err)
		}
		first = append(first, spawn(c))
	}
	c, err := isolationConfinement()
	if err != nil {
		b.Fatal(err)
	}
	var confined, raw []time.Duration
	for b.Loop() {
		confined = append(confined, spawn(c))

		start := time.Now()
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
	b.ReportMetric(ms(p50(first)), "first-spawn-p50-ms")
	b.ReportMetric(ms(p50(confined)), "confined-p50-ms")
	b.ReportMetric(ms(pct(confined, 0.95)), "confined-p95-ms")
	b.ReportMetric(ms(p50(raw)), "forkexec-p50-ms")
	b.ReportMetric(ms(p50(confined)-p50(raw)), "setup-ms")
	b.ReportMetric(float64(p50(confined))/float64(p50(raw)), "x-forkexec")
}
