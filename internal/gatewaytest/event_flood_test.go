package gatewaytest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
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
	curl, port, portN := egressUpstream(t)
	events := filepath.Join(TempDir(t), "events.jsonl")
	g := Start(t, Options{
		Env:       []string{"OPENSHELL_EGRESS_TEST_HOSTS=allowed.test=127.0.0.1,denied.flood.test=127.0.0.1"},
		ExtraArgs: []string{"--security-event-sink", events},
	})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	pol := egressPolicy(map[string]*sandboxv1.NetworkPolicyRule{
		"upstream": {
			Endpoints: []*sandboxv1.NetworkEndpoint{{Host: "allowed.test", Port: portN, AllowedIps: []string{"127.0.0.1"}}},
			Binaries:  []*sandboxv1.NetworkBinary{{Path: curl}},
		},
	})
	id := createEgressSandbox(ctx, t, c, "event-flood", &openshellv1.SandboxSpec{Command: []string{"sleep", "infinity"}, Policy: pol})
	waitEgressLoaded(ctx, t, c, "event-flood", "")
	script := fmt.Sprintf("%s -s -o /dev/null -w '%%{http_code}\\n' 'http://denied.flood.test:%s/[1-%d]' | sort | uniq -c", curl, port, flood)
	out, errOut, _, err := Exec(ctx, t, c, &openshellv1.ExecSandboxRequest{SandboxId: id, Command: []string{"sh", "-c", script}})
	if err != nil {
		t.Fatalf("exec: %v (stderr %q)", err, errOut)
	}
	if got := strings.Fields(out); len(got) != 2 || got[0] != strconv.Itoa(flood) || got[1] != "403" {
		t.Fatalf("curl answers = %q, want %d times 403", out, flood)
	}

	var written, suppressed, summaries, execs int
	for deadline := time.Now().Add(45 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		data, err := os.ReadFile(events)
		if err != nil {
			t.Fatal(err)
		}
		written, suppressed, summaries, execs = 0, 0, 0, 0
		for _, line := range bytes.Split(bytes.TrimSpace(data), []byte("\n")) {
			var r securityevent.Record
			if err := json.Unmarshal(line, &r); err != nil {
				t.Fatalf("event line %q: %v", line, err)
			}
			if r.Unmapped["sandbox_id"] != id {
				continue
			}
			switch {
			case r.Metadata.Product.Name == securityevent.SandboxProduct && r.DstEndpoint != nil && r.DstEndpoint.Hostname == "denied.flood.test":
				written++
			case r.FindingInfo != nil && r.FindingInfo.UID == securityevent.FindingEventsSuppressed:
				summaries++
				n, err := strconv.Atoi(r.Unmapped["suppressed"])
				if err != nil || r.Metadata.Product.Name != "openshell-gateway" || r.ClassUID != int(securityevent.DetectionFinding) {
					t.Fatalf("summary event %s: want a gateway Detection Finding with a count", line)
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
