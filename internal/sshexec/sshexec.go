// Package sshexec runs commands in a sandbox over a relayed byte stream to
// the supervisor's SSH server: the gateway side of ExecSandbox and
// ExecSandboxInteractive.
//
// The SSH client logs in as user "sandbox" with the "none" method and
// accepts any host key: the stream is already authenticated and bound to one
// sandbox by the relay, the SSH layer only provides channels, PTYs and exit
// codes. Exec is safe for concurrent use on distinct connections.
//
// Liveness: the client sends an SSH keepalive every KeepaliveInterval; one
// left unanswered for KeepaliveTimeout (a wedged or orphaned relay) closes
// the connection and every exec on it returns errdefs.ErrUnavailable. An
// exec never ends because its output is idle. After the exit status, the
// wait for the channel close that should follow is bounded by CloseWait.
package sshexec

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/openshell-go/openshell/internal/errdefs"
)

// TimeoutExitCode is the exit code reported when Request.Timeout expires.
const TimeoutExitCode = 124

// User is the SSH user the supervisor's server expects.
const User = "sandbox"

// WindowSize is a terminal size in character cells.
type WindowSize struct{ Cols, Rows uint32 }

// Request describes one command execution.
type Request struct {
	// Command is the argv. Empty means the login shell (interactive only).
	Command []string
	// Env is exported to the command; keys must match ^[A-Za-z_][A-Za-z0-9_]*$.
	Env map[string]string
	// Workdir, when set, is entered before running the command.
	Workdir string
	// Stdin is copied to the command's standard input, which is closed at
	// Stdin's EOF. Nil means an empty stdin. Exec waits for the copy to end
	// before returning; when Stdin also implements io.Closer (an io.Pipe
	// fed by an interactive stream) Exec closes it once the command ends.
	Stdin io.Reader
	// TTY requests a pseudo terminal (TERM=xterm-256color) of Cols x Rows.
	TTY        bool
	Cols, Rows uint32
	// Resize delivers window changes (interactive sessions).
	Resize <-chan WindowSize
	// Timeout, when positive, kills the command after that long and makes
	// Exec report TimeoutExitCode.
	Timeout time.Duration
	// Stdout and Stderr receive output chunks as they arrive. They are never
	// called concurrently with each other. Nil discards. With TTY, all output
	// arrives on Stdout.
	Stdout, Stderr io.Writer
}

