package supervisor

import (
	"context"
	"log/slog"
	"time"

	"google.golang.org/grpc"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/supervisor/egress"
)

// Policy advisor submissions: how often the supervisor drains the egress
// proxy's denial aggregate by default (OpenShell's 10 s; Config.
// DenialFlushInterval), and its backoff after a failed submission.
const (
	defaultDenialFlushInterval = 10 * time.Second
	advisorBackoffMin          = time.Second
	advisorBackoffMax          = time.Minute
	// advisorBatch is the most summaries one call carries (the gateway
	// refuses more than 256).
	advisorBatch = 256
)

// analysisSubmitter is the one RPC the advisor loop calls.
type analysisSubmitter interface {
	SubmitPolicyAnalysis(ctx context.Context, in *openshellv1.SubmitPolicyAnalysisRequest, opts ...grpc.CallOption) (*openshellv1.SubmitPolicyAnalysisResponse, error)
}

// submitDenials drains the proxy's denial aggregate every interval and
// submits what it holds to the gateway's policy advisor
// (SubmitPolicyAnalysis, analysis_mode mechanistic): per (binary, host,
// port) the count, first and last time and sample reasons. Nothing is
// sent while nothing was denied. A failed submission puts its denials
// back into the aggregate (bounded as ever: what no longer fits is only
// counted) and the loop backs off up to advisorBackoffMax, resetting on
// success. The proxy only ever takes the aggregate's mutex for a map
// update, so a slow gateway never holds it up. It returns when ctx ends.
func submitDenials(ctx context.Context, log *slog.Logger, client analysisSubmitter, sandboxID, name string, d *egress.Denials, interval time.Duration) {
	bo := newBackoff(advisorBackoffMin, advisorBackoffMax)
	wait := interval
	for {
		if sleepCtx(ctx, wait) != nil {
			return
		}
		wait = interval
		groups, dropped := d.Drain()
		if dropped > 0 {
			log.Warn("denial aggregate was full; some denials are not reported to the policy advisor", "dropped", dropped)
		}
		for len(groups) > 0 {
			batch := groups[:min(len(groups), advisorBatch)]
			if err := submitBatch(ctx, log, client, sandboxID, name, batch); err != nil {
				d.Restore(groups) // this batch and the ones not sent yet
				wait = bo.next()
				log.Warn("cannot submit denials to the policy advisor; retrying", "groups", len(groups), "retry_in", wait, "err", err)
				break
			}
			bo.reset()
			groups = groups[len(batch):]
		}
	}
}

// submitBatch sends one SubmitPolicyAnalysis call for groups.
func submitBatch(ctx context.Context, log *slog.Logger, client analysisSubmitter, sandboxID, name string, groups []egress.DenialGroup) error {
	req := &openshellv1.SubmitPolicyAnalysisRequest{Name: name, AnalysisMode: "mechanistic"}
	for _, g := range groups {
		s := &openshellv1.DenialSummary{
			SandboxId: sandboxID, Host: g.Host, Port: g.Port, Binary: g.Binary,
			FirstSeenMs: g.First.UnixMilli(), LastSeenMs: g.Last.UnixMilli(),
			Count: uint32(min(g.Count, 1<<32-1)), TotalCount: uint32(min(g.Count, 1<<32-1)),
			DenialStage: "connect",
		}
		if len(g.Reasons) > 0 {
			s.DenyReason = g.Reasons[0]
		}
		req.Summaries = append(req.Summaries, s)
	}
	resp, err := client.SubmitPolicyAnalysis(ctx, req)
	if err != nil {
		return err
	}
	log.Debug("denials submitted to the policy advisor", "groups", len(groups), "accepted", resp.GetAcceptedChunks(), "rejected", resp.GetRejectedChunks())
	return nil
}
