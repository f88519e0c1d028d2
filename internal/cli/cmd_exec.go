package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// maxExecStdin bounds the stdin a non-interactive exec sends: it travels in
// the request, and the gateway decodes at most 1 MiB per message.
const maxExecStdin = 1<<20 - 64<<10

func (a *app) newSandboxExecCmd() *cobra.Command {
	var (
		name, workdir string
		envs          []string
		tty, noTTY    bool
		timeout       uint32
	)
	cmd := &cobra.Command{
		Use:   "exec --name NAME [flags] -- CMD...",
		Short: "Run a command in a sandbox",
		Long: `Run a command in a ready sandbox. Its stdout and stderr are copied to yours and
its exit code becomes openshell's. When stdin is not a terminal it is sent to
the command (at most 960 KiB). With --tty (the default when stdin and stdout
are terminals) the command gets a terminal of your window's size.`,
		Example: `  openshell sandbox exec --name dev -- uname -a
  echo hi | openshell sandbox exec --name dev -- cat`,
		Args: argsUsage(func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return errors.New("missing command: openshell sandbox exec --name NAME -- CMD...") //nolint:staticcheck // ST1005: user-facing usage line ending in "CMD..."
			}
			return nil
		}),
		RunE: func(cmd *cobra.Command, args []string) error {
			if name == "" {
				return usagef("--name is required")
			}
			if tty && noTTY {
				return usagef("--tty and --no-tty are mutually exclusive")
			}
			env, err := parseKV("env", envs)
			if err != nil {
				return err
			}
			useTTY := a.stdinTerminal() && a.stdoutTerminal()
			if tty {
				useTTY = true
			} else if noTTY {
				useTTY = false
			}
			ctx := cmd.Context()
			sb, err := a.getSandbox(ctx, name)
			if err != nil {
				return err
			}
			req := &openshellv1.ExecSandboxRequest{
				SandboxId: sb.GetMetadata().GetId(), Command: args, Workdir: workdir,
				Environment: env, TimeoutSeconds: timeout, Tty: useTTY,
			}
			if useTTY {
				return a.execInteractive(ctx, name, req)
			}
			return a.execStream(ctx, name, req)
		},
	}
	f := cmd.Flags()
	f.SetInterspersed(false)
	f.StringVarP(&name, "name", "n", "", "sandbox name (required)")
	f.StringVarP(&workdir, "workdir", "w", "", "working directory in the sandbox")
	f.StringArrayVarP(&envs, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	f.BoolVarP(&tty, "tty", "t", false, "allocate a terminal")
	f.BoolVar(&noTTY, "no-tty", false, "do not allocate a terminal")
	f.Uint32Var(&timeout, "timeout", 0, "seconds before the command is killed (exit code 124); 0 means no limit")
	return cmd
}

// execStream runs a non-interactive command and returns an *ExitError for a
// non-zero exit code.
func (a *app) execStream(ctx context.Context, name string, req *openshellv1.ExecSandboxRequest) error {
	if !a.stdinTerminal() && a.stdin != nil {
		b, err := io.ReadAll(io.LimitReader(a.stdin, maxExecStdin+1))
		if err != nil {
			return fmt.Errorf("read stdin: %w", err)
		}
		if len(b) > maxExecStdin {
			return &userError{msg: fmt.Sprintf("stdin is larger than %d KiB; copy large inputs with 'openshell forward' or a file instead", maxExecStdin>>10)}
		}
		req.Stdin = b
	}
	stream, err := a.client.ExecSandbox(ctx, req)
	if err != nil {
		return a.rpcError(err, sandboxWhat(name))
	}
	return a.consumeExec(name, stream.Recv)
}

// consumeExec copies exec events to stdout/stderr until the exit event.
func (a *app) consumeExec(name string, recv func() (*openshellv1.ExecSandboxEvent, error)) error {
	for {
		ev, err := recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return &userError{msg: fmt.Sprintf("sandbox %q: the command's output ended without an exit status", name)}
			}
			return a.rpcError(err, sandboxWhat(name))
		}
		switch p := ev.GetPayload().(type) {
		case *openshellv1.ExecSandboxEvent_Stdout:
			if _, err := a.stdout.Write(p.Stdout.GetData()); err != nil {
				return err
			}
		case *openshellv1.ExecSandboxEvent_Stderr:
			if _, err := a.stderr.Write(p.Stderr.GetData()); err != nil {
				return err
			}
		case *openshellv1.ExecSandboxEvent_Exit:
			if code := int(p.Exit.GetExitCode()); code != 0 {
				return &ExitError{Code: code}
			}
			return nil
		}
	}
}

// execInteractive runs a command with a terminal through
// ExecSandboxInteractive: local terminal in raw mode, stdin streamed,
// window size changes forwarded.
func (a *app) execInteractive(ctx context.Context, name string, req *openshellv1.ExecSandboxRequest) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if f, ok := a.stdout.(*os.File); ok {
		if w, h, err := term.GetSize(int(f.Fd())); err == nil {
			req.Cols, req.Rows = uint32(w), uint32(h)
		}
	}
	stream, err := a.client.ExecSandboxInteractive(ctx)
	if err != nil {
		return a.rpcError(err, sandboxWhat(name))
	}
	var sendMu sync.Mutex
	send := func(in *openshellv1.ExecSandboxInput) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return stream.Send(in)
	}
	if err := send(&openshellv1.ExecSandboxInput{Payload: &openshellv1.ExecSandboxInput_Start{Start: req}}); err != nil {
		return a.rpcError(err, sandboxWhat(name))
	}
	restore := a.makeRaw()
	defer restore()

	stopResize := a.onResize(func(w, h int) {
		_ = send(&openshellv1.ExecSandboxInput{Payload: &openshellv1.ExecSandboxInput_Resize{Resize: &openshellv1.ExecSandboxWindowResize{Cols: uint32(w), Rows: uint32(h)}}})
	})
	defer stopResize()
	// The stdin pump may block in Read on a terminal after the command
	// exited; it cannot be interrupted portably, so it is not joined: it
	// ends with the process (or at stdin EOF).
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := a.stdin.Read(buf)
			if n > 0 {
				if serr := send(&openshellv1.ExecSandboxInput{Payload: &openshellv1.ExecSandboxInput_Stdin{Stdin: append([]byte(nil), buf[:n]...)}}); serr != nil {
					return
				}
			}
			if err != nil {
				sendMu.Lock()
				_ = stream.CloseSend()
				sendMu.Unlock()
				return
			}
			if ctx.Err() != nil {
				return
			}
		}
	}()
	return a.consumeExec(name, stream.Recv)
}

// makeRaw puts the stdin terminal in raw mode and returns the restore func.
func (a *app) makeRaw() func() {
	f, ok := a.stdin.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return func() {}
	}
	st, err := term.MakeRaw(int(f.Fd()))
	if err != nil {
		return func() {}
	}
	return func() { _ = term.Restore(int(f.Fd()), st) }
}

// onResize calls fn with the new size of the stdout terminal on every
// SIGWINCH until the returned stop func is called; stop joins the watcher.
func (a *app) onResize(fn func(w, h int)) (stop func()) {
	f, ok := a.stdout.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return func() {}
	}
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGWINCH)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-ch:
				if w, h, err := term.GetSize(int(f.Fd())); err == nil {
					fn(w, h)
				}
			}
		}
	})
	return func() {
		signal.Stop(ch)
		close(done)
		wg.Wait()
	}
}