var envKey = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// BuildCommand returns the remote shell command for argv, env and workdir:
// sorted K=V assignments followed by the shell-quoted argv, prefixed with
// "cd <workdir> && " when workdir is set. Invalid env keys are
// InvalidArgument.
func BuildCommand(argv []string, env map[string]string, workdir string) (string, error) {
	keys := make([]string, 0, len(env))
	for k := range env {
		if !envKey.MatchString(k) {
			return "", errdefs.InvalidArgument(fmt.Sprintf("invalid environment variable name %q: must match ^[A-Za-z_][A-Za-z0-9_]*$", k))
		}
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	if workdir != "" {
		b.WriteString("cd ")
		b.WriteString(Quote(workdir))
		b.WriteString(" && ")
	}
	for _, k := range keys {
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(Quote(env[k]))
		b.WriteByte(' ')
	}
	for i, a := range argv {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(Quote(a))
	}
	return strings.TrimSuffix(b.String(), " "), nil
}

// Quote returns s quoted for a POSIX shell.
func Quote(s string) string {
	if s == "" {
		return "''"
	}
	safe := true
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./=:,+@%", r)) {
			safe = false
			break
		}
	}
	if safe {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// ClientConfig is the SSH client configuration used for relayed sessions.
func ClientConfig() *ssh.ClientConfig {
	return &ssh.ClientConfig{
		User: User,
		// The relay already authenticates and scopes the stream; the
		// supervisor generates its host key at start, so there is
		// nothing to pin.
		HostKeyCallback: ssh.InsecureIgnoreHostKey(), //nolint:gosec // see above
		Timeout:         10 * time.Second,
	}
}

// Liveness bounds how long a wedged or orphaned relay can hold an exec.
// Zero fields take the defaults.
type Liveness struct {
	// KeepaliveInterval is how often the client sends an SSH keepalive
	// (a keepalive@openssh.com global request) while connected.
	KeepaliveInterval time.Duration
	// KeepaliveTimeout is how long a keepalive may go unanswered before
	// the connection is closed and its execs fail Unavailable.
	KeepaliveTimeout time.Duration
	// CloseWait bounds the wait for the channel close that follows a
	// command's exit status (a background process holding the output
	// open, or a server that never closes the channel).
	CloseWait time.Duration
}

// Defaults of Liveness.
const (
	DefaultKeepaliveInterval = 15 * time.Second
	DefaultKeepaliveTimeout  = 15 * time.Second
	DefaultCloseWait         = 2 * time.Second
)

func (l Liveness) withDefaults() Liveness {
	if l.KeepaliveInterval <= 0 {
		l.KeepaliveInterval = DefaultKeepaliveInterval
	}
	if l.KeepaliveTimeout <= 0 {
		l.KeepaliveTimeout = DefaultKeepaliveTimeout
	}
	if l.CloseWait <= 0 {
		l.CloseWait = DefaultCloseWait
	}
	return l
}

// Client is an SSH connection to a supervisor over a relay, kept alive
// with SSH keepalives. An exec ends only on its exit status, an
// unanswered keepalive (the relay is wedged or orphaned), a timeout or
// cancellation, never because its output is idle.
type Client struct {
	*ssh.Client
	liveness Liveness
	// dead holds why the client closed itself (an unanswered keepalive).
	dead atomic.Pointer[error]
}

// keepalive probes the connection until it ends; an unanswered probe
// closes it.
func (c *Client) keepalive() {
	done := make(chan struct{})
	go func() { _ = c.Wait(); close(done) }()
	t := time.NewTicker(c.liveness.KeepaliveInterval)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		reply := make(chan struct{})
		go func() {
			// Any reply counts (servers answer false to unknown
			// requests); an error means the connection is gone.
			_, _, _ = c.SendRequest("keepalive@openssh.com", true, nil)
			close(reply)
		}()
		timer := time.NewTimer(c.liveness.KeepaliveTimeout)
		select {
		case <-reply:
			timer.Stop()
		case <-done:
			timer.Stop()
			return
		case <-timer.C:
			err := errdefs.Unavailable(fmt.Sprintf("sandbox relay stopped answering: no reply to an SSH keepalive within %s", c.liveness.KeepaliveTimeout))
			c.dead.Store(&err)
			_ = c.Close()
			<-reply
			return
		}
	}
}

// deadErr reports why the client closed itself, or nil.
func (c *Client) deadErr() error {
	if p := c.dead.Load(); p != nil {
		return *p
	}
	return nil
}

// gatedWriter serializes writes to w under mu and drops them once the
// exec has returned (output that arrives after the bounded close wait).
type gatedWriter struct {
	mu     *sync.Mutex
	closed *bool
	w      io.Writer
}

func (g gatedWriter) Write(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if *g.closed {
		return len(p), nil
	}
	return g.w.Write(p)
}

// Exec runs req over conn (a stream to the supervisor's SSH server) and
// returns the command's exit code: its exit status, 128+n when killed by
// signal n, TimeoutExitCode on timeout. Exec closes conn before returning.
// A cancelled ctx ends the session and returns ctx's error; a relay that
// stops answering keepalives ends it with errdefs.ErrUnavailable.
func Exec(ctx context.Context, conn net.Conn, req Request) (int, error) {
	return ExecWith(ctx, conn, req, Liveness{})
}

// ExecWith is Exec with the connection's liveness bounds.
func ExecWith(ctx context.Context, conn net.Conn, req Request, lv Liveness) (int, error) {
	defer conn.Close()
	if len(req.Command) == 0 && !req.TTY {
		return -1, errdefs.InvalidArgument("command is required")
	}
	if _, err := BuildCommand(req.Command, req.Env, req.Workdir); err != nil {
		return -1, err
	}
	client, err := Dial(ctx, conn, lv)
	if err != nil {
		return -1, err
	}
	defer func() { _ = client.Close() }()
	return Run(ctx, client, req)
}

// Dial runs the SSH handshake over conn (a relay to the supervisor's SSH
// server) and returns a client that can run many sessions and sends
// keepalives as lv says. Closing the client closes conn.
func Dial(ctx context.Context, conn net.Conn, lv Liveness) (*Client, error) {
	// Tear the connection down if ctx ends during the handshake.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	sc, chans, reqs, err := ssh.NewClientConn(conn, User, ClientConfig())
	if err != nil {
		conn.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, errdefs.Unavailable(fmt.Sprintf("ssh handshake with sandbox: %v", err))
	}
	c := &Client{Client: ssh.NewClient(sc, chans, reqs), liveness: lv.withDefaults()}
	go c.keepalive()
	return c, nil
}

