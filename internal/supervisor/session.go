package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/telemetry"
)

// relayChunk is the largest data payload the supervisor puts in one frame.
const relayChunk = 16 * 1024

// reconnectLoop runs attempt until ctx ends. After each attempt it waits
// with capped exponential backoff, starting over once an attempt got as
// far as being accepted. sleep is the injectable clock.
func reconnectLoop(ctx context.Context, log *slog.Logger, b *backoff, sleep func(context.Context, time.Duration) error, attempt func(context.Context) (accepted bool, err error)) {
	for {
		accepted, err := attempt(ctx)
		if ctx.Err() != nil {
			return
		}
		if accepted {
			b.reset()
		}
		d := b.next()
		log.Warn("supervisor session ended; reconnecting", "err", err, "backoff", d)
		if sleep(ctx, d) != nil {
			return
		}
	}
}

// sessionClient runs ConnectSupervisor sessions and serves their relays.
type sessionClient struct {
	log        *slog.Logger
	client     openshellv1.OpenShellClient
	sandboxID  string
	instanceID string
	sshSocket  string
	// onAccepted is called after each SessionAccepted (tests, logs).
	onAccepted func(sessionID string)

	relays sync.WaitGroup

	mu     sync.Mutex
	active map[string]*activeRelay // relay channel id → the relay serving it
}

// activeRelay is one relay being served; its pointer identifies the entry,
// so a relay that ends removes its own entry and no other.
type activeRelay struct {
	cancel context.CancelFunc
}

// run is one session: hello, SessionAccepted, heartbeats and RelayOpen
// handling until the stream ends. It reports whether the session was
// accepted.
func (s *sessionClient) run(ctx context.Context) (bool, error) {
	// Relays outlive the session that opened them: they are separate calls
	// and end with the supervisor or the gateway, not with this stream.
	relayCtx := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := s.client.ConnectSupervisor(ctx)
	if err != nil {
		return false, err
	}
	// Each relay's span is a child of the session's ConnectSupervisor
	// span (the stream's context holds it when tracing is on), so the
	// relays of a session share its trace.
	relayCtx = trace.ContextWithSpanContext(relayCtx, trace.SpanContextFromContext(stream.Context()))
	var sendMu sync.Mutex
	send := func(m *openshellv1.SupervisorMessage) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return stream.Send(m)
	}
	if err := send(&openshellv1.SupervisorMessage{Payload: &openshellv1.SupervisorMessage_Hello{
		Hello: &openshellv1.SupervisorHello{SandboxId: s.sandboxID, InstanceId: s.instanceID},
	}}); err != nil {
		return false, recvErr(stream)
	}
	first, err := stream.Recv()
	if err != nil {
		return false, err
	}
	var acc *openshellv1.SessionAccepted
	switch p := first.GetPayload().(type) {
	case *openshellv1.GatewayMessage_SessionAccepted:
		acc = p.SessionAccepted
	case *openshellv1.GatewayMessage_SessionRejected:
		return false, fmt.Errorf("session rejected: %s", p.SessionRejected.GetReason())
	default:
		return false, errors.New("gateway did not accept the session")
	}
	interval := time.Duration(acc.GetHeartbeatIntervalSecs()) * time.Second
	if interval <= 0 {
		interval = 15 * time.Second
	}
	log := s.log.With("session_id", acc.GetSessionId())
	log.Info("supervisor session accepted", "heartbeat_interval", interval)
	if s.onAccepted != nil {
		s.onAccepted(acc.GetSessionId())
	}

	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if send(&openshellv1.SupervisorMessage{Payload: &openshellv1.SupervisorMessage_Heartbeat{Heartbeat: &openshellv1.SupervisorHeartbeat{}}}) != nil {
					cancel()
					return
				}
			}
		}
	})

	// The gateway answers heartbeats; silence for three intervals means
	// the connection is dead even if TCP has not noticed.
	msgs := make(chan *openshellv1.GatewayMessage)
	errc := make(chan error, 1)
	wg.Go(func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				errc <- err
				return
			}
			select {
			case msgs <- m:
			case <-ctx.Done():
				errc <- ctx.Err()
				return
			}
		}
	})
	idle := time.NewTimer(3 * interval)
	defer idle.Stop()
	for {
		select {
		case m := <-msgs:
			idle.Reset(3 * interval)
			if ro := m.GetRelayOpen(); ro != nil {
				s.startRelay(relayCtx, log, ro, send)
			}
			if rc := m.GetRelayClose(); rc != nil {
				log.Debug("gateway closed relay", "channel_id", rc.GetChannelId(), "reason", rc.GetReason())
				s.closeRelay(rc.GetChannelId())
			}
		case err := <-errc:
			if errors.Is(err, io.EOF) {
				err = errors.New("gateway closed the session")
			}
			return true, err
		case <-idle.C:
			return true, errors.New("no message from the gateway for three heartbeat intervals")
		case <-ctx.Done():
			return true, ctx.Err()
		}
	}
}

