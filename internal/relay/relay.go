package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/auth"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// Defaults of Config, matching the upstream gateway.
const (
	DefaultHeartbeatInterval    = 15 * time.Second
	DefaultSessionWait          = 15 * time.Second
	DefaultSessionPollMin       = 100 * time.Millisecond
	DefaultSessionPollMax       = 2 * time.Second
	DefaultClaimTimeout         = 10 * time.Second
	DefaultFirstMessageTimeout  = 10 * time.Second
	DefaultMaxPending           = 256
	DefaultMaxPendingPerSandbox = 32
	// ChunkSize is the largest data payload of one RelayFrame.
	ChunkSize = 16 * 1024
)

// Config tunes a Registry. Zero fields take the defaults above.
type Config struct {
	// HeartbeatInterval is announced to supervisors in SessionAccepted.
	// A session that sends nothing for three intervals is ended.
	HeartbeatInterval time.Duration
	// SessionWait bounds how long OpenRelay waits for a session;
	// it polls with backoff from SessionPollMin to SessionPollMax and also
	// wakes as soon as a session registers.
	SessionWait    time.Duration
	SessionPollMin time.Duration
	SessionPollMax time.Duration
	// ClaimTimeout bounds the time between RelayOpen and the supervisor's
	// RelayStream init.
	ClaimTimeout time.Duration
	// FirstMessageTimeout bounds the wait for SupervisorHello on
	// ConnectSupervisor and for the init frame on RelayStream.
	FirstMessageTimeout  time.Duration
	MaxPending           int
	MaxPendingPerSandbox int
	// SandboxExists is consulted before a session is accepted. An error
	// of kind errdefs.ErrNotFound refuses with NotFound "sandbox not found";
	// other errors are returned as they are. Nil accepts every sandbox.
	SandboxExists func(ctx context.Context, sandboxID string) error
	// OnSessionChange is called when a sandbox gains a session (connected,
	// also when a newer session supersedes the old one) or loses its last
	// one. Calls are serialized and ordered; the hook must not call back
	// into the Registry's blocking methods.
	OnSessionChange func(sandboxID string, connected bool, instanceID string)
	Logger          *slog.Logger
}

