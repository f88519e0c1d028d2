// Package sandboxlog keeps recent sandbox log lines in memory: a bounded
// ring per sandbox, fed by supervisors (PushSandboxLogs) and by the gateway
// itself, read by GetSandboxLogs and followed by WatchSandbox. Logs are not
// persisted, as in OpenShell. Safe for concurrent use.
package sandboxlog

import (
	"strings"
	"sync"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// DefaultCapacity is the number of lines kept per sandbox.
const DefaultCapacity = 2000

// Sources of log lines.
const (
	SourceGateway = "gateway"
	SourceSandbox = "sandbox"
)

var levelRank = map[string]int{"trace": 0, "debug": 1, "info": 2, "warn": 3, "warning": 3, "error": 4}

func rank(level string) int {
	if r, ok := levelRank[strings.ToLower(level)]; ok {
		return r
	}
	return levelRank["info"]
}

// Filter selects lines.
type Filter struct {
	// Tail keeps the last N matching lines (0 = all kept).
	Tail    int
	SinceMs int64
	Sources []string
	// MinLevel drops lines below it ("" = everything).
	MinLevel string
}

// Match reports whether l passes f (Tail aside).
func (f Filter) Match(l *openshellv1.SandboxLogLine) bool {
	if f.SinceMs > 0 && l.GetTimestampMs() < f.SinceMs {
		return false
	}
	if len(f.Sources) > 0 {
		ok := false
		for _, s := range f.Sources {
			if s == l.GetSource() {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return f.MinLevel == "" || rank(l.GetLevel()) >= rank(f.MinLevel)
}

type ring struct {
	lines []*openshellv1.SandboxLogLine
	next  int
	full  bool
	total uint32
	subs  map[chan *openshellv1.SandboxLogLine]struct{}
}

// Buffer holds the rings of all sandboxes.
type Buffer struct {
	capacity int
	mu       sync.Mutex
	rings    map[string]*ring
}

// New returns a buffer keeping capacity lines per sandbox.
func New(capacity int) *Buffer {
	if capacity <= 0 {
		capacity = DefaultCapacity
	}
	return &Buffer{capacity: capacity, rings: map[string]*ring{}}
}

func (b *Buffer) ringFor(id string) *ring {
	r := b.rings[id]
	if r == nil {
		r = &ring{lines: make([]*openshellv1.SandboxLogLine, b.capacity), subs: map[chan *openshellv1.SandboxLogLine]struct{}{}}
		b.rings[id] = r
	}
	return r
}

// Append adds a line, overwriting the oldest when full, and hands it to
// followers (a follower that cannot keep up misses lines rather than
// slowing the writer).
func (b *Buffer) Append(l *openshellv1.SandboxLogLine) {
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.ringFor(l.GetSandboxId())
	r.lines[r.next] = l
	r.next = (r.next + 1) % len(r.lines)
	if r.next == 0 {
		r.full = true
	}
	r.total++
	for ch := range r.subs {
		select {
		case ch <- l:
		default:
		}
	}
}

// Read returns matching lines, oldest first, and how many lines the
// sandbox's buffer has received in total.
func (b *Buffer) Read(id string, f Filter) ([]*openshellv1.SandboxLogLine, uint32) {
	b.mu.Lock()
	defer b.mu.Unlock()
	r := b.rings[id]
	if r == nil {
		return nil, 0
	}
	var all []*openshellv1.SandboxLogLine
	if r.full {
		all = append(all, r.lines[r.next:]...)
	}
	all = append(all, r.lines[:r.next]...)
	out := all[:0:0]
	for _, l := range all {
		if f.Match(l) {
			out = append(out, l)
		}
	}
	if f.Tail > 0 && len(out) > f.Tail {
		out = out[len(out)-f.Tail:]
	}
	return out, r.total
}

// Follow returns new lines of one sandbox until cancel is called.
func (b *Buffer) Follow(id string) (<-chan *openshellv1.SandboxLogLine, func()) {
	ch := make(chan *openshellv1.SandboxLogLine, 256)
	b.mu.Lock()
	b.ringFor(id).subs[ch] = struct{}{}
	b.mu.Unlock()
	return ch, func() {
		b.mu.Lock()
		if r := b.rings[id]; r != nil {
			delete(r.subs, ch)
		}
		b.mu.Unlock()
	}
}

// Drop forgets a sandbox's lines (after delete).
func (b *Buffer) Drop(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if r := b.rings[id]; r != nil && len(r.subs) == 0 {
		delete(b.rings, id)
	}
}
