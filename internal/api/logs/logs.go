// Package logs implements the log and watch RPCs of openshell.v1.OpenShell:
// GetSandboxLogs and WatchSandbox (users, or a sandbox for itself) and
// PushSandboxLogs (a sandbox's supervisor pushing its own lines). Lines are
// kept in a bounded in-memory buffer per sandbox (sandboxlog). A pushed
// egress or inference decision line is also recorded as a security event
// whose subject is the pushing sandbox (securityevent.FromSandboxLog).
package logs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/api/authz"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/lifecycle"
	"github.com/openshell-go/openshell/internal/sandboxlog"
	"github.com/openshell-go/openshell/internal/securityevent"
)

// Options wire a Service.
type Options struct {
	Engine *lifecycle.Engine
	Logs   *sandboxlog.Buffer
	Authz  *authz.Authorizer
	// SecurityEvents records the security events in pushed decision
	// lines (securityevent.FromSandboxLog); nil discards them.
	SecurityEvents securityevent.Emitter
	Now            func() time.Time
}

// Service implements the log RPCs. It is safe for concurrent use; Close
// ends its long-lived streams.
type Service struct {
	o Options
	// closing ends long-lived streams (log pushes, watches) at shutdown.
	closing   chan struct{}
	closeOnce sync.Once
}

// New returns a Service.
func New(o Options) *Service {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logs == nil {
		o.Logs = sandboxlog.New(0)
	}
	if o.SecurityEvents == nil {
		o.SecurityEvents = securityevent.Discard
	}
	return &Service{o: o, closing: make(chan struct{})}
}

// Close ends the service's long-lived streams so a graceful drain does not
// wait for its deadline. Unary calls are unaffected.
func (s *Service) Close() { s.closeOnce.Do(func() { close(s.closing) }) }

// DropSandbox forgets the buffered lines of a deleted sandbox.
func (s *Service) DropSandbox(sandboxID string) { s.o.Logs.Drop(sandboxID) }

const defaultLogTail = 200

func logFilter(tail uint32, since int64, sources []string, minLevel string) sandboxlog.Filter {
	return sandboxlog.Filter{Tail: int(tail), SinceMs: since, Sources: sources, MinLevel: minLevel}
}

// GetSandboxLogs returns recent log lines of a sandbox.
func (s *Service) GetSandboxLogs(ctx context.Context, req *openshellv1.GetSandboxLogsRequest) (*openshellv1.GetSandboxLogsResponse, error) {
	sb, err := s.o.Authz.SandboxForCaller(ctx, req.GetSandboxId())
	if err != nil {
		return nil, err
	}
	if ws := req.GetWorkspace(); ws != "" && ws != sb.GetMetadata().GetWorkspace() {
		return nil, errdefs.NotFound("sandbox not found")
	}
	lines := req.GetLines()
	if lines == 0 {
		lines = defaultLogTail
	}
	logs, total := s.o.Logs.Read(req.GetSandboxId(), logFilter(lines, req.GetSinceMs(), req.GetSources(), req.GetMinLevel()))
	return &openshellv1.GetSandboxLogsResponse{Logs: logs, BufferTotal: total}, nil
}

// WatchSandbox streams a sandbox's snapshots (follow_status), logs
// (follow_logs) and platform events (follow_events). Snapshots start with
// the current one and skip a resource_version already sent; events start
// with the last event_tail recorded ones (0 = all kept), which include one
// per phase transition; with follow_events, a draft_policy_update follows
// every change of the sandbox's policy advisor drafts made through this
// gateway process (never replayed). With stop_on_terminal the stream ends once the
// sandbox is READY; it always ends when the sandbox is deleted. The caller
// must be allowed to see the sandbox: its own supervisor, or a user of its
// workspace (a sandbox in another workspace reads NotFound).
func (s *Service) WatchSandbox(req *openshellv1.WatchSandboxRequest, stream openshellv1.OpenShell_WatchSandboxServer) error {
	ctx := stream.Context()
	if req.GetId() == "" {
		return errdefs.InvalidArgument("id is required")
	}
	// Subscribe before reading the snapshot so nothing falls in between.
	updates, cancel := s.o.Engine.Subscribe(req.GetId())
	defer cancel()
	var logs <-chan *openshellv1.SandboxLogLine
	if req.GetFollowLogs() {
		ch, stop := s.o.Logs.Follow(req.GetId())
		defer stop()
		logs = ch
	}
	sb, err := s.o.Authz.SandboxForCaller(ctx, req.GetId())
	if err != nil {
		return err
	}
	w := &watch{req: req, stream: stream}
	if err := w.snapshot(sb); err != nil || w.terminal(sb) {
		return err
	}
	if req.GetFollowEvents() {
		if err := w.replayEvents(s.o.Engine.EventTail(req.GetId(), int(req.GetEventTail()))); err != nil {
			return err
		}
	}
	filter := logFilter(req.GetLogTailLines(), req.GetLogSinceMs(), req.GetLogSources(), req.GetLogMinLevel())
	if req.GetFollowLogs() {
		if filter.Tail == 0 {
			filter.Tail = defaultLogTail
		}
		tail, _ := s.o.Logs.Read(req.GetId(), filter)
		for _, l := range tail {
			if err := w.send(&openshellv1.SandboxStreamEvent{Payload: &openshellv1.SandboxStreamEvent_Log{Log: l}}); err != nil {
				return err
			}
		}
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.closing:
			return errdefs.Unavailable("gateway is shutting down")
		case u := <-updates:
			if done, err := w.update(u); done || err != nil {
				return err
			}
		case l := <-logs:
			if filter.Match(l) {
				if err := w.send(&openshellv1.SandboxStreamEvent{Payload: &openshellv1.SandboxStreamEvent_Log{Log: l}}); err != nil {
					return err
				}
			}
		}
	}
}