func (c *Config) setDefaults() {
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if c.SessionWait <= 0 {
		c.SessionWait = DefaultSessionWait
	}
	if c.SessionPollMin <= 0 {
		c.SessionPollMin = DefaultSessionPollMin
	}
	if c.SessionPollMax <= 0 {
		c.SessionPollMax = DefaultSessionPollMax
	}
	if c.ClaimTimeout <= 0 {
		c.ClaimTimeout = DefaultClaimTimeout
	}
	if c.FirstMessageTimeout <= 0 {
		c.FirstMessageTimeout = DefaultFirstMessageTimeout
	}
	if c.MaxPending <= 0 {
		c.MaxPending = DefaultMaxPending
	}
	if c.MaxPendingPerSandbox <= 0 {
		c.MaxPendingPerSandbox = DefaultMaxPendingPerSandbox
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// RelayTarget is what the supervisor dials for a relay: its SSH server
// (SSH true) or a TCP port on its loopback interface.
type RelayTarget struct {
	SSH       bool
	Host      string
	Port      uint32
	ServiceID string
}

// SSHTarget is the supervisor's SSH server.
func SSHTarget() RelayTarget { return RelayTarget{SSH: true} }

// TCPTarget is host:port as seen from inside the sandbox.
func TCPTarget(host string, port uint32) RelayTarget { return RelayTarget{Host: host, Port: port} }

func (t RelayTarget) validate() error {
	if t.SSH {
		return nil
	}
	if t.Host == "" {
		return errdefs.InvalidArgument("relay target host is required")
	}
	if t.Port == 0 || t.Port > 65535 {
		return errdefs.InvalidArgument("relay target port must be between 1 and 65535")
	}
	return nil
}

func (t RelayTarget) message(channelID string) *openshellv1.RelayOpen {
	m := &openshellv1.RelayOpen{ChannelId: channelID, ServiceId: t.ServiceID}
	if t.SSH {
		m.Target = &openshellv1.RelayOpen_Ssh{Ssh: &openshellv1.SshRelayTarget{}}
	} else {
		m.Target = &openshellv1.RelayOpen_Tcp{Tcp: &openshellv1.TcpRelayTarget{Host: t.Host, Port: t.Port}}
	}
	return m
}

// timeoutError reads "relay channel timed out" and maps to DeadlineExceeded.
type timeoutError struct{ msg string }

func (e *timeoutError) Error() string { return e.msg }
func (e *timeoutError) Unwrap() error { return context.DeadlineExceeded }

// ErrRelayTimedOut is returned when the supervisor does not claim a relay
// within the claim timeout. It matches context.DeadlineExceeded.
var ErrRelayTimedOut error = &timeoutError{"relay channel timed out"}

// Registry holds supervisor sessions and pending relays.
type Registry struct {
	cfg Config
	log *slog.Logger

	hookMu sync.Mutex // serializes OnSessionChange

	mu         sync.Mutex
	sessions   map[string]*session // by sandbox id
	pending    map[string]*pending // by channel id
	perSandbox map[string]int
	active     map[string]*Conn // by channel id
	changed    chan struct{}    // closed and replaced when a session registers
	closed     bool

	wg sync.WaitGroup // stream receive goroutines
}

// New returns an empty Registry.
func New(cfg Config) *Registry {
	cfg.setDefaults()
	return &Registry{
		cfg:        cfg,
		log:        cfg.Logger,
		sessions:   map[string]*session{},
		pending:    map[string]*pending{},
		perSandbox: map[string]int{},
		active:     map[string]*Conn{},
		changed:    make(chan struct{}),
	}
}

// Close ends every session and relay and waits for the registry's
// goroutines. Handlers still running return shortly after.
func (r *Registry) Close() {
	r.mu.Lock()
	r.closed = true
	for _, s := range r.sessions {
		s.end()
	}
	for _, c := range r.active {
		_ = c.Close() // Conn.Close never fails
	}
	for id, p := range r.pending {
		r.resolveLocked(id, p, nil, errdefs.Unavailable("gateway is shutting down"))
	}
	r.mu.Unlock()
	r.wg.Wait()
}

// recvFirst receives the first message of a stream within d. On timeout
// the handler returns, which ends the stream and the pending Recv.
func recvFirst[T any](r *Registry, ctx context.Context, d time.Duration, recv func() (T, error), timeoutMsg string) (T, error) {
	type result struct {
		v   T
		err error
	}
	var zero T
	ch := make(chan result, 1)
	if !r.spawn(func() {
		v, err := recv()
		ch <- result{v, err}
	}) {
		return zero, errdefs.Unavailable("gateway is shutting down")
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case res := <-ch:
		return res.v, res.err
	case <-t.C:
		return zero, &timeoutError{timeoutMsg}
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}

// spawn runs f on a goroutine joined by Close, unless the registry is
// closed. Adding under mu keeps Add from racing with Close's Wait.
func (r *Registry) spawn(f func()) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.wg.Go(f)
	return true
}

// Connected reports whether sandboxID has a live session and its
// supervisor instance id.
func (r *Registry) Connected(sandboxID string) (instanceID string, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.sessions[sandboxID]
	if !ok {
		return "", false
	}
	return s.instanceID, true
}

// PendingCount returns the number of relays waiting for a supervisor.
func (r *Registry) PendingCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.pending)
}

type session struct {
	id         string
	sandboxID  string
	instanceID string
	stream     openshellv1.OpenShell_ConnectSupervisorServer

	sendMu   sync.Mutex
	lastSent time.Time // guarded by sendMu
	done     chan struct{}
	doneOnce sync.Once
}

func (s *session) end() { s.doneOnce.Do(func() { close(s.done) }) }

// send writes one message on the session stream; the stream allows one
// sender at a time.
func (s *session) send(m *openshellv1.GatewayMessage) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	select {
	case <-s.done:
		return errdefs.Unavailable("supervisor session disconnected")
	default:
	}
	if err := s.stream.Send(m); err != nil {
		return errdefs.Unavailable("supervisor session disconnected")
	}
	s.lastSent = time.Now()
	return nil
}

// sinceLastSend is how long the gateway has said nothing on the session.
func (s *session) sinceLastSend() time.Duration {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	return time.Since(s.lastSent)
}

