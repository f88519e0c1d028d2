package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/crypto/ssh"
	"golang.org/x/term"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/atomicfile"
)

// sshUser is the account the supervisor's SSH server accepts.
const sshUser = "sandbox"

// createSSHSession asks the gateway for a relay token for the sandbox.
func (a *app) createSSHSession(ctx context.Context, sb *openshellv1.Sandbox) (*openshellv1.CreateSshSessionResponse, error) {
	resp, err := a.client.CreateSshSession(ctx, &openshellv1.CreateSshSessionRequest{SandboxId: sb.GetMetadata().GetId()})
	if err != nil {
		return nil, a.rpcError(err, sandboxWhat(sb.GetMetadata().GetName()))
	}
	return resp, nil
}

func (a *app) newSandboxConnectCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "connect NAME",
		Short: "Open an interactive shell in a sandbox",
		Long: `Open an interactive shell in a sandbox over SSH, relayed by the gateway.
No local ssh client is needed; 'openshell sandbox ssh-config' sets up OpenSSH
for tools that want one.`,
		Args: argsUsage(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := a.getSandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if ph := sb.GetStatus().GetPhase(); ph != openshellv1.SandboxPhase_SANDBOX_PHASE_READY {
				if ph == openshellv1.SandboxPhase_SANDBOX_PHASE_ERROR {
					return readyFailure(sb)
				}
				return &userError{msg: fmt.Sprintf("sandbox %q is %s, not Ready; wait for it ('openshell sandbox get %s') or start it ('openshell sandbox start %s')", args[0], phaseName(ph), args[0], args[0])}
			}
			return a.connect(cmd.Context(), sb)
		},
	}
}

// connect runs an interactive SSH shell in sb over a ForwardTcp relay, with
// the local terminal in raw mode and window size changes forwarded. The
// shell's exit status becomes an *ExitError.
func (a *app) connect(ctx context.Context, sb *openshellv1.Sandbox) error {
	name := sb.GetMetadata().GetName()
	client, closeSSH, err := a.dialSandboxSSH(ctx, sb)
	if err != nil {
		return err
	}
	defer closeSSH()
	s, err := client.NewSession()
	if err != nil {
		return fmt.Errorf("sandbox %q: open ssh session: %w", name, err)
	}
	defer func() { _ = s.Close() }()

	w, h := 80, 24
	stdinFile, stdinIsFile := a.stdin.(*os.File)
	interactive := stdinIsFile && term.IsTerminal(int(stdinFile.Fd()))
	if f, ok := a.stdout.(*os.File); ok {
		if cw, ch, err := term.GetSize(int(f.Fd())); err == nil {
			w, h = cw, ch
		}
	}
	if interactive {
		modes := ssh.TerminalModes{ssh.ECHO: 1, ssh.TTY_OP_ISPEED: 38400, ssh.TTY_OP_OSPEED: 38400}
		if err := s.RequestPty("xterm-256color", h, w, modes); err != nil {
			return fmt.Errorf("sandbox %q: request terminal: %w", name, err)
		}
	}
	s.Stdout = a.stdout
	s.Stderr = a.stderr
	stdin, err := s.StdinPipe()
	if err != nil {
		return err
	}
	if err := s.Shell(); err != nil {
		return fmt.Errorf("sandbox %q: start shell: %w", name, err)
	}
	restore := a.makeRaw()
	defer restore()
	stop := a.onResize(func(w, h int) { _ = s.WindowChange(h, w) })
	defer stop()
	// The stdin pump may block in Read on a terminal after the shell exits;
	// it ends when the process does.
	go func() {
		_, _ = io.Copy(stdin, a.stdin)
		_ = stdin.Close()
	}()
	done := make(chan error, 1)
	go func() { done <- s.Wait() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		_ = client.Close()
		<-done //nolint:errcheck // joined only; interrupted, so the session's error is moot
		return context.Canceled
	}
	var ee *ssh.ExitError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ee):
		return &ExitError{Code: ee.ExitStatus()}
	case errors.Is(err, io.EOF), isMissingExit(err):
		return nil
	}
	return fmt.Errorf("sandbox %q: %w", name, err)
}

func isMissingExit(err error) bool {
	var me *ssh.ExitMissingError
	return errors.As(err, &me)
}

// relayError explains a failure on the relay: a gRPC status from the
// gateway if one is there, otherwise the SSH handshake error.
func (a *app) relayError(err error, name string) error {
	if st := a.rpcError(err, sandboxWhat(name)); st != err { //nolint:errorlint // identity check: did rpcError rewrite err?
		return st
	}
	return &userError{msg: fmt.Sprintf("sandbox %q: ssh handshake over the gateway relay failed: %v (is the sandbox ready? see 'openshell sandbox get %s')", name, err, name), cause: err}
}

