package securityevent

import (
	"bytes"
	"context"
	"encoding/json"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// lockedBuffer is a sink safe for the summary's timer goroutine.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *lockedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *lockedBuffer) records(t *testing.T) []Record {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []Record
	for _, line := range bytes.Split(bytes.TrimSpace(w.b.Bytes()), []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var r Record
		if err := json.Unmarshal(line, &r); err != nil {
			t.Fatalf("sink line %q: %v", line, err)
		}
		out = append(out, r)
	}
	return out
}

func sandboxDecision(sandboxID string) Event {
	return Event{
		Class: NetworkActivity, Activity: ActivityOpen, Outcome: Denied,
		Product: SandboxProduct, SandboxID: sandboxID, Message: "CONNECT deny flood.test:443",
	}
}

// count returns the sandbox decisions of sandboxID and its summaries in recs.
func count(recs []Record, sandboxID string) (decisions int, summaries []Record) {
	for _, r := range recs {
		if r.Unmapped["sandbox_id"] != sandboxID {
			continue
		}
		switch {
		case r.Metadata.Product.Name == SandboxProduct:
			decisions++
		case r.FindingInfo != nil && r.FindingInfo.UID == FindingEventsSuppressed:
			summaries = append(summaries, r)
		}
	}
	return decisions, summaries
}

// TestSandboxRateLimit: a sandbox reporting far more than its bucket at
// once gets the bucket's worth of events written, the rest counted as
// rate_limited and reported by one summary with the exact number an
// interval later; another sandbox and the gateway's own events are not
// limited; after the bucket refills, events flow again.
func TestSandboxRateLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const (
			rate     = 50
			burst    = 500
			flood    = 2000
			interval = 10 * time.Second
		)
		sink := &lockedBuffer{}
		reg := prometheus.NewRegistry()
		l, err := New(Options{Sink: sink, Registerer: reg, SandboxRate: rate, SandboxBurst: burst, SummaryInterval: interval})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		for range flood {
			l.Emit(ctx, sandboxDecision("sb-flood"))
		}
		l.Emit(ctx, sandboxDecision("sb-quiet"))
		for range 10 { // gateway events about the flooding sandbox: never limited
			l.Emit(ctx, Event{Class: HTTPActivity, Activity: ActivityPost, Outcome: Denied, SandboxID: "sb-flood", Message: "authorization denied for GetSandbox"})
		}
		dropped := l.dropped.WithLabelValues(DropRateLimited)
		if got := testutil.ToFloat64(dropped); got != flood-burst {
			t.Errorf("rate_limited drops = %v, want %d", got, flood-burst)
		}
		recs := sink.records(t)
		if n, s := count(recs, "sb-flood"); n != burst || len(s) != 0 {
			t.Errorf("during the flood: %d decisions and %d summaries written, want %d and none yet", n, len(s), burst)
		}
		if n, _ := count(recs, "sb-quiet"); n != 1 {
			t.Errorf("the other sandbox's decision written %d times, want 1", n)
		}
		gw := 0
		for _, r := range recs {
			if r.Metadata.Product.Name == "openshell-gateway" && r.ClassUID == int(HTTPActivity) {
				gw++
			}
		}
		if gw != 10 {
			t.Errorf("gateway events written = %d, want all 10", gw)
		}

		time.Sleep(interval)
		synctest.Wait()
		_, sums := count(sink.records(t), "sb-flood")
		if len(sums) != 1 {
			t.Fatalf("summaries after one interval = %d, want 1", len(sums))
		}
		s := sums[0]
		if s.Unmapped["suppressed"] != "1500" || s.ClassUID != int(DetectionFinding) || s.Metadata.Product.Name != "openshell-gateway" {
			t.Errorf("summary = %+v, want a gateway Detection Finding with suppressed=1500", s)
		}

		// After 10 s the bucket holds all 500 tokens again.
		for range burst + 5 {
			l.Emit(ctx, sandboxDecision("sb-flood"))
		}
		if n, _ := count(sink.records(t), "sb-flood"); n != 2*burst {
			t.Errorf("after the refill %d decisions written in all, want %d", n, 2*burst)
		}
		if got := testutil.ToFloat64(dropped); got != flood-burst+5 {
			t.Errorf("rate_limited drops = %v, want %d", got, flood-burst+5)
		}
		// Sustained rate: one second brings 50 tokens.
		time.Sleep(time.Second)
		for range rate + 1 {
			l.Emit(ctx, sandboxDecision("sb-flood"))
		}
		time.Sleep(interval)
		synctest.Wait()
		n, sums := count(sink.records(t), "sb-flood")
		if n != 2*burst+rate {
			t.Errorf("after one more second %d decisions written in all, want %d", n, 2*burst+rate)
		}
		if len(sums) != 2 || sums[1].Unmapped["suppressed"] != "6" {
			t.Errorf("summaries = %+v, want a second one with suppressed=6", sums)
		}
		if got := testutil.ToFloat64(l.dropped.WithLabelValues(DropSinkError)); got != 0 {
			t.Errorf("sink_error drops = %v, want 0", got)
		}
	})
}

// TestSandboxRateLimitOff: a negative rate writes every event.
func TestSandboxRateLimitOff(t *testing.T) {
	sink := &lockedBuffer{}
	l, err := New(Options{Sink: sink, SandboxRate: -1})
	if err != nil {
		t.Fatal(err)
	}
	for range DefaultSandboxBurst + 100 {
		l.Emit(context.Background(), sandboxDecision("sb"))
	}
	if n, _ := count(sink.records(t), "sb"); n != DefaultSandboxBurst+100 {
		t.Errorf("%d events written, want all %d", n, DefaultSandboxBurst+100)
	}
}
