package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/openshell-go/openshell/internal/atomicfile"
)

func (a *app) newForwardCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "forward",
		Aliases: []string{"fwd"},
		Short:   "Forward local TCP ports to ports inside sandboxes",
		RunE:    groupRunE,
	}
	cmd.AddCommand(a.newForwardStartCmd(), a.newForwardServiceCmd(), a.newForwardListCmd(), a.newForwardStopCmd())
	return cmd
}

// parsePortSpec parses [LOCAL:]REMOTE.
func parsePortSpec(spec string) (local, remote uint16, err error) {
	l, r, ok := strings.Cut(spec, ":")
	if !ok {
		l, r = spec, spec
	}
	lp, err1 := strconv.ParseUint(l, 10, 16)
	rp, err2 := strconv.ParseUint(r, 10, 16)
	if err1 != nil || err2 != nil || rp == 0 {
		return 0, 0, usagef("invalid port spec %q: want [LOCAL:]REMOTE, e.g. 8080 or 9000:8080", spec)
	}
	return uint16(lp), uint16(rp), nil
}

// forwardState is a background forward's state file.
type forwardState struct {
	PID       int       `json:"pid"`
	Sandbox   string    `json:"sandbox"`
	Workspace string    `json:"workspace,omitempty"`
	Gateway   string    `json:"gateway,omitempty"`
	Local     uint16    `json:"local_port"`
	Remote    uint16    `json:"remote_port"`
	LogFile   string    `json:"log_file"`
	StartedAt time.Time `json:"started_at"`
}

func (a *app) forwardsDir() string {
	return filepath.Join(stateHome(a.lookupEnv), "openshell", "forwards")
}

func (a *app) newForwardStartCmd() *cobra.Command {
	var background bool
	cmd := &cobra.Command{
		Use:   "start NAME [LOCAL:]REMOTE",
		Short: "Forward 127.0.0.1:LOCAL to port REMOTE inside a sandbox",
		Long: `Listen on 127.0.0.1:LOCAL and carry each connection to 127.0.0.1:REMOTE inside
the sandbox through the gateway. LOCAL defaults to REMOTE; 0 picks a free port.
Runs until interrupted, or in the background with --background ('openshell
forward list' and 'openshell forward stop' manage background forwards).`,
		Example: `  openshell forward start dev 8080
  openshell forward start dev 9000:8080 --background`,
		Args: argsUsage(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			local, remote, err := parsePortSpec(args[1])
			if err != nil {
				return err
			}
			if background {
				return a.startBackgroundForward(cmd.Context(), name, local, remote)
			}
			return a.forward(cmd.Context(), name, local, remote)
		},
	}
	cmd.Flags().BoolVar(&background, "background", false, "run the forward in the background")
	return cmd
}

// newForwardServiceCmd is OpenShell's 'forward service': a foreground
// forward to a loopback TCP service of the sandbox from a local address
// whose port may be chosen by the system.
func (a *app) newForwardServiceCmd() *cobra.Command {
	var (
		target uint16
		local  string
	)
	cmd := &cobra.Command{
		Use:   "service NAME --target-port PORT [--local ADDR]",
		Short: "Forward a local address to a loopback service inside a sandbox",
		Long: `Listen on ADDR (default 127.0.0.1:0: a free port, printed on stderr) and carry
each connection to 127.0.0.1:PORT inside the sandbox through the gateway, until
interrupted. ADDR must be a loopback address.`,
		Example: "  openshell forward service my-app --target-port 8000 --local 127.0.0.1:0",
		Args:    argsUsage(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if target == 0 {
				return usagef("--target-port is required (1-65535)")
			}
			host, _, err := net.SplitHostPort(local)
			if ip := net.ParseIP(host); err != nil || (host != "localhost" && (ip == nil || !ip.IsLoopback())) {
				return usagef("invalid --local %q: want a loopback HOST:PORT, e.g. 127.0.0.1:0", local)
			}
			return a.forwardOn(cmd.Context(), args[0], local, target)
		},
	}
	cmd.Flags().Uint16Var(&target, "target-port", 0, "port of the service inside the sandbox (on its loopback)")
	cmd.Flags().StringVar(&local, "local", "127.0.0.1:0", "local loopback address to listen on")
	return cmd
}

