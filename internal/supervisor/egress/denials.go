package egress

import (
	"cmp"
	"slices"
	"sync"
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

// Denials is a bounded aggregate of denied connections by (binary, host,
// port), kept for the policy advisor. Once it holds max groups, denials of
// new groups are only counted in Dropped.
type Denials struct {
	mu      sync.Mutex
	max     int
	counts  map[DenialKey]uint64
	dropped uint64
}

// NewDenials returns an aggregate of at most maxGroups groups.
func NewDenials(maxGroups int) *Denials {
	return &Denials{max: maxGroups, counts: map[DenialKey]uint64{}}
}

// Add counts one denial.
func (d *Denials) Add(binary, host string, port uint32) {
	k := DenialKey{Binary: binary, Host: host, Port: port}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.counts[k]; !ok && len(d.counts) >= d.max {
		d.dropped++
		return
	}
	d.counts[k]++
}

// Snapshot returns the groups, most denied first, and the number of
// denials that found the aggregate full.
func (d *Denials) Snapshot() ([]DenialCount, uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]DenialCount, 0, len(d.counts))
	for k, n := range d.counts {
		out = append(out, DenialCount{DenialKey: k, Count: n})
	}
	slices.SortFunc(out, func(a, b DenialCount) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return cmp.Or(cmp.Compare(a.Binary, b.Binary), cmp.Compare(a.Host, b.Host), cmp.Compare(a.Port, b.Port))
	})
	return out, d.dropped
}
