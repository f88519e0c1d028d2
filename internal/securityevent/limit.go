package securityevent

import (
	"strconv"
	"sync"
	"time"
)

// Defaults of the per-sandbox limit on the events a sandbox's supervisor
// reports (see Options.SandboxRate).
const (
	// DefaultSandboxRate is the sustained rate, events per second.
	DefaultSandboxRate = 50
	// DefaultSandboxBurst is the bucket size: events a sandbox may report
	// at once after a quiet period.
	DefaultSandboxBurst = 500
	// DefaultSummaryInterval is how long the suppressed events of a
	// sandbox are counted before one summary event reports them.
	DefaultSummaryInterval = 10 * time.Second
)

// FindingEventsSuppressed is the finding_info.uid of the summary event
// that counts a sandbox's suppressed events.
const FindingEventsSuppressed = "security_events_suppressed"

// Drop reasons (label reason of openshell_security_events_dropped_total).
const (
	DropSinkError   = "sink_error"
	DropRateLimited = "rate_limited"
)

// sandboxLimiter is a token bucket per sandbox for the events its
// supervisor reports. Suppressed events are counted; the first one of a
// quiet period arms a timer that, one interval later, emits a single
// summary with the count of that interval.
type sandboxLimiter struct {
	rate     float64
	burst    float64
	interval time.Duration
	now      func() time.Time
	summary  func(sandboxID string, n int)

	mu      sync.Mutex
	buckets map[string]*bucket
}

type bucket struct {
	tokens     float64
	last       time.Time
	suppressed int
	armed      bool
}

// maxIdleBuckets is the size above which full buckets (sandboxes quiet
// for a whole refill) are forgotten.
const maxIdleBuckets = 1024

func (s *sandboxLimiter) allow(sandboxID string) bool {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.buckets[sandboxID]
	if b == nil {
		if len(s.buckets) >= maxIdleBuckets {
			s.sweep(now)
		}
		b = &bucket{tokens: s.burst, last: now}
		s.buckets[sandboxID] = b
	}
	if d := now.Sub(b.last); d > 0 {
		b.tokens = min(s.burst, b.tokens+d.Seconds()*s.rate)
		b.last = now
	}
	if b.tokens >= 1 {
		b.tokens--
		return true
	}
	b.suppressed++
	if !b.armed {
		b.armed = true
		time.AfterFunc(s.interval, func() { s.report(sandboxID) })
	}
	return false
}

// report emits the summary of a sandbox's suppressed events.
func (s *sandboxLimiter) report(sandboxID string) {
	s.mu.Lock()
	b := s.buckets[sandboxID]
	n := 0
	if b != nil {
		n, b.suppressed, b.armed = b.suppressed, 0, false
	}
	s.mu.Unlock()
	if n > 0 {
		s.summary(sandboxID, n)
	}
}

// sweep forgets the buckets that are full again and have no pending
// summary. Called with mu held.
func (s *sandboxLimiter) sweep(now time.Time) {
	for id, b := range s.buckets {
		if !b.armed && b.tokens+now.Sub(b.last).Seconds()*s.rate >= s.burst {
			delete(s.buckets, id)
		}
	}
}

// summaryEvent is the event that reports n suppressed events of a sandbox.
func summaryEvent(sandboxID string, n int, rate float64, burst int, interval time.Duration) Event {
	return Event{
		Class: DetectionFinding, Activity: ActivityCreate, Outcome: Failure,
		SandboxID: sandboxID,
		Message:   "suppressed " + strconv.Itoa(n) + " security events of the sandbox: over its rate limit",
		Finding: &FindingInfo{
			UID: FindingEventsSuppressed, Title: "Security Events Suppressed",
			Desc: "more than " + strconv.FormatFloat(rate, 'f', -1, 64) + " events per second (burst " + strconv.Itoa(burst) + ") within " + interval.String(),
		},
		Fields: map[string]string{"suppressed": strconv.Itoa(n)},
	}
}
