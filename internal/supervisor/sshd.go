package supervisor

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync"
	"syscall"

	"github.com/creack/pty"
	"golang.org/x/crypto/ssh"
)

// sshServer is the supervisor's SSH server. It listens only on a Unix
// socket inside the sandbox, reached through relays; the relay already
// authenticated the caller, so it accepts user "sandbox" without
// authentication.
type sshServer struct {
	log     *slog.Logger
	config  *ssh.ServerConfig
	procs   *procTable
	agents  *agentLauncher
	workdir string
	env     func() []string // base environment of sessions
	shell   []string        // login shell argv

	wg    sync.WaitGroup
	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

func newSSHServer(log *slog.Logger, procs *procTable, agents *agentLauncher, workdir string, env func() []string, shell []string) (*sshServer, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		return nil, err
	}
	cfg := &ssh.ServerConfig{
		NoClientAuth: true,
		NoClientAuthCallback: func(md ssh.ConnMetadata) (*ssh.Permissions, error) {
			if md.User() != "sandbox" {
				return nil, fmt.Errorf("unknown user %q", md.User())
			}
			return nil, nil
		},
	}
	cfg.AddHostKey(signer)
	return &sshServer{log: log, config: cfg, procs: procs, agents: agents, workdir: workdir, env: env, shell: shell}, nil
}