// forward serves a foreground forward until ctx ends. One SSH session token
// is created up front and used for every accepted connection.
func (a *app) forward(ctx context.Context, name string, local, remote uint16) error {
	return a.forwardOn(ctx, name, net.JoinHostPort("127.0.0.1", strconv.Itoa(int(local))), remote)
}

func (a *app) forwardOn(ctx context.Context, name, listenAddr string, remote uint16) error {
	sb, err := a.getSandbox(ctx, name)
	if err != nil {
		return err
	}
	sess, err := a.createSSHSession(ctx, sb)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", listenAddr)
	if err != nil {
		return &userError{msg: fmt.Sprintf("cannot listen on %s: %v", listenAddr, err), cause: err}
	}
	_, _ = fmt.Fprintf(a.stderr, "Forwarding %s -> sandbox %s port %d (Ctrl-C to stop)\n", ln.Addr(), name, remote)
	if a.onListen != nil {
		a.onListen(ln.Addr())
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	stop := context.AfterFunc(ctx, func() { _ = ln.Close() })
	defer stop()
	id := sb.GetMetadata().GetId()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		wg.Go(func() {
			t, err := a.openTunnel(ctx, tcpInit(id, sess.GetToken(), uint32(remote)))
			if err != nil {
				_ = c.Close()
				_, _ = fmt.Fprintf(a.stderr, "forward %s: %v\n", c.RemoteAddr(), a.rpcError(err, sandboxWhat(name)))
				return
			}
			// Closing the local side on ctx end unblocks the bridge.
			stopConn := context.AfterFunc(ctx, func() { _ = c.Close(); _ = t.Close() })
			defer stopConn()
			if err := bridge(c, t); err != nil && ctx.Err() == nil && a.verbose {
				_, _ = fmt.Fprintf(a.stderr, "forward %s: %v\n", c.RemoteAddr(), a.rpcError(err, sandboxWhat(name)))
			}
		})
	}
}

// startBackgroundForward re-runs this command without --background as a
// detached process, waits until it listens and records it in a state file.
func (a *app) startBackgroundForward(ctx context.Context, name string, local, remote uint16) error {
	if local == 0 {
		return usagef("--background needs an explicit LOCAL port")
	}
	if _, err := a.getSandbox(ctx, name); err != nil {
		return err
	}
	dir := a.forwardsDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	statePath := filepath.Join(dir, fmt.Sprintf("%d.json", local))
	if st, err := readForwardState(statePath); err == nil && processAlive(st.PID) {
		return &userError{msg: fmt.Sprintf("port %d is already forwarded to sandbox %s (pid %d); stop it with 'openshell forward stop %d'", local, st.Sandbox, st.PID, local)}
	}
	exe, err := a.executable()
	if err != nil {
		return err
	}
	// The child is a foreground 'forward start' with this invocation's
	// gateway and workspace selection (the environment is inherited).
	var args []string
	if a.gatewayName != "" {
		args = append(args, "--gateway", a.gatewayName)
	}
	if a.gatewayEndpoint != "" {
		args = append(args, "--gateway-endpoint", a.gatewayEndpoint)
	}
	if a.gatewayInsecure {
		args = append(args, "--gateway-insecure")
	}
	if ws := a.ws(); ws != "" {
		args = append(args, "--workspace", ws)
	}
	args = append(args, "forward", "start", name, fmt.Sprintf("%d:%d", local, remote))
	logPath := filepath.Join(dir, fmt.Sprintf("%d.log", local))
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	child := exec.Command(exe, args...)
	child.Stdout, child.Stderr = logf, logf
	child.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := child.Start(); err != nil {
		return fmt.Errorf("start background forward: %w", err)
	}
	// The waiter reaps the child if it fails to start listening; on success
	// the child outlives this process and the waiter ends with it.
	exited := make(chan error, 1)
	go func() { exited <- child.Wait() }()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(int(local)))
	deadline := time.Now().Add(15 * time.Second)
	for {
		if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
			_ = c.Close()
			break
		}
		select {
		case err := <-exited:
			b, _ := os.ReadFile(logPath)
			return &userError{msg: fmt.Sprintf("background forward exited (%v): %s", err, strings.TrimSpace(string(b)))}
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = child.Process.Kill()
			<-exited //nolint:errcheck // reaped only; the timeout is the error reported
			return &userError{msg: fmt.Sprintf("background forward did not start listening on %s within 15s; see %s", addr, logPath)}
		}
	}
	gw := ""
	if a.target != nil {
		gw = a.target.Name
	}
	st := forwardState{PID: child.Process.Pid, Sandbox: name, Workspace: a.ws(), Gateway: gw, Local: local, Remote: remote, LogFile: logPath, StartedAt: a.now().UTC()}
	b, _ := json.MarshalIndent(st, "", "  ")
	if err := atomicfile.Write(statePath, append(b, '\n'), 0o600); err != nil {
		return err
	}
	// The child keeps running after we exit; release it.
	_ = child.Process.Release()
	_, _ = fmt.Fprintf(a.stdout, "Forwarding %s -> sandbox %s port %d in the background (pid %d)\n", addr, name, remote, st.PID)
	return nil
}

