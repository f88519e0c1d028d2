package gatewaytest

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openshell-go/openshell/internal/securityevent"
)

// TestSandboxEventFlood: an agent in a real sandbox makes 1500 denied
// requests in one curl run (URL globbing), far more than the gateway's
// per-sandbox limit on reported events (burst 500, 50/s). The gateway's
// sink gets at least the burst and fewer than all of them, and then one
// summary Detection Finding of the sandbox whose suppressed count makes
// up the difference exactly; the gateway's own events about the sandbox
// (its exec calls) are all there.
func TestSandboxEventFlood(t *testing.T) {
	const flood = 1500
	ctx, s := startEventSandbox(t, "event-flood", []string{"denied.flood.test"}, nil)
	script := fmt.Sprintf("%s -s -o /dev/null -w '%%{http_code}\\n' 'http://denied.flood.test:%s/[1-%d]' | sort | uniq -c", s.curl, s.port, flood)
	out := s.sh(ctx, t, script)
	if got := strings.Fields(out); len(got) != 2 || got[0] != strconv.Itoa(flood) || got[1] != "403" {
		t.Fatalf("curl answers = %q, want %d times 403", out, flood)
	}

	var written, suppressed, summaries, execs int
	for deadline := time.Now().Add(45 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		_, recs := readSink(t, s.events)
		written, suppressed, summaries, execs = 0, 0, 0, 0
		for _, r := range recs {
			if r.Unmapped["sandbox_id"] != s.id {
				continue
			}
			switch {
			case r.Metadata.Product.Name == securityevent.SandboxProduct && r.DstEndpoint != nil && r.DstEndpoint.Hostname == "denied.flood.test":
				written++
			case r.FindingInfo != nil && r.FindingInfo.UID == securityevent.FindingEventsSuppressed:
				summaries++
				n, err := strconv.Atoi(r.Unmapped["suppressed"])
				if err != nil || r.Metadata.Product.Name != "openshell-gateway" || r.ClassUID != int(securityevent.DetectionFinding) {
					t.Fatalf("summary event %+v: want a gateway Detection Finding with a count", r)
				}
				suppressed += n
			case r.ClassUID == int(securityevent.ProcessActivity) && r.Unmapped["process_name"] == "sh":
				execs++
			}
		}
		if written+suppressed == flood || time.Now().After(deadline) {
			break
		}
	}
	if written+suppressed != flood || written < securityevent.DefaultSandboxBurst || suppressed == 0 || summaries == 0 {
		t.Errorf("%d decision events written and %d suppressed in %d summaries; want at least %d written, some suppressed, %d in all",
			written, suppressed, summaries, securityevent.DefaultSandboxBurst, flood)
	}
	if execs != 1 {
		t.Errorf("exec events of the sandbox = %d, want 1 (the gateway's own events are not limited)", execs)
	}
}
