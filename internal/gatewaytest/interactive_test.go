package gatewaytest

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// TestExecInteractive drives ExecSandboxInteractive like a terminal client:
// start with a PTY, resize, type, and end the shell with Ctrl-D.
func TestExecInteractive(t *testing.T) {
	g := Start(t, Options{})
	c := g.Client()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	sb := readySandbox(ctx, t, c, "tty")
	s, err := c.ExecSandboxInteractive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	send := func(in *openshellv1.ExecSandboxInput) {
		t.Helper()
		if err := s.Send(in); err != nil {
			t.Fatal(err)
		}
	}
	send(&openshellv1.ExecSandboxInput{Payload: &openshellv1.ExecSandboxInput_Start{Start: &openshellv1.ExecSandboxRequest{
		SandboxId: sb.GetMetadata().GetId(), Command: []string{"sh"}, Tty: true, Cols: 80, Rows: 24,
	}}})
	send(&openshellv1.ExecSandboxInput{Payload: &openshellv1.ExecSandboxInput_Resize{Resize: &openshellv1.ExecSandboxWindowResize{Cols: 132, Rows: 43}}})
	// Give the resize a moment to land before asking for the size; the
	// screen is read until the exit event, so no output can be missed.
	time.Sleep(200 * time.Millisecond)
	send(&openshellv1.ExecSandboxInput{Payload: &openshellv1.ExecSandboxInput_Stdin{Stdin: []byte("stty size; tty; echo typed-$((6*7))\n")}})
	send(&openshellv1.ExecSandboxInput{Payload: &openshellv1.ExecSandboxInput_Stdin{Stdin: []byte{0x04}}}) // Ctrl-D
	var screen strings.Builder
	exit := int32(-1)
	for {
		ev, err := s.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("recv: %v (screen so far %q)", err, screen.String())
		}
		switch p := ev.GetPayload().(type) {
		case *openshellv1.ExecSandboxEvent_Stdout:
			screen.Write(p.Stdout.GetData())
		case *openshellv1.ExecSandboxEvent_Stderr:
			t.Errorf("stderr event in a tty session: %q", p.Stderr.GetData())
		case *openshellv1.ExecSandboxEvent_Exit:
			exit = p.Exit.GetExitCode()
		}
	}
	out := screen.String()
	if exit != 0 || !strings.Contains(out, "43 132") || !strings.Contains(out, "/dev/pts/") || !strings.Contains(out, "typed-42") {
		t.Fatalf("exit %d, screen:\n%s\nwant size 43 132, a pts and typed-42", exit, out)
	}
}
