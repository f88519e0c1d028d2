package supervisor

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/supervisor/egress"
)

type fakeSubmitter struct {
	mu    sync.Mutex
	fail  int // calls to fail before succeeding
	calls []time.Time
	got   []*openshellv1.SubmitPolicyAnalysisRequest
}

func (f *fakeSubmitter) SubmitPolicyAnalysis(_ context.Context, in *openshellv1.SubmitPolicyAnalysisRequest, _ ...grpc.CallOption) (*openshellv1.SubmitPolicyAnalysisResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, time.Now())
	if f.fail > 0 {
		f.fail--
		return nil, errors.New("gateway unavailable")
	}
	f.got = append(f.got, in)
	return &openshellv1.SubmitPolicyAnalysisResponse{}, nil
}

// TestSubmitDenials: nothing is sent while nothing is denied; denials are
// submitted as summaries of the sandbox by name; a failed submission keeps
// them (merged with later ones) and backs off.
func TestSubmitDenials(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		d := egress.NewDenials(8)
		f := &fakeSubmitter{fail: 2}
		done := make(chan struct{})
		go func() {
			defer close(done)
			submitDenials(ctx, slog.New(slog.DiscardHandler), f, "sb-id", "sb", d, time.Second)
		}()
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if len(f.calls) != 0 {
			t.Fatalf("%d submissions without denials, want none", len(f.calls))
		}
		d.AddReason("/usr/bin/curl", "a.test", 443, "no matching network policy")
		time.Sleep(1500 * time.Millisecond) // the first attempt fails; retry after 1s
		synctest.Wait()
		d.AddReason("/usr/bin/curl", "a.test", 443, "no matching network policy")
		time.Sleep(5 * time.Second) // second failure, retry after 2s: success
		synctest.Wait()
		if len(f.calls) != 3 || len(f.got) != 1 {
			t.Fatalf("calls = %d, successful = %d; want 2 failures then 1 success", len(f.calls), len(f.got))
		}
		if gap := f.calls[2].Sub(f.calls[1]); gap != 2*time.Second {
			t.Errorf("second retry after %v, want 2s (backoff)", gap)
		}
		req := f.got[0]
		if req.GetName() != "sb" || req.GetAnalysisMode() != "mechanistic" || len(req.GetSummaries()) != 1 {
			t.Fatalf("request = %v", req)
		}
		s := req.GetSummaries()[0]
		if s.GetBinary() != "/usr/bin/curl" || s.GetHost() != "a.test" || s.GetPort() != 443 || s.GetCount() != 2 ||
			s.GetDenyReason() != "no matching network policy" || s.GetSandboxId() != "sb-id" {
			t.Errorf("summary = %v, want curl a.test:443 twice with the reason", s)
		}
		cancel()
		<-done
	})
}

// TestSubmitDenialsBatches: more groups than one call may carry go in
// several calls.
func TestSubmitDenialsBatches(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		d := egress.NewDenials(300)
		for i := range 300 {
			d.Add("/usr/bin/curl", "a.test", uint32(1000+i))
		}
		f := &fakeSubmitter{}
		done := make(chan struct{})
		go func() {
			defer close(done)
			submitDenials(ctx, slog.New(slog.DiscardHandler), f, "sb-id", "sb", d, time.Second)
		}()
		time.Sleep(1500 * time.Millisecond)
		synctest.Wait()
		cancel()
		<-done
		if len(f.got) != 2 || len(f.got[0].GetSummaries()) != advisorBatch || len(f.got[1].GetSummaries()) != 300-advisorBatch {
			t.Fatalf("%d calls, want 2 of %d and %d summaries", len(f.got), advisorBatch, 300-advisorBatch)
		}
	})
}