func gatewayHeartbeat() *openshellv1.GatewayMessage {
	return &openshellv1.GatewayMessage{Payload: &openshellv1.GatewayMessage_Heartbeat{Heartbeat: &openshellv1.GatewayHeartbeat{}}}
}

type pending struct {
	channelID string
	sandboxID string
	target    RelayTarget
	created   time.Time
	// requester is the span of the call that opened the relay (an exec,
	// SSH or forward RPC); the RelayStream call that claims the channel
	// links its span to it.
	requester trace.SpanContext
	done      chan struct{}
	conn      *Conn
	err       error
}

// HandleConnect is the body of the ConnectSupervisor handler.
// principalSandboxID is the sandbox id of the authenticated principal, or ""
// when the caller is not a sandbox principal. It returns when the session
// ends: the supervisor goes away, a newer session supersedes it, the
// supervisor stays silent for three heartbeat intervals, or the registry
// closes.
func (r *Registry) HandleConnect(stream openshellv1.OpenShell_ConnectSupervisorServer, principalSandboxID string) error {
	ctx := stream.Context()
	first, err := recvFirst(r, ctx, r.cfg.FirstMessageTimeout, stream.Recv, "timed out waiting for SupervisorHello")
	if errors.Is(err, io.EOF) {
		return errdefs.InvalidArgument("stream closed before hello")
	}
	if err != nil {
		return err
	}
	hello := first.GetHello()
	if hello == nil {
		return errdefs.InvalidArgument("expected SupervisorHello")
	}
	sandboxID := hello.GetSandboxId()
	if sandboxID == "" {
		return errdefs.InvalidArgument("sandbox_id is required")
	}
	if principalSandboxID == "" {
		return errdefs.PermissionDenied("supervisor RPCs require a sandbox principal")
	}
	if principalSandboxID != sandboxID {
		return errdefs.PermissionDenied("cross-sandbox access denied: principal does not own this sandbox")
	}
	if r.cfg.SandboxExists != nil {
		if err := r.cfg.SandboxExists(ctx, sandboxID); err != nil {
			if errors.Is(err, errdefs.ErrNotFound) {
				return errdefs.NotFound("sandbox not found")
			}
			return err
		}
	}

	s := &session{
		id:         uuid.NewString(),
		sandboxID:  sandboxID,
		instanceID: hello.GetInstanceId(),
		stream:     stream,
		done:       make(chan struct{}),
	}
	log := r.log.With("sandbox_id", sandboxID, "session_id", s.id, "instance_id", s.instanceID)

	// Register and send SessionAccepted under sendMu so no RelayOpen can
	// overtake the acceptance.
	s.sendMu.Lock()
	replay, err := r.register(s)
	if err != nil {
		s.sendMu.Unlock()
		return err
	}
	err = stream.Send(&openshellv1.GatewayMessage{Payload: &openshellv1.GatewayMessage_SessionAccepted{
		SessionAccepted: &openshellv1.SessionAccepted{
			SessionId:             s.id,
			HeartbeatIntervalSecs: uint32(max(1, r.cfg.HeartbeatInterval/time.Second)),
		},
	}})
	s.lastSent = time.Now()
	s.sendMu.Unlock()
	defer r.unregister(s)
	if err != nil {
		return err
	}
	log.Info("supervisor session accepted", "replayed_relays", len(replay))
	r.notify(s.sandboxID)
	for _, p := range replay {
		if err := s.send(&openshellv1.GatewayMessage{Payload: &openshellv1.GatewayMessage_RelayOpen{RelayOpen: p.target.message(p.channelID)}}); err != nil {
			return err
		}
	}

	msgs := make(chan *openshellv1.SupervisorMessage)
	recvErr := make(chan error, 1)
	if !r.spawn(func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case msgs <- m:
			case <-s.done:
				recvErr <- nil
				return
			case <-ctx.Done():
				recvErr <- ctx.Err()
				return
			}
		}
	}) {
		return errdefs.Unavailable("gateway is shutting down")
	}

	// The gateway answers each supervisor heartbeat and, like upstream,
	// also sends one whenever it has been silent for an interval, so
	// supervisors that only listen see a live session too.
	idle := 3 * r.cfg.HeartbeatInterval
	timer := time.NewTimer(idle)
	defer timer.Stop()
	beat := time.NewTicker(r.cfg.HeartbeatInterval)
	defer beat.Stop()
	for {
		select {
		case <-beat.C:
			if s.sinceLastSend() >= r.cfg.HeartbeatInterval*9/10 {
				if err := s.send(gatewayHeartbeat()); err != nil {
					return err
				}
			}
		case m := <-msgs:
			timer.Reset(idle)
			if err := r.handleSupervisorMessage(s, m); err != nil {
				return err
			}
		case err := <-recvErr:
			if err == nil || errors.Is(err, io.EOF) {
				log.Info("supervisor session ended")
				return nil
			}
			log.Info("supervisor session ended", "err", err)
			return err
		case <-timer.C:
			log.Warn("supervisor session silent for three heartbeat intervals; ending it")
			return errdefs.Unavailable("supervisor heartbeat timed out")
		case <-s.done:
			log.Info("supervisor session superseded or closed")
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (r *Registry) handleSupervisorMessage(s *session, m *openshellv1.SupervisorMessage) error {
	switch p := m.GetPayload().(type) {
	case *openshellv1.SupervisorMessage_Heartbeat:
		return s.send(gatewayHeartbeat())
	case *openshellv1.SupervisorMessage_RelayOpenResult:
		res := p.RelayOpenResult
		if res.GetSuccess() {
			return nil
		}
		msg := res.GetError()
		if msg == "" {
			msg = "unknown error"
		}
		r.failPending(s.sandboxID, res.GetChannelId(), errdefs.Unavailable("relay open failed: "+msg))
	case *openshellv1.SupervisorMessage_RelayClose:
		rc := p.RelayClose
		reason := rc.GetReason()
		if reason == "" {
			reason = "closed by supervisor"
		}
		r.failPending(s.sandboxID, rc.GetChannelId(), errdefs.Unavailable("relay closed: "+reason))
		r.mu.Lock()
		c := r.active[rc.GetChannelId()]
		r.mu.Unlock()
		if c != nil && c.sandboxID == s.sandboxID {
			_ = c.Close() // Conn.Close never fails
		}
	case *openshellv1.SupervisorMessage_Hello:
		return errdefs.InvalidArgument("duplicate SupervisorHello")
	}
	return nil
}

// register makes s the live session of its sandbox and returns the pending
// relays to replay on it.
func (r *Registry) register(s *session) ([]*pending, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, errdefs.Unavailable("gateway is shutting down")
	}
	if old, ok := r.sessions[s.sandboxID]; ok {
		old.end()
	}
	r.sessions[s.sandboxID] = s
	close(r.changed)
	r.changed = make(chan struct{})
	var replay []*pending
	for _, p := range r.pending {
		if p.sandboxID == s.sandboxID {
			replay = append(replay, p)
		}
	}
	return replay, nil
}

func (r *Registry) unregister(s *session) {
	s.end()
	// Wait for a concurrent send to finish before the handler returns.
	s.sendMu.Lock()
	s.sendMu.Unlock() //nolint:staticcheck // empty critical section is the barrier
	r.mu.Lock()
	current := r.sessions[s.sandboxID] == s
	if current {
		delete(r.sessions, s.sandboxID)
	}
	r.mu.Unlock()
	if current {
		r.notify(s.sandboxID)
	}
}

// notify reports the current presence of sandboxID to the hook. Reading the
// state under hookMu keeps the hook's view ordered.
func (r *Registry) notify(sandboxID string) {
	if r.cfg.OnSessionChange == nil {
		return
	}
	r.hookMu.Lock()
	defer r.hookMu.Unlock()
	instance, ok := r.Connected(sandboxID)
	r.cfg.OnSessionChange(sandboxID, ok, instance)
}

func (r *Registry) failPending(sandboxID, channelID string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p, ok := r.pending[channelID]; ok && p.sandboxID == sandboxID {
		r.resolveLocked(channelID, p, nil, err)
	}
}

// resolveLocked removes p from the pending set and wakes its waiter.
func (r *Registry) resolveLocked(channelID string, p *pending, c *Conn, err error) {
	delete(r.pending, channelID)
	if n := r.perSandbox[p.sandboxID] - 1; n > 0 {
		r.perSandbox[p.sandboxID] = n
	} else {
		delete(r.perSandbox, p.sandboxID)
	}
	p.conn, p.err = c, err
	close(p.done)
}

// waitSession returns the live session of sandboxID, waiting up to
// SessionWait with backoff.
func (r *Registry) waitSession(ctx context.Context, sandboxID string) (*session, error) {
	deadline := time.NewTimer(r.cfg.SessionWait)
	defer deadline.Stop()
	backoff := r.cfg.SessionPollMin
	for {
		r.mu.Lock()
		s, ok := r.sessions[sandboxID]
		changed := r.changed
		closed := r.closed
		r.mu.Unlock()
		if closed {
			return nil, errdefs.Unavailable("gateway is shutting down")
		}
		if ok {
			return s, nil
		}
		poll := time.NewTimer(backoff)
		select {
		case <-changed:
		case <-poll.C:
		case <-deadline.C:
			poll.Stop()
			return nil, errdefs.Unavailable(fmt.Sprintf("supervisor session for sandbox %s is not connected", sandboxID))
		case <-ctx.Done():
			poll.Stop()
			return nil, ctx.Err()
		}
		poll.Stop()
		backoff = min(2*backoff, r.cfg.SessionPollMax)
	}
}

// OpenRelay asks the supervisor of sandboxID to open target and returns the
// relayed byte stream. It waits up to SessionWait for a session and up to
// ClaimTimeout for the supervisor's RelayStream. The caller must Close the
// returned conn. Errors: Unavailable (no session, supervisor refused the
// target), ResourceExhausted (pending limits), ErrRelayTimedOut, InvalidArgument
// (bad target), or ctx's error.
func (r *Registry) OpenRelay(ctx context.Context, sandboxID string, target RelayTarget) (*Conn, error) {
	if err := target.validate(); err != nil {
		return nil, err
	}
	if sandboxID == "" {
		return nil, errdefs.InvalidArgument("sandbox_id is required")
	}
	s, err := r.waitSession(ctx, sandboxID)
	if err != nil {
		return nil, err
	}
	p := &pending{
		channelID: uuid.NewString(),
		sandboxID: sandboxID,
		target:    target,
		created:   time.Now(),
		requester: trace.SpanContextFromContext(ctx),
		done:      make(chan struct{}),
	}
	r.mu.Lock()
	switch {
	case len(r.pending) >= r.cfg.MaxPending:
		r.mu.Unlock()
		return nil, errdefs.ResourceExhausted("too many pending relays")
	case r.perSandbox[sandboxID] >= r.cfg.MaxPendingPerSandbox:
		r.mu.Unlock()
		return nil, errdefs.ResourceExhausted("too many pending relays for this sandbox")
	}
	r.pending[p.channelID] = p
	r.perSandbox[sandboxID]++
	r.mu.Unlock()

	if err := s.send(&openshellv1.GatewayMessage{Payload: &openshellv1.GatewayMessage_RelayOpen{RelayOpen: target.message(p.channelID)}}); err != nil {
		// A superseding session may already have replayed the relay;
		// otherwise the claim timeout ends the wait.
		r.log.Debug("relay open not sent on session", "sandbox_id", sandboxID, "err", err)
	}

	timer := time.NewTimer(r.cfg.ClaimTimeout)
	defer timer.Stop()
	var waitErr error
	select {
	case <-p.done:
	case <-timer.C:
		waitErr = ErrRelayTimedOut
	case <-ctx.Done():
		waitErr = ctx.Err()
	}
	if waitErr != nil {
		r.mu.Lock()
		if _, still := r.pending[p.channelID]; still {
			r.resolveLocked(p.channelID, p, nil, waitErr)
			r.mu.Unlock()
			return nil, waitErr
		}
		r.mu.Unlock()
		<-p.done // claimed concurrently
		if p.conn != nil && ctx.Err() != nil {
			_ = p.conn.Close() // Conn.Close never fails
			return nil, ctx.Err()
		}
	}
	if p.err != nil {
		return nil, p.err
	}
	return p.conn, nil
}

// HandleRelayStream is the body of the RelayStream handler.
// principalSandboxID is the authenticated sandbox id ("" for non-sandbox
// principals). It claims the pending relay named by the init frame and
// bridges the stream's bytes to the Conn returned by OpenRelay until either
// side closes.
func (r *Registry) HandleRelayStream(stream openshellv1.OpenShell_RelayStreamServer, principalSandboxID string) error {
	ctx := stream.Context()
	first, err := recvFirst(r, ctx, r.cfg.FirstMessageTimeout, stream.Recv, "timed out waiting for the first RelayFrame")
	if errors.Is(err, io.EOF) {
		return errdefs.InvalidArgument("first RelayFrame must be init with non-empty channel_id")
	}
	if err != nil {
		return err
	}
	channelID := first.GetInit().GetChannelId()
	if channelID == "" {
		return errdefs.InvalidArgument("first RelayFrame must be init with non-empty channel_id")
	}
	if principalSandboxID == "" {
		return errdefs.PermissionDenied("supervisor RPCs require a sandbox principal")
	}

	r.mu.Lock()
	p, ok := r.pending[channelID]
	if !ok {
		r.mu.Unlock()
		return errdefs.NotFound("unknown or expired relay channel")
	}
	if p.sandboxID != principalSandboxID {
		r.mu.Unlock()
		r.log.Info("relay stream: rejecting cross-sandbox claim", "channel_id", channelID, "sandbox_id", p.sandboxID)
		return errdefs.PermissionDenied("cross-sandbox access denied: principal does not own this sandbox")
	}
	if time.Since(p.created) > r.cfg.ClaimTimeout {
		r.resolveLocked(channelID, p, nil, ErrRelayTimedOut)
		r.mu.Unlock()
		return ErrRelayTimedOut
	}
	c := newConn(channelID, p.sandboxID)
	r.active[channelID] = c
	r.resolveLocked(channelID, p, c, nil)
	r.mu.Unlock()
	if p.requester.IsValid() {
		// RelayOpen carries no trace context (OpenShell's wire), so the
		// supervisor's call continues its own trace; the link joins it
		// to the RPC that asked for the relay.
		trace.SpanFromContext(ctx).AddLink(trace.Link{SpanContext: p.requester})
	}
	defer func() {
		r.mu.Lock()
		delete(r.active, channelID)
		r.mu.Unlock()
	}()

	return r.bridge(ctx, stream, c)
}

func (r *Registry) bridge(ctx context.Context, stream openshellv1.OpenShell_RelayStreamServer, c *Conn) (err error) {
	defer func() { c.finish(err) }()
	if !r.spawn(func() {
		var rerr error
		defer func() {
			c.readErr = rerr
			close(c.readCh)
		}()
		for {
			f, err := stream.Recv()
			if err != nil {
				if errors.Is(err, io.EOF) {
					rerr = io.EOF
				} else {
					rerr = fmt.Errorf("relay stream: %w", err)
				}
				return
			}
			d := f.GetData()
			if len(d) == 0 {
				continue
			}
			select {
			case c.readCh <- d:
			case <-c.closed:
				rerr = io.EOF
				return
			case <-ctx.Done():
				rerr = ctx.Err()
				return
			}
		}
	}) {
		c.readErr = net.ErrClosed
		close(c.readCh)
		return errdefs.Unavailable("gateway is shutting down")
	}
	for {
		select {
		case b := <-c.writeCh:
			if err := stream.Send(&openshellv1.RelayFrame{Payload: &openshellv1.RelayFrame_Data{Data: b}}); err != nil {
				return err
			}
		case <-c.closed:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// PrincipalSandboxID returns the sandbox id the handlers pass to
// HandleConnect and HandleRelayStream: the id of a sandbox principal that
// authenticated with a sandbox JWT, "" for anyone else (users, and the
// ServiceAccount bootstrap principal, which may only call IssueSandboxToken).
func PrincipalSandboxID(ctx context.Context) string {
	p, ok := auth.FromContext(ctx)
	if !ok || !p.IsSandbox() || p.Source != auth.SourceSandboxJWT {
		return ""
	}
	return p.SandboxID
}
