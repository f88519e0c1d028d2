package logs_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/api/apitest"
	"github.com/openshell-go/openshell/internal/api/logs"
	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/sandboxlog"
	"github.com/openshell-go/openshell/internal/securityevent"
)

const wait = 10 * time.Second

type fixture struct {
	*apitest.Fixture
	svc  *logs.Service
	logs *sandboxlog.Buffer
}

func newFixture(t *testing.T, oidc bool) *fixture {
	t.Helper()
	f := apitest.NewFixture(t)
	buf := sandboxlog.New(0)
	s := logs.New(logs.Options{Engine: f.Engine, Logs: buf, Authz: f.Authz(oidc)})
	t.Cleanup(s.Close)
	return &fixture{Fixture: f, svc: s, logs: buf}
}

// watching is one WatchSandbox call running in the background.
type watching struct {
	stream *apitest.SendStream[openshellv1.SandboxStreamEvent]
	done   chan error
	cancel context.CancelFunc
}

func startWatch(t *testing.T, s *logs.Service, p *auth.Principal, req *openshellv1.WatchSandboxRequest, buffer int) *watching {
	t.Helper()
	ctx, cancel := context.WithCancel(apitest.As(t.Context(), p))
	w := &watching{stream: apitest.NewSendStream[openshellv1.SandboxStreamEvent](ctx, buffer), done: make(chan error, 1), cancel: cancel}
	go func() { w.done <- s.WatchSandbox(req, w.stream) }()
	t.Cleanup(func() {
		cancel()
		<-w.done
	})
	return w
}

// next returns the next event, or nil and the handler's result once it
// returned.
func (w *watching) next(t *testing.T) (*openshellv1.SandboxStreamEvent, error) {
	t.Helper()
	select {
	case ev := <-w.stream.C:
		return ev, nil
	case err := <-w.done:
		w.done <- err // keep it for the cleanup
		select {      // events sent just before the return
		case ev := <-w.stream.C:
			return ev, nil
		default:
		}
		return nil, err
	case <-time.After(wait):
		t.Fatalf("no watch event and no end within %v", wait)
		return nil, nil
	}
}

// rest collects events until the handler returns.
func (w *watching) rest(t *testing.T) ([]*openshellv1.SandboxStreamEvent, error) {
	t.Helper()
	var out []*openshellv1.SandboxStreamEvent
	for {
		ev, err := w.next(t)
		if ev == nil {
			return out, err
		}
		out = append(out, ev)
	}
}

// TestAuthorization runs the log RPCs as each kind of principal against a
// sandbox in team-a on an OIDC gateway.
func TestAuthorization(t *testing.T) {
	f := newFixture(t, true)
	id := f.SandboxA
	calls := []struct {
		name string
		call func(ctx context.Context, p *auth.Principal) error
	}{
		{"GetSandboxLogs", func(ctx context.Context, p *auth.Principal) error {
			_, err := f.svc.GetSandboxLogs(apitest.As(ctx, p), &openshellv1.GetSandboxLogsRequest{SandboxId: id})
			return err
		}},
		{"GetSandboxLogsWrongWorkspace", func(ctx context.Context, p *auth.Principal) error {
			_, err := f.svc.GetSandboxLogs(apitest.As(ctx, p), &openshellv1.GetSandboxLogsRequest{SandboxId: id, Workspace: "team-b"})
			return err
		}},
		{"WatchSandbox", func(_ context.Context, p *auth.Principal) error {
			w := startWatch(t, f.svc, p, &openshellv1.WatchSandboxRequest{Id: id, FollowStatus: true, FollowLogs: true, FollowEvents: true}, 0)
			ev, err := w.next(t)
			if ev != nil && ev.GetSandbox().GetMetadata().GetId() != id {
				t.Errorf("first watch event = %v, want the snapshot of %s", ev, id)
			}
			w.cancel()
			return err
		}},
		{"PushSandboxLogs", func(ctx context.Context, p *auth.Principal) error {
			st := apitest.NewRecvStream[openshellv1.PushSandboxLogsRequest, openshellv1.PushSandboxLogsResponse](apitest.As(ctx, p))
			close(st.In)
			return f.svc.PushSandboxLogs(st)
		}},
	}
	const (
		ok     = codes.OK
		nf     = codes.NotFound
		denied = codes.PermissionDenied
	)
	tests := []struct {
		name string
		p    *auth.Principal
		want []codes.Code // in calls order
	}{
		{"local dev", apitest.LocalDev, []codes.Code{ok, nf, ok, denied}},
		{"platform admin", apitest.OIDCRoot, []codes.Code{ok, nf, ok, denied}},
		{"workspace user", apitest.OIDCUser("ua"), []codes.Code{ok, nf, ok, denied}},
		{"workspace admin", apitest.OIDCUser("aa"), []codes.Code{ok, nf, ok, denied}},
		{"non-member", apitest.OIDCUser("stranger"), []codes.Code{nf, nf, nf, denied}},
		{"no subject", apitest.NoSubject, []codes.Code{nf, nf, nf, denied}},
		{"own sandbox", apitest.Sandbox(id), []codes.Code{ok, nf, ok, ok}},
		{"other sandbox", apitest.Sandbox(f.SandboxB), []codes.Code{denied, denied, denied, ok}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for i, c := range calls {
				if got := errdefs.Code(c.call(t.Context(), tc.p)); got != tc.want[i] {
					t.Errorf("%s as %s = %v, want %v", c.name, tc.name, got, tc.want[i])
				}
			}
		})
	}
}