// startRelay serves ro in its own goroutine, unless a relay for the same
// channel is already being served: a superseding session replays the
// gateway's pending relays, and the relay that got the first RelayOpen
// already dials the target and claims the channel, which the gateway
// grants once.
func (s *sessionClient) startRelay(ctx context.Context, log *slog.Logger, ro *openshellv1.RelayOpen, send func(*openshellv1.SupervisorMessage) error) {
	id := ro.GetChannelId()
	ctx, cancel := context.WithCancel(ctx)
	r := &activeRelay{cancel: cancel}
	s.mu.Lock()
	if _, dup := s.active[id]; dup {
		s.mu.Unlock()
		cancel()
		log.Debug("replayed relay is already being served", "channel_id", id)
		return
	}
	if s.active == nil {
		s.active = map[string]*activeRelay{}
	}
	s.active[id] = r
	s.mu.Unlock()
	s.relays.Go(func() {
		defer s.untrack(id, r)
		s.serveRelay(ctx, log, ro, send)
	})
}

// closeRelay cancels the relay serving channel id, if any (ending its
// RelayStream call).
func (s *sessionClient) closeRelay(id string) {
	s.mu.Lock()
	r := s.active[id]
	s.mu.Unlock()
	if r != nil {
		s.untrack(id, r)
	}
}

// untrack forgets r, if it still is the relay of channel id, and cancels
// it.
func (s *sessionClient) untrack(id string, r *activeRelay) {
	s.mu.Lock()
	if s.active[id] == r {
		delete(s.active, id)
	}
	s.mu.Unlock()
	r.cancel()
}

func recvErr(stream openshellv1.OpenShell_ConnectSupervisorClient) error {
	_, err := stream.Recv()
	return err
}

// isLoopbackHost reports whether host names the loopback interface.
func isLoopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// dialTarget connects to the target of a RelayOpen.
func (s *sessionClient) dialTarget(ctx context.Context, ro *openshellv1.RelayOpen) (net.Conn, error) {
	var d net.Dialer
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	switch t := ro.GetTarget().(type) {
	case *openshellv1.RelayOpen_Ssh:
		return d.DialContext(ctx, "unix", s.sshSocket)
	case *openshellv1.RelayOpen_Tcp:
		host, port := t.Tcp.GetHost(), t.Tcp.GetPort()
		if !isLoopbackHost(host) {
			return nil, errdefs.PermissionDenied(fmt.Sprintf("relay target %s is not a loopback address", host))
		}
		if port == 0 || port > 65535 {
			return nil, errdefs.InvalidArgument("relay target port must be between 1 and 65535")
		}
		return d.DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(int(port))))
	}
	return nil, errdefs.InvalidArgument("relay target is required")
}

// serveRelay dials the target, reports the result and pumps bytes over a
// new RelayStream call.
func (s *sessionClient) serveRelay(ctx context.Context, log *slog.Logger, ro *openshellv1.RelayOpen, send func(*openshellv1.SupervisorMessage) error) {
	// The relay's span covers its setup (dialing the target, opening and
	// claiming the RelayStream), not its life: a relay the gateway keeps
	// open would hold its span back from export.
	ctx, end := telemetry.StartOperation(ctx, "supervisor.Relay")
	var relayErr error
	ended := false
	defer func() {
		if !ended {
			end(relayErr)
		}
	}()
	log = log.With("channel_id", ro.GetChannelId())
	result := func(err error) {
		r := &openshellv1.RelayOpenResult{ChannelId: ro.GetChannelId(), Success: err == nil}
		if err != nil {
			r.Error = err.Error()
		}
		send(&openshellv1.SupervisorMessage{Payload: &openshellv1.SupervisorMessage_RelayOpenResult{RelayOpenResult: r}}) //nolint:errcheck // the session's own error handling covers a dead stream
	}
	target, err := s.dialTarget(ctx, ro)
	if err != nil {
		log.Warn("relay target refused", "err", err)
		result(err)
		relayErr = err
		return
	}
	defer target.Close()

	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	rs, err := s.client.RelayStream(rctx)
	if err == nil {
		err = rs.Send(&openshellv1.RelayFrame{Payload: &openshellv1.RelayFrame_Init{Init: &openshellv1.RelayInit{ChannelId: ro.GetChannelId()}}})
	}
	if err != nil {
		log.Warn("relay stream failed to open", "err", err)
		relayErr = fmt.Errorf("open relay stream: %w", err)
		result(relayErr)
		return
	}
	result(nil)
	ended = true
	end(nil)
	pumpRelay(rs, target)
	log.Debug("relay closed")
}

// pumpRelay copies bytes between a RelayStream and a local connection.
// target EOF half-closes the stream (CloseSend); the gateway ending the call
// closes the target.
func pumpRelay(rs openshellv1.OpenShell_RelayStreamClient, target net.Conn) {
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			// A fresh buffer per frame: gRPC may still hold a sent message.
			buf := make([]byte, relayChunk)
			n, err := target.Read(buf)
			if n > 0 {
				if rs.Send(&openshellv1.RelayFrame{Payload: &openshellv1.RelayFrame_Data{Data: buf[:n]}}) != nil {
					return
				}
			}
			if err != nil {
				rs.CloseSend() //nolint:errcheck
				return
			}
		}
	})
	for {
		f, err := rs.Recv()
		if err != nil {
			break
		}
		if d := f.GetData(); len(d) > 0 {
			if _, err := target.Write(d); err != nil {
				break
			}
		}
	}
	// The gateway ended the call (or it broke): nothing more can be sent.
	target.Close()
	wg.Wait()
}
