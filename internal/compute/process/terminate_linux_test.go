//go:build linux

package process

import (
	"bufio"
	"context"
	"errors"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// TestTerminateHonoursContext: when the supervisor's exit is not observed
// (a process stuck in the kernel; here a monitor that never reports),
// terminate returns when ctx ends instead of waiting a fixed time.
func TestTerminateHonoursContext(t *testing.T) {
	// A supervisor that ignores SIGTERM, so only SIGKILL ends it.
	cmd := exec.Command("/bin/sh", "-c", "trap '' TERM; echo ready; exec sleep 60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); line != "ready\n" {
		t.Fatalf("helper process: %q, %v", line, err)
	}
	h, err := openPid(cmd.Process.Pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.file.Close() })
	r := &running{h: h, exited: make(chan struct{})} // no monitor: never closed
	d := &Driver{cfg: config{stopGrace: time.Hour}, done: make(chan struct{})}

	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = d.terminate(ctx, r)
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("terminate returned after %v, want soon after its 300ms context ended", el)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("terminate() error = %v, want the context's deadline error", err)
	}
	// Escalated: the process got SIGKILL when ctx ended.
	if err := cmd.Wait(); err == nil || cmd.ProcessState.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("sleep ended with %v, want killed by SIGKILL", err)
	}
}
