package gatewaytest

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// TestWatchSandbox follows a sandbox from creation to READY (status
// snapshots, then the stream ends by stop_on_terminal), then follows its
// logs and sees the main process's output and the deletion.
func TestWatchSandbox(t *testing.T) {
	g := Start(t, Options{})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	created, err := c.CreateSandbox(ctx, &openshellv1.CreateSandboxRequest{Name: "watched", Spec: &openshellv1.SandboxSpec{
		Command: []string{"sh", "-c", "sleep 1; echo main-says-hello; exec sleep infinity"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	id := created.GetSandbox().GetMetadata().GetId()
	w, err := c.WatchSandbox(ctx, &openshellv1.WatchSandboxRequest{Id: id, FollowStatus: true, FollowEvents: true, StopOnTerminal: true})
	if err != nil {
		t.Fatal(err)
	}
	var phases []openshellv1.SandboxPhase
	for {
		ev, err := w.Recv()
		if err != nil {
			break // stop_on_terminal ends the stream at READY
		}
		if sb := ev.GetSandbox(); sb != nil {
			phases = append(phases, sb.GetStatus().GetPhase())
		}
	}
	if len(phases) == 0 || phases[len(phases)-1] != openshellv1.SandboxPhase_SANDBOX_PHASE_READY {
		t.Fatalf("phases seen = %v, want to end at READY", phases)
	}

	logs, err := c.WatchSandbox(ctx, &openshellv1.WatchSandboxRequest{Id: id, FollowLogs: true, FollowStatus: true})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var lines []string
	deleted := make(chan struct{})
	go func() {
		defer close(deleted)
		for {
			ev, err := logs.Recv()
			if err != nil {
				return
			}
			if l := ev.GetLog(); l != nil {
				mu.Lock()
				lines = append(lines, l.GetSource()+": "+l.GetMessage())
				mu.Unlock()
			}
		}
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		mu.Lock()
		joined := strings.Join(lines, "\n")
		mu.Unlock()
		if strings.Contains(joined, "main-says-hello") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("main process output never reached the log stream; got:\n%s", joined)
		}
		time.Sleep(50 * time.Millisecond)
	}
	resp, err := c.GetSandboxLogs(ctx, &openshellv1.GetSandboxLogsRequest{SandboxId: id, Sources: []string{"sandbox"}})
	if err != nil || resp.GetBufferTotal() == 0 {
		t.Fatalf("GetSandboxLogs = %v, %v", resp, err)
	}
	if _, err := c.DeleteSandbox(ctx, &openshellv1.DeleteSandboxRequest{Name: "watched"}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-deleted: // the watch ends when the sandbox is gone
	case <-time.After(10 * time.Second):
		t.Fatal("watch did not end after delete")
	}
}

// TestGatewayKilledDuringDelete kills the gateway while deletes are in
// flight; after a restart the deletes finish: no row, no process.
func TestGatewayKilledDuringDelete(t *testing.T) {
	g := Start(t, Options{})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	names := []string{"del-a", "del-b", "del-c", "del-d"}
	var pids []int
	for _, n := range names {
		sb := readySandbox(ctx, t, c, n)
		pids = append(pids, supervisorPID(t, g, sb.GetMetadata().GetId()))
	}
	var wg sync.WaitGroup
	for _, n := range names {
		wg.Go(func() { _, _ = c.DeleteSandbox(ctx, &openshellv1.DeleteSandboxRequest{Name: n}) })
	}
	// Kill as soon as the first delete is visible, while others are in flight.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		list, err := c.ListSandboxes(ctx, &openshellv1.ListSandboxesRequest{})
		if err != nil {
			break
		}
		started := len(list.GetSandboxes()) < len(names)
		for _, sb := range list.GetSandboxes() {
			started = started || sb.GetStatus().GetPhase() == openshellv1.SandboxPhase_SANDBOX_PHASE_DELETING
		}
		if started {
			break
		}
	}
	g.Kill()
	wg.Wait()

	g2 := Start(t, Options{StateDir: g.StateDir, TLSDir: g.TLSDir, Port: g.Port})
	c2 := g2.Client()
	// Deletes whose DELETING state was persisted finish during recovery;
	// the others never started and the sandboxes are still there.
	list, err := c2.ListSandboxes(ctx, &openshellv1.ListSandboxesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range list.GetSandboxes() {
		if sb.GetStatus().GetPhase() == openshellv1.SandboxPhase_SANDBOX_PHASE_DELETING {
			t.Errorf("sandbox %s still DELETING after recovery", sb.GetMetadata().GetName())
		}
		if _, err := c2.DeleteSandbox(ctx, &openshellv1.DeleteSandboxRequest{Name: sb.GetMetadata().GetName()}); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d of %d deletes had not started when the gateway died", len(list.GetSandboxes()), len(names))
	if dirs := sandboxDirs(t, g2); len(dirs) != 0 {
		t.Fatalf("workloads left: %v", dirs)
	}
	for _, pid := range pids {
		if alive(pid) {
			t.Fatalf("supervisor %d still running", pid)
		}
	}
}

// TestWatchSandboxReplaysTransitions: after create, stop and start, a
// watch with event_tail replays a platform event per phase transition;
// without follow_status it gets no snapshot; it and a log push end when
// the sandbox is deleted.
func TestWatchSandboxReplaysTransitions(t *testing.T) {
	g := Start(t, Options{})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	sb := readySandbox(ctx, t, c, "cycled")
	if _, err := c.StopSandbox(ctx, &openshellv1.StopSandboxRequest{Name: "cycled"}); err != nil {
		t.Fatal(err)
	}
	WaitPhase(ctx, t, c, "cycled", openshellv1.SandboxPhase_SANDBOX_PHASE_STOPPED, time.Minute)
	if _, err := c.StartSandbox(ctx, &openshellv1.StartSandboxRequest{Name: "cycled"}); err != nil {
		t.Fatal(err)
	}
	WaitPhase(ctx, t, c, "cycled", openshellv1.SandboxPhase_SANDBOX_PHASE_READY, time.Minute)

	w, err := c.WatchSandbox(ctx, &openshellv1.WatchSandboxRequest{Id: sb.GetMetadata().GetId(), FollowEvents: true, EventTail: 20})
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		reasons   []string
		snapshots int
		err       error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		for {
			ev, err := w.Recv()
			if err != nil {
				r.err = err
				done <- r
				return
			}
			if ev.GetSandbox() != nil {
				r.snapshots++
			}
			if e := ev.GetEvent(); e != nil {
				r.reasons = append(r.reasons, e.GetReason())
			}
		}
	}()
	if _, err := c.DeleteSandbox(ctx, &openshellv1.DeleteSandboxRequest{Name: "cycled"}); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("watch did not end after delete")
	}
	if !errors.Is(r.err, io.EOF) {
		t.Errorf("watch ended with %v, want EOF", r.err)
	}
	if r.snapshots != 0 {
		t.Errorf("watch without follow_status got %d snapshots", r.snapshots)
	}
	want := []string{"PhaseReady", "PhaseStopping", "PhaseStopped", "PhaseStarting", "PhaseReady", "PhaseDeleting"}
	i := 0
	for _, reason := range r.reasons {
		if i < len(want) && reason == want[i] {
			i++
		}
	}
	if i != len(want) {
		t.Errorf("events = %q, want %q in this order", r.reasons, want)
	}
}
