// Package sshexec runs commands in a sandbox over a relayed byte stream to
// the supervisor's SSH server: the gateway side of ExecSandbox and
// ExecSandboxInteractive.
//
// The SSH client logs in as user "sandbox" with the "none" method and
// accepts any host key: the stream is already authenticated and bound to one
// sandbox by the relay, the SSH layer only provides channels, PTYs and exit
// codes. Exec is safe for concurrent use on distinct connections.
package sshexec

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"slices"
	"strings"
	"sync"
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

// lockedWriter serializes writes to w under mu.
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Exec runs req over conn (a stream to the supervisor's SSH server) and
// returns the command's exit code: its exit status, 128+n when killed by
// signal n, TimeoutExitCode on timeout. Exec closes conn before returning.
// A cancelled ctx ends the session and returns ctx's error.
func Exec(ctx context.Context, conn net.Conn, req Request) (int, error) {
	defer conn.Close()
	if len(req.Command) == 0 && !req.TTY {
		return -1, errdefs.InvalidArgument("command is required")
	}
	if _, err := BuildCommand(req.Command, req.Env, req.Workdir); err != nil {
		return -1, err
	}
	client, err := Dial(ctx, conn)
	if err != nil {
		return -1, err
	}
	defer func() { _ = client.Close() }()
	return Run(ctx, client, req)
}

// Dial runs the SSH handshake over conn (a relay to the supervisor's SSH
// server) and returns a client that can run many sessions. Closing the
// client closes conn.
func Dial(ctx context.Context, conn net.Conn) (*ssh.Client, error) {
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
	return ssh.NewClient(sc, chans, reqs), nil
}

// ErrSession marks a failure to open a session on an established client:
// the client is unusable and a caller holding it should dial again.
var ErrSession = errors.New("ssh session could not be opened")

// Run executes req in a new session of client. The client stays open.
func Run(ctx context.Context, client *ssh.Client, req Request) (int, error) {
	if len(req.Command) == 0 && !req.TTY {
		return -1, errdefs.InvalidArgument("command is required")
	}
	var cmd string
	var err error
	if len(req.Command) > 0 {
		cmd, err = BuildCommand(req.Command, req.Env, req.Workdir)
	} else {
		_, err = BuildCommand(nil, req.Env, "")
		if err == nil && req.Workdir != "" {
			cmd = "cd " + Quote(req.Workdir) + ` && exec "${SHELL:-/bin/sh}" -l`
		}
	}
	if err != nil {
		return -1, err
	}
	sess, err := client.NewSession()
	if err != nil {
		return -1, fmt.Errorf("%w: %v: %w", ErrSession, err, errdefs.ErrUnavailable) //nolint:errorlint // classified by ErrSession and ErrUnavailable only; the ssh error is detail
	}
	defer func() { _ = sess.Close() }()

	if len(req.Command) == 0 {
		keys := make([]string, 0, len(req.Env))
		for k := range req.Env {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			if err := sess.Setenv(k, req.Env[k]); err != nil {
				return -1, errdefs.Unavailable(fmt.Sprintf("ssh env request: %v", err))
			}
		}
	}
	var mu sync.Mutex
	if req.Stdout != nil {
		sess.Stdout = lockedWriter{&mu, req.Stdout}
	}
	if req.Stderr != nil {
		sess.Stderr = lockedWriter{&mu, req.Stderr}
	}
	var stdinDone chan struct{}
	if req.Stdin != nil {
		w, err := sess.StdinPipe()
		if err != nil {
			return -1, err
		}
		stdinDone = make(chan struct{})
		go func() {
			defer close(stdinDone)
			io.Copy(w, req.Stdin) //nolint:errcheck // a closed session ends the copy
			w.Close()
		}()
	}

	if req.TTY {
		cols, rows := req.Cols, req.Rows
		if cols == 0 {
			cols = 80
		}
		if rows == 0 {
			rows = 24
		}
		modes := ssh.TerminalModes{ssh.ECHO: 1, ssh.TTY_OP_ISPEED: 38400, ssh.TTY_OP_OSPEED: 38400}
		if err := sess.RequestPty("xterm-256color", int(rows), int(cols), modes); err != nil {
			return -1, errdefs.Unavailable(fmt.Sprintf("ssh pty request: %v", err))
		}
	}
	if cmd == "" {
		err = sess.Shell()
	} else {
		err = sess.Start(cmd)
	}
	if err != nil {
		return -1, errdefs.Unavailable(fmt.Sprintf("ssh start: %v", err))
	}

	waitErr := make(chan error, 1)
	go func() { waitErr <- sess.Wait() }()

	var timeout <-chan time.Time
	if req.Timeout > 0 {
		t := time.NewTimer(req.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	code, err := func() (int, error) {
		for {
			select {
			case err := <-waitErr:
				return exitCode(err)
			case ws, ok := <-req.Resize:
				if !ok {
					req.Resize = nil
					continue
				}
				if err := sess.WindowChange(int(ws.Rows), int(ws.Cols)); err != nil && !errors.Is(err, io.EOF) {
					return -1, fmt.Errorf("window change: %w", err)
				}
			case <-timeout:
				_ = sess.Signal(ssh.SIGKILL) // closing the session below ends it anyway
				_ = sess.Close()
				<-waitErr //nolint:errcheck // joined only: the timeout decides the result
				return TimeoutExitCode, nil
			case <-ctx.Done():
				_ = sess.Signal(ssh.SIGKILL) // closing the session below ends it anyway
				_ = sess.Close()
				<-waitErr //nolint:errcheck // joined only: cancellation decides the result
				return -1, ctx.Err()
			}
		}
	}()
	_ = sess.Close() // the command has finished; its result is already known
	if stdinDone != nil {
		if c, ok := req.Stdin.(io.Closer); ok {
			c.Close()
		}
		<-stdinDone
	}
	return code, err
}

func exitCode(err error) (int, error) {
	if err == nil {
		return 0, nil
	}
	var ee *ssh.ExitError
	if errors.As(err, &ee) {
		return ee.ExitStatus(), nil
	}
	var missing *ssh.ExitMissingError
	if errors.As(err, &missing) {
		return -1, errdefs.Unavailable("sandbox closed the session without an exit status")
	}
	return -1, errdefs.Unavailable(fmt.Sprintf("ssh session: %v", err))
}