// ErrSession marks a failure to open a session on an established client:
// the client is unusable and a caller holding it should dial again.
var ErrSession = errors.New("ssh session could not be opened")

// Session request payloads (RFC 4254 §6).
type (
	setenvMsg struct{ Name, Value string }
	execMsg   struct{ Command string }
	signalMsg struct{ Signal string }
	ptyMsg    struct {
		Term                         string
		Columns, Rows, Width, Height uint32
		Modelist                     string
	}
	windowMsg     struct{ Columns, Rows, Width, Height uint32 }
	exitSignalMsg struct {
		Signal     string
		CoreDumped bool
		Error      string
		Lang       string
	}
)

// signalNumbers maps RFC 4254 signal names to numbers (exit code 128+n).
var signalNumbers = map[string]int{
	"ABRT": 6, "ALRM": 14, "FPE": 8, "HUP": 1, "ILL": 4, "INT": 2, "KILL": 9,
	"PIPE": 13, "QUIT": 3, "SEGV": 11, "TERM": 15, "USR1": 10, "USR2": 12,
}

// remoteCommand is the shell command of req ("" for the login shell).
func remoteCommand(req Request) (string, error) {
	if len(req.Command) > 0 {
		return BuildCommand(req.Command, req.Env, req.Workdir)
	}
	if _, err := BuildCommand(nil, req.Env, ""); err != nil {
		return "", err
	}
	if req.Workdir != "" {
		return "cd " + Quote(req.Workdir) + ` && exec "${SHELL:-/bin/sh}" -l`, nil
	}
	return "", nil
}

// Run executes req in a new session of client. The client stays open.
func Run(ctx context.Context, client *Client, req Request) (int, error) {
	if len(req.Command) == 0 && !req.TTY {
		return -1, errdefs.InvalidArgument("command is required")
	}
	cmd, err := remoteCommand(req)
	if err != nil {
		return -1, err
	}
	ch, reqs, err := client.OpenChannel("session", nil)
	if err != nil {
		if dead := client.deadErr(); dead != nil {
			return -1, fmt.Errorf("%w: %w", ErrSession, dead)
		}
		return -1, fmt.Errorf("%w: %v: %w", ErrSession, err, errdefs.ErrUnavailable) //nolint:errorlint // classified by ErrSession and ErrUnavailable only; the ssh error is detail
	}
	defer func() { _ = ch.Close() }()
	s := &session{client: client, ch: ch, reqs: reqs, exited: make(chan struct{}), channelEnd: make(chan struct{})}
	// Requests from the server (exit-status, exit-signal, keepalives) are
	// read from the start, so none of them blocks the connection.
	go s.serveRequests()
	if err := s.setup(req, cmd); err != nil {
		if dead := client.deadErr(); dead != nil {
			return -1, dead
		}
		return -1, err
	}
	return s.run(ctx, req)
}

// session is one exec channel.
type session struct {
	client *Client
	ch     ssh.Channel
	reqs   <-chan *ssh.Request

	// exited is closed when the exit status (or signal) arrives or the
	// channel closes; channelEnd when the channel closes.
	exited     chan struct{}
	exitOnce   sync.Once
	channelEnd chan struct{}

	mu        sync.Mutex
	status    int
	signal    string
	gotStatus bool
}

func (s *session) markExited() { s.exitOnce.Do(func() { close(s.exited) }) }

func (s *session) serveRequests() {
	defer close(s.channelEnd)
	defer s.markExited()
	for r := range s.reqs {
		switch r.Type {
		case "exit-status":
			if len(r.Payload) >= 4 {
				s.mu.Lock()
				s.status, s.gotStatus = int(binary.BigEndian.Uint32(r.Payload)), true
				s.mu.Unlock()
				s.markExited()
			}
		case "exit-signal":
			var m exitSignalMsg
			if ssh.Unmarshal(r.Payload, &m) == nil {
				s.mu.Lock()
				s.signal = m.Signal
				s.mu.Unlock()
				s.markExited()
			}
		default:
			if r.WantReply {
				_ = r.Reply(false, nil)
			}
		}
	}
}

func (s *session) request(name string, payload any) error {
	var b []byte
	if payload != nil {
		b = ssh.Marshal(payload)
	}
	ok, err := s.ch.SendRequest(name, true, b)
	if err == nil && !ok {
		err = errors.New("refused")
	}
	if err != nil {
		return errdefs.Unavailable(fmt.Sprintf("ssh %s request: %v", name, err))
	}
	return nil
}

