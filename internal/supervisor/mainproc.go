package supervisor

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// runMainProcess starts the sandbox's main process, forwards its output
// and reports its exit to the gateway. When ctx ends first the process
// group gets SIGTERM, then SIGKILL after five seconds.
func runMainProcess(ctx context.Context, log *slog.Logger, cfg Config, env []string, agents *agentLauncher, procs *procTable, pusher *logPusher, client openshellv1.OpenShellClient, stdout, stderr io.Writer) {
	argv := cfg.Command
	if len(argv) == 0 {
		argv = loginShell()
	}
	if cfg.TTY {
		env = append(env, "TERM=xterm-256color")
	}
	cmd, launch, err := agents.command(argv, env, cfg.WorkspaceDir)
	if err != nil {
		log.Error("main process failed to start", "argv", argv, "err", err)
		reportExit(ctx, log, client, cfg, 127)
		return
	}

	var (
		p       *proc
		copiers sync.WaitGroup
		keep    []*os.File // closed after exit
		readers []*os.File // output read ends, closed to unblock copiers
	)
	forward := func(r io.Reader, stream string, echo io.Writer) {
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			line := sc.Text()
			_, _ = fmt.Fprintln(echo, line)
			pusher.add(processLine(stream, line))
		}
	}
	if cfg.TTY {
		var ptmx, tty *os.File
		ptmx, tty, err = pty.Open()
		if err != nil {
			launch.Started(err) //nolint:errcheck // releases the launch; err is reported below
		} else {
			pty.Setsize(ptmx, &pty.Winsize{Cols: 80, Rows: 24}) //nolint:errcheck
			cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
			cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true}
			p, err = procs.startAgent(cmd, launch)
			tty.Close()
			if err != nil {
				ptmx.Close()
			} else {
				readers = append(readers, ptmx)
				copiers.Go(func() { forward(ptmx, "stdout", stdout) })
			}
		}
	} else {
		// Stdin stays open (never written) so an interactive shell waits
		// instead of exiting at EOF.
		var inR, inW, outR, outW, errR, errW *os.File
		if inR, inW, err = os.Pipe(); err == nil {
			if outR, outW, err = os.Pipe(); err == nil {
				errR, errW, err = os.Pipe()
			}
		}
		if err != nil {
			launch.Started(err) //nolint:errcheck // releases the launch; err is reported below
		} else {
			cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, errW
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			p, err = procs.startAgent(cmd, launch)
			inR.Close()
			outW.Close()
			errW.Close()
			keep = append(keep, inW)
			if err != nil {
				outR.Close()
				errR.Close()
			} else {
				readers = append(readers, outR, errR)
				copiers.Go(func() { forward(outR, "stdout", stdout) })
				copiers.Go(func() { forward(errR, "stderr", stderr) })
			}
		}
	}
	if err != nil {
		log.Error("main process failed to start", "argv", argv, "err", err)
		for _, f := range keep {
			f.Close()
		}
		reportExit(ctx, log, client, cfg, 127)
		return
	}
	log.Info("main process started", "pid", p.pid, "argv", argv, "tty", cfg.TTY)

	select {
	case <-p.done:
	case <-ctx.Done():
		procs.signalGroup(p, syscall.SIGTERM)
		t := time.NewTimer(5 * time.Second)
		select {
		case <-p.done:
		case <-t.C:
			procs.signalGroup(p, syscall.SIGKILL)
			<-p.done
		}
		t.Stop()
	}
	for _, f := range keep {
		f.Close()
	}
	// Children left in the main process's group go with it; its output is
	// drained for a moment so the last lines precede the exit report.
	syscall.Kill(-p.pid, syscall.SIGKILL) //nolint:errcheck // the group may be gone
	drained := make(chan struct{})
	go func() { copiers.Wait(); close(drained) }()
	t := time.NewTimer(2 * time.Second)
	select {
	case <-drained:
	case <-t.C:
	}
	t.Stop()
	code := exitCode(p.status)
	log.Info("main process exited", "exit_code", code)
	reportExit(ctx, log, client, cfg, code)
	// Output from processes that escaped the group is forwarded until the
	// supervisor stops.
	select {
	case <-drained:
	case <-ctx.Done():
	}
	for _, f := range readers {
		f.Close()
	}
	<-drained
}

// reportExit sends ReportMainProcessExit, retrying transient failures for
// up to a minute. Once the supervisor is stopping, the exit is the stop's
// doing: one short attempt, so a gateway that is itself going away does not
// hold up the stop until the driver's SIGKILL.
func reportExit(ctx context.Context, log *slog.Logger, client openshellv1.OpenShellClient, cfg Config, code int) {
	limit := time.Minute
	stopping := ctx.Err() != nil
	if stopping {
		limit = time.Second
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), limit)
	defer cancel()
	b := newBackoff(200*time.Millisecond, 5*time.Second)
	for {
		_, err := client.ReportMainProcessExit(rctx, &openshellv1.ReportMainProcessExitRequest{
			SandboxId:  cfg.SandboxID,
			InstanceId: cfg.InstanceID,
			ExitCode:   int32(code),
		})
		if err == nil {
			return
		}
		if !retryable(err) {
			log.Error("gateway refused the main process exit report", "err", err)
			return
		}
		if stopping {
			log.Warn("could not report the main process exit while stopping", "err", err)
			return
		}
		if sleepCtx(rctx, b.next()) != nil {
			log.Error("could not report the main process exit", "err", err)
			return
		}
	}
}