func readForwardState(path string) (forwardState, error) {
	var st forwardState
	b, err := os.ReadFile(path)
	if err != nil {
		return st, err
	}
	err = json.Unmarshal(b, &st)
	return st, err
}

// processAlive reports whether pid runs and looks like an openshell forward.
func processAlive(pid int) bool {
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		return false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return !errors.Is(err, fs.ErrNotExist)
	}
	return strings.Contains(string(cmdline), "forward")
}

func (a *app) listForwards() ([]forwardState, error) {
	ents, err := os.ReadDir(a.forwardsDir())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []forwardState
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		p := filepath.Join(a.forwardsDir(), e.Name())
		st, err := readForwardState(p)
		if err != nil || !processAlive(st.PID) {
			_ = os.Remove(p) // stale
			continue
		}
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Local < out[j].Local })
	return out, nil
}

func (a *app) newForwardListCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List background forwards",
		Args:    argsUsage(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			fw, err := a.listForwards()
			if err != nil {
				return err
			}
			if a.structured() {
				if fw == nil {
					fw = []forwardState{}
				}
				return a.printPlain(fw)
			}
			if len(fw) == 0 {
				_, _ = fmt.Fprintln(a.stderr, "No background forwards")
				return nil
			}
			tw := newTable(a.stdout)
			_, _ = fmt.Fprintln(tw, "LOCAL\tSANDBOX\tREMOTE\tPID\tAGE")
			for _, f := range fw {
				_, _ = fmt.Fprintf(tw, "127.0.0.1:%d\t%s\t%d\t%d\t%s\n", f.Local, f.Sandbox, f.Remote, f.PID, humanAge(a.now().Sub(f.StartedAt)))
			}
			return tw.Flush()
		},
	}
}

func (a *app) newForwardStopCmd() *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "stop [LOCAL_PORT | SANDBOX]...",
		Short: "Stop background forwards by local port or sandbox name",
		Args: argsUsage(func(cmd *cobra.Command, args []string) error {
			if all == (len(args) > 0) {
				return errors.New("name local ports or sandboxes to stop, or pass --all")
			}
			return nil
		}),
		RunE: func(cmd *cobra.Command, args []string) error {
			fw, err := a.listForwards()
			if err != nil {
				return err
			}
			stopped := 0
			for _, f := range fw {
				match := all
				for _, arg := range args {
					if arg == f.Sandbox || arg == strconv.Itoa(int(f.Local)) {
						match = true
					}
				}
				if !match {
					continue
				}
				if err := syscall.Kill(f.PID, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
					return fmt.Errorf("stop forward on port %d (pid %d): %w", f.Local, f.PID, err)
				}
				_ = os.Remove(filepath.Join(a.forwardsDir(), fmt.Sprintf("%d.json", f.Local)))
				_, _ = fmt.Fprintf(a.stdout, "Stopped forward 127.0.0.1:%d -> %s:%d\n", f.Local, f.Sandbox, f.Remote)
				stopped++
			}
			if stopped == 0 {
				return &userError{msg: "no matching background forward (see 'openshell forward list')"}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "stop every background forward")
	return cmd
}