func (a *app) newSSHProxyCmd() *cobra.Command {
	var sandboxID, tokenFile, gatewayName string
	cmd := &cobra.Command{
		Use:   "ssh-proxy --sandbox-id ID --token-file FILE",
		Short: "Bridge stdin/stdout to a sandbox's SSH server (OpenSSH ProxyCommand)",
		Long: `Bridge stdin/stdout to a sandbox's SSH server through the gateway, for use as an
OpenSSH ProxyCommand. 'openshell sandbox ssh-config' writes the configuration.

The session token is read from --token-file or, if unset, from the
OPENSHELL_SSH_TOKEN environment variable, so it never shows in process lists.`,
		Args: argsUsage(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			if sandboxID == "" {
				return usagef("--sandbox-id is required")
			}
			if gatewayName != "" && a.gatewayName == "" {
				a.gatewayName = gatewayName
			}
			token := a.getenv("OPENSHELL_SSH_TOKEN")
			if tokenFile != "" {
				b, err := os.ReadFile(tokenFile)
				if err != nil {
					return fmt.Errorf("read token file: %w", err)
				}
				token = strings.TrimSpace(string(b))
			}
			if token == "" {
				return usagef("no session token: pass --token-file or set OPENSHELL_SSH_TOKEN")
			}
			if _, err := a.gateway(); err != nil {
				return err
			}
			t, err := a.openTunnel(cmd.Context(), sshInit(sandboxID, token))
			if err != nil {
				return a.rpcError(err, fmt.Sprintf("sandbox %s", sandboxID))
			}
			if err := bridge(stdioConn{r: a.stdin, w: a.stdout}, t); err != nil {
				return a.rpcError(err, fmt.Sprintf("sandbox %s", sandboxID))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&sandboxID, "sandbox-id", "", "sandbox id")
	f.StringVar(&tokenFile, "token-file", "", "file holding the SSH session token")
	f.StringVar(&gatewayName, "gateway-name", "", "registered gateway to use (same as --gateway)")
	return cmd
}

// stdioConn joins stdin and stdout into one ReadWriteCloser.
type stdioConn struct {
	r io.Reader
	w io.Writer
}

func (c stdioConn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c stdioConn) Write(p []byte) (int, error) { return c.w.Write(p) }
func (c stdioConn) CloseWrite() error {
	if wc, ok := c.w.(io.Closer); ok {
		return wc.Close()
	}
	return nil
}
func (c stdioConn) Close() error { return nil }

func (a *app) newSSHConfigCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "ssh-config NAME",
		Short: "Print an OpenSSH Host block so that 'ssh openshell-NAME' works",
		Long: `Create an SSH session for the sandbox and print an OpenSSH Host block for it.
Append it to ~/.ssh/config:

  openshell sandbox ssh-config dev >> ~/.ssh/config
  ssh openshell-dev

The session token is stored in a 0600 file under the openshell config
directory, never on the command line.`,
		Args: argsUsage(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			sb, err := a.getSandbox(cmd.Context(), name)
			if err != nil {
				return err
			}
			sess, err := a.createSSHSession(cmd.Context(), sb)
			if err != nil {
				return err
			}
			id := sb.GetMetadata().GetId()
			dir := filepath.Join(a.newRegistry().userDir, "ssh")
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return err
			}
			_ = os.Chmod(dir, 0o700)
			tokenFile := filepath.Join(dir, id+".token")
			if err := atomicfile.Write(tokenFile, []byte(sess.GetToken()+"\n"), 0o600); err != nil {
				return err
			}
			exe, err := a.executable()
			if err != nil {
				return fmt.Errorf("find the openshell executable: %w", err)
			}
			proxy := []string{shellQuote(exe)}
			if a.target.Name != "" && a.target.Name != "local" {
				proxy = append(proxy, "--gateway", shellQuote(a.target.Name))
			}
			if a.gatewayEndpoint != "" || a.target.Name == "local" {
				proxy = append(proxy, "--gateway-endpoint", shellQuote(a.target.Endpoint))
			}
			if a.target.Insecure {
				proxy = append(proxy, "--gateway-insecure")
			}
			proxy = append(proxy, "ssh-proxy", "--sandbox-id", shellQuote(id), "--token-file", shellQuote(tokenFile))
			_, _ = fmt.Fprintf(a.stdout, "Host openshell-%s\n", name)
			_, _ = fmt.Fprintf(a.stdout, "    User %s\n", sshUser)
			_, _ = fmt.Fprintf(a.stdout, "    StrictHostKeyChecking no\n")
			_, _ = fmt.Fprintf(a.stdout, "    UserKnownHostsFile /dev/null\n")
			_, _ = fmt.Fprintf(a.stdout, "    LogLevel ERROR\n")
			_, _ = fmt.Fprintf(a.stdout, "    ProxyCommand %s\n", strings.Join(proxy, " "))
			return nil
		},
	}
}

// shellQuote quotes s for the shell OpenSSH runs ProxyCommand with.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:=@%+,", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// dialSandboxSSH opens an SSH session through the gateway relay to sandbox sb
// and returns the SSH client and a func closing the client, then the tunnel.
func (a *app) dialSandboxSSH(ctx context.Context, sb *openshellv1.Sandbox) (*ssh.Client, func(), error) {
	name := sb.GetMetadata().GetName()
	sess, err := a.createSSHSession(ctx, sb)
	if err != nil {
		return nil, nil, err
	}
	t, err := a.openTunnel(ctx, sshInit(sb.GetMetadata().GetId(), sess.GetToken()))
	if err != nil {
		return nil, nil, a.rpcError(err, sandboxWhat(name))
	}
	cfg := &ssh.ClientConfig{
		User: sshUser,
		// The relay is authenticated and authorized by the gateway (session
		// token bound to this sandbox); the supervisor's host key is
		// ephemeral, so there is nothing to pin.
		HostKeyCallback: ssh.InsecureIgnoreHostKey(), //nolint:gosec // see above
		Auth:            nil,                         // "none" authentication
	}
	conn, chans, reqs, err := ssh.NewClientConn(tunnelConn{t}, "sandbox-"+name, cfg)
	if err != nil {
		if rerr := t.remoteErr(); rerr != nil {
			err = rerr
		}
		_ = t.Close()
		return nil, nil, a.relayError(err, name)
	}
	client := ssh.NewClient(conn, chans, reqs)
	return client, func() {
		_ = client.Close()
		_ = t.Close()
	}, nil
}
