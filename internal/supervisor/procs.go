package supervisor

import (
	"errors"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
)

// procTable starts and reaps every child of the supervisor. As PID 1 of a
// pid namespace the supervisor also inherits orphans and must reap them;
// waiting for "any child" would steal the exit status of its own children
// from os/exec, so all waiting happens here: a child is started with the
// table locked and registered before the lock is released, and the reaper
// delivers each status to the registered waiter (orphans are discarded).
type procTable struct {
	reapAll bool // wait for any child (PID 1 or subreaper)

	mu    sync.Mutex
	procs map[int]*proc

	sigc chan os.Signal
	stop chan struct{}
	done chan struct{}
}

type proc struct {
	pid    int
	cmd    *exec.Cmd
	done   chan struct{}
	status syscall.WaitStatus

	// Set by the starter: waitOutput joins the output copiers, stdinDone
	// is closed when the stdin copier has ended.
	waitOutput func()
	stdinDone  chan struct{}
}

func newProcTable(reapAll bool) *procTable {
	t := &procTable{
		reapAll: reapAll,
		procs:   map[int]*proc{},
		sigc:    make(chan os.Signal, 1),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	signal.Notify(t.sigc, syscall.SIGCHLD)
	go t.loop()
	return t
}

// Close stops the reaper; children still running are not waited for. It
// must run after everything that waits for a child has finished.
func (t *procTable) Close() {
	signal.Stop(t.sigc)
	close(t.stop)
	<-t.done
}

func (t *procTable) loop() {
	defer close(t.done)
	for {
		select {
		case <-t.stop:
			return
		case <-t.sigc:
			t.reap()
		}
	}
}

func (t *procTable) reap() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.reapAll {
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if err == syscall.EINTR {
				continue
			}
			if pid <= 0 || err != nil {
				return
			}
			t.deliverLocked(pid, ws)
		}
	}
	for pid := range t.procs {
		var ws syscall.WaitStatus
		got, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			got, err = syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		}
		if got == pid && err == nil {
			t.deliverLocked(pid, ws)
		}
	}
}

func (t *procTable) deliverLocked(pid int, ws syscall.WaitStatus) {
	p, ok := t.procs[pid]
	if !ok {
		return // an orphan inherited as PID 1
	}
	if !ws.Exited() && !ws.Signaled() {
		return // stopped or continued
	}
	delete(t.procs, pid)
	p.status = ws
	p.cmd.Process.Release() //nolint:errcheck // releases the pidfd; already reaped
	close(p.done)
}

// start starts cmd with start (cmd.Start, or isolation.Launch.Start for
// an agent process). Its stdio must be *os.File or nil so os/exec runs no
// copying goroutines that only cmd.Wait would join.
func (t *procTable) start(cmd *exec.Cmd, start func(*exec.Cmd) error) (*proc, error) {
	for _, f := range []any{cmd.Stdin, cmd.Stdout, cmd.Stderr} {
		switch f.(type) {
		case nil, *os.File:
		default:
			return nil, errors.New("procTable: stdio must be *os.File")
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := start(cmd); err != nil {
		return nil, err
	}
	p := &proc{pid: cmd.Process.Pid, cmd: cmd, done: make(chan struct{})}
	t.procs[p.pid] = p
	// A SIGCHLD that arrived before registration is still queued in sigc,
	// so the reaper will see this child after the lock is released.
	select {
	case t.sigc <- syscall.SIGCHLD:
	default:
	}
	return p, nil
}

// signalGroup sends sig to p's process group (p is its leader), or to p
// alone when that fails. It is a no-op once p has been reaped.
func (t *procTable) signalGroup(p *proc, sig syscall.Signal) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, live := t.procs[p.pid]; !live {
		return
	}
	if err := syscall.Kill(-p.pid, sig); err != nil {
		syscall.Kill(p.pid, sig) //nolint:errcheck
	}
}

// exitCode is the shell convention: the status, or 128+n for signal n.
func exitCode(ws syscall.WaitStatus) int {
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}
