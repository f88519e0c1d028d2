package egress

import (
	"cmp"
	"slices"
	"sync"
	"time"
)

// DenialKey identifies a group of denials.
type DenialKey struct {
	Binary string
	Host   string
	Port   uint32
}

// DenialCount is one group and how often it was denied.
type DenialCount struct {
	DenialKey
	Count uint64
}

// DenialGroup is one group as Drain returns it: how often it was denied,
// when first and last, and up to maxReasons distinct reasons.
type DenialGroup struct {
	DenialCount
	First, Last time.Time
	Reasons     []string
}

// maxReasons bounds the sample reasons kept per group.
const maxReasons = 3

// Denials is a bounded aggregate of denied connections by (binary, host,
// port), kept for the policy advisor. Once it holds max groups, denials of
// new groups are only counted in Dropped. Every method takes one mutex
// for a constant time (Drain swaps the map), so counting never holds up
// the proxy.
type Denials struct {
	mu      sync.Mutex
	max     int
	groups  map[DenialKey]*DenialGroup
	dropped uint64
	now     func() time.Time
}

// NewDenials returns an aggregate of at most maxGroups groups.
func NewDenials(maxGroups int) *Denials {
	return &Denials{max: maxGroups, groups: map[DenialKey]*DenialGroup{}, now: time.Now}
}

// Add counts one denial.
func (d *Denials) Add(binary, host string, port uint32) { d.AddReason(binary, host, port, "") }

// AddReason counts one denial for reason.
func (d *Denials) AddReason(binary, host string, port uint32, reason string) {
	k := DenialKey{Binary: binary, Host: host, Port: port}
	now := d.now()
	d.mu.Lock()
	defer d.mu.Unlock()
	g, ok := d.groups[k]
	if !ok {
		if len(d.groups) >= d.max {
			d.dropped++
			return
		}
		g = &DenialGroup{DenialCount: DenialCount{DenialKey: k}, First: now}
		d.groups[k] = g
	}
	g.Count++
	g.Last = now
	if reason != "" && len(g.Reasons) < maxReasons && !slices.Contains(g.Reasons, reason) {
		g.Reasons = append(g.Reasons, reason)
	}
}

// Snapshot returns the groups, most denied first, and the number of
// denials that found the aggregate full.
func (d *Denials) Snapshot() ([]DenialCount, uint64) {
	d.mu.Lock()
	groups, dropped := make([]DenialCount, 0, len(d.groups)), d.dropped
	for _, g := range d.groups {
		groups = append(groups, g.DenialCount)
	}
	d.mu.Unlock()
	sortCounts(groups)
	return groups, dropped
}

// Drain returns the groups (most denied first) with their times and
// reasons and the number of denials that found the aggregate full, and
// empties the aggregate.
func (d *Denials) Drain() ([]DenialGroup, uint64) {
	d.mu.Lock()
	old, dropped := d.groups, d.dropped
	d.groups, d.dropped = make(map[DenialKey]*DenialGroup, len(old)), 0
	d.mu.Unlock()
	out := make([]DenialGroup, 0, len(old))
	for _, g := range old {
		out = append(out, *g)
	}
	slices.SortFunc(out, func(a, b DenialGroup) int { return compareCounts(a.DenialCount, b.DenialCount) })
	return out, dropped
}

// Restore puts drained groups back (a submission that failed), merged
// with what was counted since; groups that no longer fit are counted in
// Dropped.
func (d *Denials) Restore(groups []DenialGroup) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, r := range groups {
		g, ok := d.groups[r.DenialKey]
		if !ok {
			if len(d.groups) >= d.max {
				d.dropped += r.Count
				continue
			}
			c := r
			c.Reasons = slices.Clone(r.Reasons)
			d.groups[r.DenialKey] = &c
			continue
		}
		g.Count += r.Count
		if r.First.Before(g.First) {
			g.First = r.First
		}
		for _, reason := range r.Reasons {
			if len(g.Reasons) < maxReasons && !slices.Contains(g.Reasons, reason) {
				g.Reasons = append(g.Reasons, reason)
			}
		}
	}
}

func sortCounts(out []DenialCount) { slices.SortFunc(out, compareCounts) }

// compareCounts orders groups most denied first, then by key.
func compareCounts(a, b DenialCount) int {
	if c := cmp.Compare(b.Count, a.Count); c != 0 {
		return c
	}
	return cmp.Or(cmp.Compare(a.Binary, b.Binary), cmp.Compare(a.Host, b.Host), cmp.Compare(a.Port, b.Port))
}