// listenUnix listens on path with mode 0600, replacing a stale socket.
func listenUnix(path string) (net.Listener, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	old := syscall.Umask(0o177)
	l, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// serve accepts connections until l is closed, then closes every open
// connection (ending its commands) and waits for all sessions.
func (s *sshServer) serve(l net.Listener) {
	defer s.wg.Wait()
	for {
		c, err := l.Accept()
		if err != nil {
			s.mu.Lock()
			for c := range s.conns {
				c.Close()
			}
			s.conns = nil
			s.mu.Unlock()
			return
		}
		s.mu.Lock()
		if s.conns == nil {
			s.conns = map[net.Conn]struct{}{}
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Go(func() {
			s.handleConn(c)
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
		})
	}
}

// ServeConn serves one already established connection.
func (s *sshServer) handleConn(c net.Conn) {
	defer c.Close()
	sc, chans, reqs, err := ssh.NewServerConn(c, s.config)
	if err != nil {
		s.log.Debug("ssh handshake failed", "err", err)
		return
	}
	defer func() { _ = sc.Close() }()
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { ssh.DiscardRequests(reqs) })
	for nc := range chans {
		switch nc.ChannelType() {
		case "session":
			ch, creqs, err := nc.Accept()
			if err != nil {
				continue
			}
			wg.Go(func() { s.session(ch, creqs) })
		case "direct-tcpip":
			wg.Go(func() { s.directTCPIP(nc) })
		default:
			nc.Reject(ssh.UnknownChannelType, "unsupported channel type") //nolint:errcheck
		}
	}
}

type ptyReq struct {
	term       string
	cols, rows uint32
}

// session serves one "session" channel: env, pty-req, window-change, exec,
// shell and signal requests.
func (s *sshServer) session(ch ssh.Channel, reqs <-chan *ssh.Request) {
	defer func() { _ = ch.Close() }()
	var (
		env     []string
		pt      *ptyReq
		ptmx    *os.File
		started *proc
		exited  = make(chan struct{})
		mu      sync.Mutex
	)
	var runWG sync.WaitGroup
	defer func() {
		mu.Lock()
		p := started
		mu.Unlock()
		if p != nil {
			select {
			case <-exited:
			default:
				// The client went away: end the command.
				s.procs.signalGroup(p, syscall.SIGHUP)
				s.procs.signalGroup(p, syscall.SIGKILL)
			}
		}
		runWG.Wait()
	}()
	for req := range reqs {
		ok := false
		switch req.Type {
		case "env":
			var kv struct{ Name, Value string }
			if ssh.Unmarshal(req.Payload, &kv) == nil {
				env = append(env, kv.Name+"="+kv.Value)
				ok = true
			}
		case "pty-req":
			var r struct {
				Term          string
				Cols, Rows    uint32
				Width, Height uint32
				Modes         string
			}
			if ssh.Unmarshal(req.Payload, &r) == nil && started == nil {
				pt = &ptyReq{term: r.Term, cols: r.Cols, rows: r.Rows}
				ok = true
			}
		case "window-change":
			var r struct{ Cols, Rows, Width, Height uint32 }
			if ssh.Unmarshal(req.Payload, &r) == nil {
				mu.Lock()
				if ptmx != nil {
					pty.Setsize(ptmx, &pty.Winsize{Cols: uint16(r.Cols), Rows: uint16(r.Rows)}) //nolint:errcheck
				} else if pt != nil {
					pt.cols, pt.rows = r.Cols, r.Rows
				}
				mu.Unlock()
				ok = true
			}
		case "signal":
			var r struct{ Signal string }
			mu.Lock()
			p := started
			mu.Unlock()
			if ssh.Unmarshal(req.Payload, &r) == nil && p != nil {
				if sig, known := signalsByName[r.Signal]; known {
					s.procs.signalGroup(p, sig)
					ok = true
				}
			}
		case "exec", "shell", "subsystem":
			if started != nil {
				break
			}
			var argv []string
			switch req.Type {
			case "exec":
				var r struct{ Command string }
				if ssh.Unmarshal(req.Payload, &r) != nil {
					break
				}
				argv = []string{"/bin/sh", "-c", r.Command}
			case "shell":
				argv = s.shell
			case "subsystem":
				var r struct{ Name string }
				if ssh.Unmarshal(req.Payload, &r) != nil || r.Name != "sftp" {
					break
				}
				sftpArgv, err := s.sftpArgv()
				if err != nil {
					s.log.Warn("sftp subsystem unavailable", "err", err)
					break
				}
				argv, pt = sftpArgv, nil // SFTP speaks on plain pipes
			}
			if argv == nil {
				break
			}
			p, m, err := s.start(ch, argv, env, pt)
			if err != nil {
				s.log.Warn("ssh session start failed", "err", err)
				break
			}
			mu.Lock()
			started, ptmx = p, m
			mu.Unlock()
			ok = true
			if req.WantReply {
				req.Reply(true, nil) //nolint:errcheck
			}
			runWG.Go(func() {
				<-p.done
				close(exited)
				p.waitOutput()
				mu.Lock()
				if ptmx != nil {
					ptmx.Close()
					ptmx = nil
				}
				mu.Unlock()
				sendExit(ch, p.status)
				_ = ch.Close() // best effort: the exit status is sent
				<-p.stdinDone
			})
			continue
		}
		if req.WantReply {
			req.Reply(ok, nil) //nolint:errcheck
		}
	}
}

// start launches argv for a session channel, wired to ch directly or
// through a pty, confined like every agent process.
func (s *sshServer) start(ch ssh.Channel, argv, env []string, pt *ptyReq) (*proc, *os.File, error) {
	env = append(s.env(), env...)
	if pt != nil {
		term := pt.term
		if term == "" {
			term = "xterm-256color"
		}
		env = append(env, "TERM="+term)
	}
	cmd, launch, err := s.agents.command(argv, env, s.workdir)
	if err != nil {
		return nil, nil, err
	}
	handedOver := false
	defer func() {
		if !handedOver {
			launch.Started(errors.New("session setup failed")) //nolint:errcheck // only releases the launch
		}
	}()
	if pt == nil {
		stdinR, stdinW, err := os.Pipe()
		if err != nil {
			return nil, nil, err
		}
		stdoutR, stdoutW, err := os.Pipe()
		if err != nil {
			return nil, nil, err
		}
		stderrR, stderrW, err := os.Pipe()
		if err != nil {
			return nil, nil, err
		}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = stdinR, stdoutW, stderrW
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		handedOver = true
		p, err := s.procs.startAgent(cmd, launch)
		stdinR.Close()
		stdoutW.Close()
		stderrW.Close()
		if err != nil {
			stdinW.Close()
			stdoutR.Close()
			stderrR.Close()
			return nil, nil, err
		}
		// Output copiers end at the pipes' EOF, which comes when every
		// holder of the write ends (the command and its children) exits.
		var out sync.WaitGroup
		out.Go(func() { io.Copy(ch, stdoutR); stdoutR.Close() })          //nolint:errcheck
		out.Go(func() { io.Copy(ch.Stderr(), stderrR); stderrR.Close() }) //nolint:errcheck
		p.stdinDone = make(chan struct{})
		go func() { defer close(p.stdinDone); io.Copy(stdinW, ch); stdinW.Close() }() //nolint:errcheck // ends at EOF or when the channel closes
		p.waitOutput = out.Wait
		return p, nil, nil
	}
	ptmx, tty, err := pty.Open()
	if err != nil {
		return nil, nil, err
	}
	if pt.cols > 0 && pt.rows > 0 {
		pty.Setsize(ptmx, &pty.Winsize{Cols: uint16(pt.cols), Rows: uint16(pt.rows)}) //nolint:errcheck
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true}
	handedOver = true
	p, err := s.procs.startAgent(cmd, launch)
	tty.Close()
	if err != nil {
		ptmx.Close()
		return nil, nil, err
	}
	var out sync.WaitGroup
	out.Go(func() { io.Copy(ch, ptmx) }) //nolint:errcheck // EIO once the last tty holder exits
	p.stdinDone = make(chan struct{})
	go func() { defer close(p.stdinDone); io.Copy(ptmx, ch) }() //nolint:errcheck // ends when the channel or pty closes
	p.waitOutput = out.Wait                                     // the caller closes ptmx afterwards
	return p, ptmx, nil
}

func sendExit(ch ssh.Channel, ws syscall.WaitStatus) {
	if ws.Signaled() {
		name := signalNames[ws.Signal()]
		if name == "" {
			name = "KILL"
		}
		payload := ssh.Marshal(struct {
			Signal     string
			CoreDumped bool
			Msg, Lang  string
		}{name, ws.CoreDump(), "", ""})
		ch.SendRequest("exit-signal", false, payload) //nolint:errcheck
		return
	}
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], uint32(ws.ExitStatus()))
	ch.SendRequest("exit-status", false, b[:]) //nolint:errcheck
}