// watch is the state of one WatchSandbox stream.
type watch struct {
	req    *openshellv1.WatchSandboxRequest
	stream openshellv1.OpenShell_WatchSandboxServer
	// lastRV is the resource_version of the last snapshot sent (sent
	// tells whether there was one).
	lastRV uint64
	sent   bool
	// replayed holds the events sent from the tail, which a racing
	// publication may deliver once more through the subscription.
	replayed map[*openshellv1.PlatformEvent]bool
}

func (w *watch) send(ev *openshellv1.SandboxStreamEvent) error { return w.stream.Send(ev) }

func (w *watch) terminal(sb *openshellv1.Sandbox) bool {
	return w.req.GetStopOnTerminal() && sb.GetStatus().GetPhase() == openshellv1.SandboxPhase_SANDBOX_PHASE_READY
}

// snapshot sends sb if the watch follows status and sb is not the
// snapshot sent last.
func (w *watch) snapshot(sb *openshellv1.Sandbox) error {
	rv := sb.GetMetadata().GetResourceVersion()
	if !w.req.GetFollowStatus() || (w.sent && rv == w.lastRV) {
		return nil
	}
	w.sent, w.lastRV = true, rv
	return w.send(&openshellv1.SandboxStreamEvent{Payload: &openshellv1.SandboxStreamEvent_Sandbox{Sandbox: sb}})
}

func (w *watch) replayEvents(evs []*openshellv1.PlatformEvent) error {
	w.replayed = make(map[*openshellv1.PlatformEvent]bool, len(evs))
	for _, ev := range evs {
		w.replayed[ev] = true
		if err := w.send(&openshellv1.SandboxStreamEvent{Payload: &openshellv1.SandboxStreamEvent_Event{Event: ev}}); err != nil {
			return err
		}
	}
	return nil
}

// update forwards one engine update; done reports the end of the watch.
func (w *watch) update(u lifecycle.Update) (done bool, err error) {
	if u.Draft != nil && w.req.GetFollowEvents() {
		if err := w.send(&openshellv1.SandboxStreamEvent{Payload: &openshellv1.SandboxStreamEvent_DraftPolicyUpdate{DraftPolicyUpdate: u.Draft}}); err != nil {
			return true, err
		}
	}
	if u.Platform != nil && w.req.GetFollowEvents() && !w.replayed[u.Platform] {
		if err := w.send(&openshellv1.SandboxStreamEvent{Payload: &openshellv1.SandboxStreamEvent_Event{Event: u.Platform}}); err != nil {
			return true, err
		}
	}
	if u.Sandbox != nil {
		if err := w.snapshot(u.Sandbox); err != nil {
			return true, err
		}
		if w.terminal(u.Sandbox) {
			return true, nil
		}
	}
	return u.Deleted, nil
}

// maxLogLine bounds a single pushed log message.
const maxLogLine = 16 << 10

// PushSandboxLogs receives log batches from a supervisor for its own
// sandbox. A sandbox that no longer exists is refused, and the stream ends
// (NotFound) when its sandbox is deleted, when the caller goes away, or at
// shutdown.
func (s *Service) PushSandboxLogs(stream openshellv1.OpenShell_PushSandboxLogsServer) error {
	ctx := stream.Context()
	id, err := authz.RequireSandboxPrincipal(ctx)
	if err != nil {
		return err
	}
	// Subscribe before the existence check so a delete in between is seen.
	updates, cancel := s.o.Engine.Subscribe(id)
	defer cancel()
	if err := s.o.Engine.SandboxExists(ctx, id); err != nil {
		return err
	}
	type recv struct {
		req *openshellv1.PushSandboxLogsRequest
		err error
	}
	next := make(chan recv)
	go func() { // ends when the call ends (Recv fails)
		for {
			req, err := stream.Recv()
			select {
			case next <- recv{req, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	for {
		var r recv
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.closing:
			return errdefs.Unavailable("gateway is shutting down")
		case u := <-updates:
			if u.Deleted {
				s.o.Logs.Drop(id) // lines appended while the delete ran
				return errdefs.NotFound(fmt.Sprintf("sandbox %s was deleted", id))
			}
			continue
		case r = <-next:
		}
		if errors.Is(r.err, io.EOF) {
			return stream.SendAndClose(&openshellv1.PushSandboxLogsResponse{})
		}
		if r.err != nil {
			return r.err
		}
		if r.req.GetSandboxId() != id {
			return authz.ErrCrossSandbox
		}
		for _, l := range r.req.GetLogs() {
			l.SandboxId = id
			l.Source = sandboxlog.SourceSandbox
			if len(l.Message) > maxLogLine {
				l.Message = l.Message[:maxLogLine]
			}
			if l.TimestampMs == 0 {
				l.TimestampMs = s.o.Now().UnixMilli()
			}
			s.o.Logs.Append(l)
			for _, ev := range securityevent.FromSandboxLog(l) {
				ev.SandboxID = id
				s.o.SecurityEvents.Emit(ctx, ev)
			}
		}
	}
}