// TestWatchSandboxMembership is the regression test for a user streaming
// the status, events and logs of a sandbox in a workspace they do not
// belong to, by id.
func TestWatchSandboxMembership(t *testing.T) {
	f := newFixture(t, true)
	f.logs.Append(&openshellv1.SandboxLogLine{SandboxId: f.SandboxA, Message: "secret line", Level: "info", Source: sandboxlog.SourceSandbox})
	w := startWatch(t, f.svc, apitest.OIDCUser("stranger"), &openshellv1.WatchSandboxRequest{Id: f.SandboxA, FollowStatus: true, FollowLogs: true, FollowEvents: true}, 16)
	evs, err := w.rest(t)
	if len(evs) != 0 || errdefs.Code(err) != codes.NotFound {
		t.Fatalf("WatchSandbox(other workspace's sandbox) = %d events %v, %v; want none and NotFound", len(evs), evs, err)
	}
}

// TestWatchSandboxPhaseEvents is the regression test for event_tail
// returning one platform event after create, stop and start: every phase
// transition is recorded and replayed.
func TestWatchSandboxPhaseEvents(t *testing.T) {
	f := newFixture(t, false)
	ctx := t.Context()
	sb, err := f.Engine.Create(ctx, &openshellv1.CreateSandboxRequest{Name: "cycle"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Engine.Stop(ctx, "", "cycle"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Engine.Start(ctx, "", "cycle"); err != nil {
		t.Fatal(err)
	}
	w := startWatch(t, f.svc, apitest.LocalDev, &openshellv1.WatchSandboxRequest{Id: sb.GetMetadata().GetId(), FollowEvents: true, EventTail: 20}, 64)
	var reasons []string
	for len(reasons) < 64 {
		select {
		case ev := <-w.stream.C:
			reasons = append(reasons, ev.GetEvent().GetReason())
			continue
		case <-time.After(500 * time.Millisecond): // the replay is sent at once; nothing else happens
		}
		break
	}
	want := []string{"PhaseProvisioning", "PhaseStopping", "PhaseStopped", "PhaseStarting"}
	if !containsInOrder(reasons, want) {
		t.Fatalf("replayed events = %q, want %q in this order", reasons, want)
	}
}

func containsInOrder(got, want []string) bool {
	i := 0
	for _, g := range got {
		if i < len(want) && g == want[i] {
			i++
		}
	}
	return i == len(want)
}

// TestWatchSandboxDelete is the regression test for the deleting snapshot
// sent twice with one resource_version, and for snapshots sent to a watch
// that does not follow status.
func TestWatchSandboxDelete(t *testing.T) {
	for _, followStatus := range []bool{true, false} {
		t.Run(map[bool]string{true: "follow status", false: "events only"}[followStatus], func(t *testing.T) {
			f := newFixture(t, false)
			req := &openshellv1.WatchSandboxRequest{Id: f.SandboxA, FollowStatus: followStatus, FollowEvents: true}
			w := startWatch(t, f.svc, apitest.LocalDev, req, 256)
			// The first event (snapshot, or the replayed creation event)
			// shows the watch has subscribed.
			if ev, err := w.next(t); (ev.GetSandbox() != nil) != followStatus || ev == nil {
				t.Fatalf("first event = %v, %v; want the snapshot only when following status", ev, err)
			}
			if _, err := f.Engine.Delete(t.Context(), "team-a", "sb"); err != nil {
				t.Fatal(err)
			}
			evs, err := w.rest(t)
			if err != nil {
				t.Fatalf("watch ended with %v, want nil", err)
			}
			seen := map[uint64]bool{}
			deleting := 0
			for _, ev := range evs {
				sb := ev.GetSandbox()
				if sb == nil {
					continue
				}
				if !followStatus {
					t.Errorf("watch without follow_status sent snapshot %v", sb.GetMetadata())
				}
				rv := sb.GetMetadata().GetResourceVersion()
				if seen[rv] {
					t.Errorf("snapshot resource_version %d sent twice", rv)
				}
				seen[rv] = true
				if sb.GetStatus().GetPhase() == openshellv1.SandboxPhase_SANDBOX_PHASE_DELETING {
					deleting++
				}
			}
			if want := map[bool]int{true: 1, false: 0}[followStatus]; deleting != want {
				t.Errorf("DELETING snapshots = %d, want %d (events %v)", deleting, want, evs)
			}
		})
	}
}

// TestWatchSandboxEndsOnDeleteWhenBehind is the regression test for a
// watch that stayed open after its sandbox was deleted: a client that
// reads slowly must still see the stream end.
func TestWatchSandboxEndsOnDeleteWhenBehind(t *testing.T) {
	f := newFixture(t, false)
	w := startWatch(t, f.svc, apitest.LocalDev, &openshellv1.WatchSandboxRequest{Id: f.SandboxA, FollowEvents: true}, 0)
	// Once the watch has subscribed (it sent the replayed creation
	// event), its handler blocks in Send while the engine publishes more
	// than a subscriber buffers, then the delete.
	if ev, err := w.next(t); ev.GetEvent() == nil {
		t.Fatalf("first event = %v, %v; want the replayed creation event", ev, err)
	}
	for i := range 200 {
		f.Engine.PublishPlatformEvent(f.SandboxA, &openshellv1.PlatformEvent{Reason: "Filler", Message: string(rune('a' + i%26))})
	}
	if _, err := f.Engine.Delete(t.Context(), "team-a", "sb"); err != nil {
		t.Fatal(err)
	}
	if _, err := w.rest(t); err != nil {
		t.Fatalf("watch ended with %v, want nil", err)
	}
}

// TestPushSandboxLogsDeleted is the regression test for log pushes of a
// deleted sandbox: a new push is refused, an open one ends at the delete.
func TestPushSandboxLogsDeleted(t *testing.T) {
	f := newFixture(t, false)
	ctx := apitest.As(t.Context(), apitest.Sandbox(f.SandboxA))
	open := apitest.NewRecvStream[openshellv1.PushSandboxLogsRequest, openshellv1.PushSandboxLogsResponse](ctx)
	done := make(chan error, 1)
	go func() { done <- f.svc.PushSandboxLogs(open) }()
	open.In <- &openshellv1.PushSandboxLogsRequest{SandboxId: f.SandboxA, Logs: []*openshellv1.SandboxLogLine{{Message: "hello", Level: "info"}}}
	if _, err := f.Engine.Delete(t.Context(), "team-a", "sb"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		apitest.WantErr(t, "open PushSandboxLogs at delete", err, codes.NotFound, "was deleted")
	case <-time.After(wait):
		t.Fatalf("PushSandboxLogs still open %v after its sandbox was deleted", wait)
	}
	if got, _ := f.logs.Read(f.SandboxA, sandboxlog.Filter{}); len(got) != 0 {
		t.Errorf("deleted sandbox keeps %d buffered lines", len(got))
	}

	again := apitest.NewRecvStream[openshellv1.PushSandboxLogsRequest, openshellv1.PushSandboxLogsResponse](ctx)
	close(again.In)
	apitest.WantErr(t, "PushSandboxLogs with a deleted sandbox's token", f.svc.PushSandboxLogs(again), codes.NotFound, "sandbox not found")
}

// TestPushSandboxLogsEndsWithCall is the regression test for a push whose
// caller went away staying open: the receive loop could give up on the
// cancelled call without telling the handler.
func TestPushSandboxLogsEndsWithCall(t *testing.T) {
	f := newFixture(t, false)
	for range 20 {
		ctx, cancel := context.WithCancel(apitest.As(t.Context(), apitest.Sandbox(f.SandboxA)))
		st := apitest.NewRecvStream[openshellv1.PushSandboxLogsRequest, openshellv1.PushSandboxLogsResponse](ctx)
		done := make(chan error, 1)
		go func() { done <- f.svc.PushSandboxLogs(st) }()
		cancel()
		select {
		case err := <-done:
			if errdefs.Code(err) == codes.OK {
				t.Fatalf("PushSandboxLogs after the caller left = %v, want an error", err)
			}
		case <-time.After(wait):
			t.Fatalf("PushSandboxLogs still open %v after its caller left", wait)
		}
	}
}

// TestWatchSandboxDraftUpdates: a draft update of the sandbox reaches a
// watch following events, as a draft_policy_update, and no watch that
// does not follow events (which sees the next snapshot without it).
func TestWatchSandboxDraftUpdates(t *testing.T) {
	f := newFixture(t, false)
	sb, err := f.Engine.Create(t.Context(), &openshellv1.CreateSandboxRequest{Name: "drafts"})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.GetMetadata().GetId()
	events := startWatch(t, f.svc, apitest.LocalDev, &openshellv1.WatchSandboxRequest{Id: id, FollowEvents: true}, 64)
	status := startWatch(t, f.svc, apitest.LocalDev, &openshellv1.WatchSandboxRequest{Id: id, FollowStatus: true}, 64)
	if ev, err := status.next(t); err != nil || ev.GetSandbox() == nil {
		t.Fatalf("first event of the status watch = %v, %v; want the snapshot", ev, err)
	}
	// Both watches are subscribed once they sent something; the events
	// watch replays the phase events first.
	if ev, err := events.next(t); err != nil || ev.GetEvent() == nil {
		t.Fatalf("first event of the events watch = %v, %v; want a replayed platform event", ev, err)
	}
	u := &openshellv1.DraftPolicyUpdate{DraftVersion: 3, NewChunks: 1, TotalPending: 2, Summary: "1 proposal(s) accepted (1 new chunk(s)), 0 rejected"}
	f.Engine.PublishDraftUpdate(id, u)
	for {
		ev, err := events.next(t)
		if err != nil {
			t.Fatal(err)
		}
		if ev.GetEvent() != nil {
			continue // the rest of the replay
		}
		if !proto.Equal(ev.GetDraftPolicyUpdate(), u) {
			t.Fatalf("events watch got %v, want the draft update %v", ev, u)
		}
		break
	}
	if _, err := f.Engine.Stop(t.Context(), "", "drafts"); err != nil {
		t.Fatal(err)
	}
	if ev, err := status.next(t); err != nil || ev.GetSandbox() == nil {
		t.Fatalf("status watch after a draft update and a stop = %v, %v; want the next snapshot and no draft update", ev, err)
	}
}

// emitted records security events (a fake securityevent.Emitter).
type emitted struct {
	mu  sync.Mutex
	evs []securityevent.Event
}

func (e *emitted) Emit(_ context.Context, ev securityevent.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.evs = append(e.evs, ev)
}

// TestPushSandboxLogsSecurityEvents: a pushed egress decision line is
// buffered as is and recorded as one security event whose subject is the
// pushing sandbox (not the sandbox id the line claims); other lines are
// not events.
func TestPushSandboxLogsSecurityEvents(t *testing.T) {
	f := apitest.NewFixture(t)
	buf := sandboxlog.New(0)
	em := &emitted{}
	s := logs.New(logs.Options{Engine: f.Engine, Logs: buf, Authz: f.Authz(false), SecurityEvents: em})
	t.Cleanup(s.Close)
	st := apitest.NewRecvStream[openshellv1.PushSandboxLogsRequest, openshellv1.PushSandboxLogsResponse](apitest.As(t.Context(), apitest.Sandbox(f.SandboxA)))
	done := make(chan error, 1)
	go func() { done <- s.PushSandboxLogs(st) }()
	st.In <- &openshellv1.PushSandboxLogsRequest{SandboxId: f.SandboxA, Logs: []*openshellv1.SandboxLogLine{
		{Message: "egress proxy listening", Target: securityevent.TargetEgress, Fields: map[string]string{"addr": "127.0.0.1:3128"}},
		{SandboxId: "someone-else", Message: "egress deny", Target: securityevent.TargetEgress,
			Fields: map[string]string{"decision": "deny", "kind": "connect", "host": "other.test", "port": "443", "binary": "/usr/bin/curl", "pid": "7"}},
		{Message: "egress deny", Target: "main_process", Fields: map[string]string{"decision": "deny", "kind": "connect"}},
	}}
	close(st.In)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("PushSandboxLogs = %v", err)
		}
	case <-time.After(wait):
		t.Fatal("PushSandboxLogs did not end")
	}
	if got, _ := buf.Read(f.SandboxA, sandboxlog.Filter{}); len(got) != 3 {
		t.Errorf("buffered %d lines, want the 3 pushed", len(got))
	}
	em.mu.Lock()
	defer em.mu.Unlock()
	if len(em.evs) != 1 {
		t.Fatalf("security events = %+v, want one (the decision)", em.evs)
	}
	if ev := em.evs[0]; ev.SandboxID != f.SandboxA || ev.Class != securityevent.NetworkActivity || ev.Outcome != securityevent.Denied ||
		ev.Dst == nil || ev.Dst.Hostname != "other.test" || ev.Process == nil || ev.Process.Name != "/usr/bin/curl" {
		t.Errorf("security event = %+v, want a denied Network Activity of sandbox %s to other.test by curl", ev, f.SandboxA)
	}
}