var signalsByName = map[string]syscall.Signal{
	"ABRT": syscall.SIGABRT, "ALRM": syscall.SIGALRM, "FPE": syscall.SIGFPE, "HUP": syscall.SIGHUP,
	"ILL": syscall.SIGILL, "INT": syscall.SIGINT, "KILL": syscall.SIGKILL, "PIPE": syscall.SIGPIPE,
	"QUIT": syscall.SIGQUIT, "SEGV": syscall.SIGSEGV, "TERM": syscall.SIGTERM, "USR1": syscall.SIGUSR1,
	"USR2": syscall.SIGUSR2,
}

var signalNames = func() map[syscall.Signal]string {
	m := map[syscall.Signal]string{}
	for n, s := range signalsByName {
		m[s] = n
	}
	return m
}()

// directTCPIP serves "direct-tcpip" (ssh -L) to loopback destinations only.
func (s *sshServer) directTCPIP(nc ssh.NewChannel) {
	var r struct {
		Host       string
		Port       uint32
		OriginHost string
		OriginPort uint32
	}
	if err := ssh.Unmarshal(nc.ExtraData(), &r); err != nil {
		nc.Reject(ssh.ConnectionFailed, "malformed direct-tcpip request") //nolint:errcheck
		return
	}
	if !isLoopbackHost(r.Host) {
		nc.Reject(ssh.Prohibited, "only loopback destinations may be forwarded") //nolint:errcheck
		return
	}
	c, err := net.Dial("tcp", net.JoinHostPort(r.Host, strconv.Itoa(int(r.Port))))
	if err != nil {
		nc.Reject(ssh.ConnectionFailed, err.Error()) //nolint:errcheck
		return
	}
	defer c.Close()
	ch, reqs, err := nc.Accept()
	if err != nil {
		return
	}
	defer func() { _ = ch.Close() }()
	go ssh.DiscardRequests(reqs)
	pipeBoth(ch, c)
}

// pipeBoth copies both ways, propagating half-closes, until both ends are done.
func pipeBoth(a ssh.Channel, b net.Conn) {
	var wg sync.WaitGroup
	wg.Go(func() {
		io.Copy(b, a) //nolint:errcheck
		if cw, ok := b.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite() //nolint:errcheck
		}
	})
	io.Copy(a, b)  //nolint:errcheck
	a.CloseWrite() //nolint:errcheck
	wg.Wait()
}
