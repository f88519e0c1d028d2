package exec

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/relay"
	"github.com/openshell-go/openshell/internal/sshexec"
)

// Exec limits, as OpenShell applies them.
const (
	maxExecArgs    = 1024
	maxExecArgLen  = 32 << 10
	maxExecWorkdir = 4096
)

func validateExec(req *openshellv1.ExecSandboxRequest, interactive bool) error {
	if req.GetSandboxId() == "" {
		return errdefs.InvalidArgument("sandbox_id is required")
	}
	if len(req.GetCommand()) == 0 && !interactive {
		return errdefs.InvalidArgument("command is required")
	}
	if len(req.GetCommand()) > maxExecArgs {
		return errdefs.InvalidArgument(fmt.Sprintf("command array exceeds %d argument limit", maxExecArgs))
	}
	for i, a := range req.GetCommand() {
		if len(a) > maxExecArgLen {
			return errdefs.InvalidArgument(fmt.Sprintf("command argument %d exceeds %d byte limit", i, maxExecArgLen))
		}
		if bytes.IndexByte([]byte(a), 0) >= 0 {
			return errdefs.InvalidArgument(fmt.Sprintf("command[%d] contains null bytes", i))
		}
	}
	for k, v := range req.GetEnvironment() {
		if len(v) > maxExecArgLen {
			return errdefs.InvalidArgument(fmt.Sprintf("environment value for '%s' exceeds %d byte limit", k, maxExecArgLen))
		}
		if bytes.ContainsAny([]byte(v), "\x00\r\n") {
			return errdefs.InvalidArgument("environment contains null bytes or newline characters")
		}
	}
	if w := req.GetWorkdir(); len(w) > maxExecWorkdir {
		return errdefs.InvalidArgument(fmt.Sprintf("workdir exceeds %d byte limit", maxExecWorkdir))
	} else if bytes.ContainsAny([]byte(w), "\x00\r\n") {
		return errdefs.InvalidArgument("workdir contains null bytes or newline characters")
	}
	if _, err := sshexec.BuildCommand(req.GetCommand(), req.GetEnvironment(), req.GetWorkdir()); err != nil {
		return err
	}
	return nil
}

// readySandbox loads a sandbox the caller may exec into and checks it is
// READY.
func (s *Service) readySandbox(ctx context.Context, id string) (*openshellv1.Sandbox, error) {
	sb, err := s.o.Authz.SandboxForCaller(ctx, id)
	if err != nil {
		return nil, err
	}
	if sb.GetStatus().GetPhase() != openshellv1.SandboxPhase_SANDBOX_PHASE_READY {
		return nil, errdefs.FailedPrecondition("sandbox is not ready")
	}
	return sb, nil
}

// eventWriter turns output chunks into exec events.
type eventWriter struct {
	send   func(*openshellv1.ExecSandboxEvent) error
	stderr bool
}

func (w eventWriter) Write(p []byte) (int, error) {
	data := append([]byte(nil), p...)
	ev := &openshellv1.ExecSandboxEvent{Payload: &openshellv1.ExecSandboxEvent_Stdout{Stdout: &openshellv1.ExecSandboxStdout{Data: data}}}
	if w.stderr {
		ev = &openshellv1.ExecSandboxEvent{Payload: &openshellv1.ExecSandboxEvent_Stderr{Stderr: &openshellv1.ExecSandboxStderr{Data: data}}}
	}
	if err := w.send(ev); err != nil {
		return 0, err
	}
	return len(p), nil
}

func exitEvent(code int) *openshellv1.ExecSandboxEvent {
	return &openshellv1.ExecSandboxEvent{Payload: &openshellv1.ExecSandboxEvent_Exit{Exit: &openshellv1.ExecSandboxExit{ExitCode: int32(code)}}}
}

// ExecSandbox runs a command in a READY sandbox through an SSH session
// over a supervisor relay, streaming stdout, stderr and exactly one final
// exit event.
func (s *Service) ExecSandbox(req *openshellv1.ExecSandboxRequest, stream openshellv1.OpenShell_ExecSandboxServer) error {
	ctx := stream.Context()
	if err := validateExec(req, false); err != nil {
		return err
	}
	if _, err := s.readySandbox(ctx, req.GetSandboxId()); err != nil {
		return err
	}
	code, err := s.ssh.run(ctx, req.GetSandboxId(), sshexec.Request{
		Command: req.GetCommand(), Env: req.GetEnvironment(), Workdir: req.GetWorkdir(),
		Stdin: bytes.NewReader(req.GetStdin()), TTY: req.GetTty(), Cols: req.GetCols(), Rows: req.GetRows(),
		Timeout: time.Duration(req.GetTimeoutSeconds()) * time.Second,
		Stdout:  eventWriter{send: stream.Send}, Stderr: eventWriter{send: stream.Send, stderr: true},
	})
	if err != nil {
		return err
	}
	return stream.Send(exitEvent(code))
}

// ExecSandboxInteractive runs an interactive command: the first frame
// starts it, later frames carry stdin and window resizes.
func (s *Service) ExecSandboxInteractive(stream openshellv1.OpenShell_ExecSandboxInteractiveServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	req := first.GetStart()
	if req == nil {
		return errdefs.InvalidArgument("first ExecSandboxInput must be start")
	}
	if err := validateExec(req, true); err != nil {
		return err
	}
	if _, err := s.readySandbox(ctx, req.GetSandboxId()); err != nil {
		return err
	}
	conn, err := s.o.Relay.OpenRelay(ctx, req.GetSandboxId(), relay.SSHTarget())
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()

	stdinR, stdinW := io.Pipe()
	resize := make(chan sshexec.WindowSize, 4)
	// The receive loop ends when the client half-closes or, at the latest,
	// when the call ends and Recv fails.
	go func() {
		defer func() { _ = stdinW.Close() }() // PipeWriter.Close never fails
		for {
			in, err := stream.Recv()
			if err != nil {
				if !errors.Is(err, io.EOF) {
					stdinW.CloseWithError(err)
				}
				return
			}
			switch p := in.GetPayload().(type) {
			case *openshellv1.ExecSandboxInput_Stdin:
				if _, err := stdinW.Write(p.Stdin); err != nil {
					return
				}
			case *openshellv1.ExecSandboxInput_Resize:
				select {
				case resize <- sshexec.WindowSize{Cols: p.Resize.GetCols(), Rows: p.Resize.GetRows()}:
				default:
				}
			}
		}
	}()
	code, err := sshexec.Exec(ctx, conn, sshexec.Request{
		Command: req.GetCommand(), Env: req.GetEnvironment(), Workdir: req.GetWorkdir(),
		Stdin: stdinR, TTY: req.GetTty(), Cols: req.GetCols(), Rows: req.GetRows(), Resize: resize,
		Timeout: time.Duration(req.GetTimeoutSeconds()) * time.Second,
		Stdout:  eventWriter{send: stream.Send}, Stderr: eventWriter{send: stream.Send, stderr: true},
	})
	_ = stdinR.Close() // PipeReader.Close never fails
	if err == nil {
		err = stream.Send(exitEvent(code))
	}
	return err
}
