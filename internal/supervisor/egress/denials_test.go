package egress

import (
	"testing"
	"time"
)

// TestDenialsDrain: Drain hands over the groups with their times and at
// most maxReasons distinct reasons, and empties the aggregate; Restore
// merges a failed batch back within the bound.
func TestDenialsDrain(t *testing.T) {
	d := NewDenials(2)
	clock := time.Unix(1000, 0)
	d.now = func() time.Time { clock = clock.Add(time.Second); return clock }
	for _, r := range []string{"no rule", "no rule", "ssrf", "binary", "fourth"} {
		d.AddReason("/usr/bin/curl", "a.test", 443, r)
	}
	d.Add("/usr/bin/wget", "b.test", 80)
	d.Add("/usr/bin/nc", "c.test", 22) // full

	groups, dropped := d.Drain()
	if dropped != 1 || len(groups) != 2 {
		t.Fatalf("Drain() = %v, %d; want 2 groups, 1 dropped", groups, dropped)
	}
	g := groups[0]
	if g.Binary != "/usr/bin/curl" || g.Count != 5 || !g.First.Equal(time.Unix(1001, 0)) || !g.Last.Equal(time.Unix(1005, 0)) ||
		len(g.Reasons) != 3 || g.Reasons[0] != "no rule" || g.Reasons[2] != "binary" {
		t.Fatalf("first group = %+v; want curl, 5 denials from 1001 to 1005, reasons [no rule ssrf binary]", g)
	}
	if again, dropped := d.Drain(); len(again) != 0 || dropped != 0 {
		t.Fatalf("second Drain() = %v, %d; want empty", again, dropped)
	}

	d.Add("/usr/bin/curl", "a.test", 443)
	d.Add("/usr/bin/git", "d.test", 443)
	d.Restore(groups) // curl merges, wget no longer fits
	snap, dropped := d.Snapshot()
	if len(snap) != 2 || snap[0].Binary != "/usr/bin/curl" || snap[0].Count != 6 || dropped != 1 {
		t.Fatalf("after Restore: Snapshot() = %v, %d; want curl 6 and git 1, wget's 1 dropped", snap, dropped)
	}
}