func (s *session) setup(req Request, cmd string) error {
	if len(req.Command) == 0 {
		keys := make([]string, 0, len(req.Env))
		for k := range req.Env {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			if err := s.request("env", &setenvMsg{Name: k, Value: req.Env[k]}); err != nil {
				return err
			}
		}
	}
	if req.TTY {
		cols, rows := req.Cols, req.Rows
		if cols == 0 {
			cols = 80
		}
		if rows == 0 {
			rows = 24
		}
		var modes []byte
		for _, m := range []struct {
			k byte
			v uint32
		}{{ssh.ECHO, 1}, {ssh.TTY_OP_ISPEED, 38400}, {ssh.TTY_OP_OSPEED, 38400}} {
			modes = append(modes, m.k)
			modes = binary.BigEndian.AppendUint32(modes, m.v)
		}
		modes = append(modes, 0) // TTY_OP_END
		if err := s.request("pty-req", &ptyMsg{Term: "xterm-256color", Columns: cols, Rows: rows, Width: cols * 8, Height: rows * 8, Modelist: string(modes)}); err != nil {
			return err
		}
	}
	if cmd == "" {
		return s.request("shell", nil)
	}
	return s.request("exec", &execMsg{Command: cmd})
}

// run pumps stdin and output until the command's result is known.
func (s *session) run(ctx context.Context, req Request) (int, error) {
	var mu sync.Mutex
	closed := false
	stdout, stderr := io.Discard, io.Discard
	if req.Stdout != nil {
		stdout = req.Stdout
	}
	if req.Stderr != nil {
		stderr = req.Stderr
	}
	var copies sync.WaitGroup
	copies.Go(func() { _, _ = io.Copy(gatedWriter{&mu, &closed, stdout}, s.ch) })
	copies.Go(func() { _, _ = io.Copy(gatedWriter{&mu, &closed, stderr}, s.ch.Stderr()) })
	var stdinDone chan struct{}
	if req.Stdin != nil {
		stdinDone = make(chan struct{})
		go func() {
			defer close(stdinDone)
			io.Copy(s.ch, req.Stdin) //nolint:errcheck // a closed channel ends the copy
			_ = s.ch.CloseWrite()
		}()
	} else {
		_ = s.ch.CloseWrite()
	}
	defer func() {
		_ = s.ch.Close()
		mu.Lock()
		closed = true
		mu.Unlock()
		if stdinDone != nil {
			if c, ok := req.Stdin.(io.Closer); ok {
				c.Close()
			}
			<-stdinDone
		}
	}()

	var timeout <-chan time.Time
	if req.Timeout > 0 {
		t := time.NewTimer(req.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	for {
		select {
		case <-s.exited:
			return s.result(&copies)
		case ws, ok := <-req.Resize:
			if !ok {
				req.Resize = nil
				continue
			}
			b := ssh.Marshal(&windowMsg{Columns: ws.Cols, Rows: ws.Rows, Width: ws.Cols * 8, Height: ws.Rows * 8})
			if _, err := s.ch.SendRequest("window-change", false, b); err != nil && !errors.Is(err, io.EOF) {
				return -1, fmt.Errorf("window change: %w", err)
			}
		case <-timeout:
			_, _ = s.ch.SendRequest("signal", false, ssh.Marshal(&signalMsg{Signal: string(ssh.SIGKILL)}))
			return TimeoutExitCode, nil
		case <-ctx.Done():
			_, _ = s.ch.SendRequest("signal", false, ssh.Marshal(&signalMsg{Signal: string(ssh.SIGKILL)}))
			return -1, ctx.Err()
		}
	}
}

// result waits, at most CloseWait, for the channel close and the output
// that follows the exit status, then reports the exit code.
func (s *session) result(copies *sync.WaitGroup) (int, error) {
	outputDone := make(chan struct{})
	go func() { copies.Wait(); close(outputDone) }()
	t := time.NewTimer(s.client.liveness.CloseWait)
	defer t.Stop()
	select {
	case <-s.channelEnd:
		select {
		case <-outputDone:
		case <-t.C:
		}
	case <-t.C:
	}
	s.mu.Lock()
	status, signal, gotStatus := s.status, s.signal, s.gotStatus
	s.mu.Unlock()
	switch {
	case gotStatus:
		return status, nil
	case signal != "":
		return 128 + signalNumbers[signal], nil
	}
	if err := s.client.deadErr(); err != nil {
		return -1, err
	}
	return -1, errdefs.Unavailable("sandbox closed the session without an exit status")
}
