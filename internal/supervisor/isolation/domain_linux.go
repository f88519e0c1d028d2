package isolation

import (
	"fmt"
	"os/exec"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/openshell-go/openshell/internal/supervisor/isolation/trampoline"
)

// domainThread is the OS thread every agent process of a Confinement is
// forked from. The thread alone (not the supervisor) is restricted by the
// Confinement's Landlock ruleset, so each agent process starts inside that
// one domain: the main process, every exec and every SSH session share
// it. Landlock's scopes then let agent processes signal each other and
// connect to each other's abstract unix sockets, while the supervisor and
// everything else outside the domain stays out of their reach. A domain
// per agent start (the trampoline restricting itself) would make sibling
// domains that cannot signal each other: an exec could not stop what the
// main process started.
type domainThread struct {
	once sync.Once
	err  error
	reqs chan func()
}

// Start starts cmd (from Command) on the agents' domain thread. It is
// exec.Cmd.Start with the child forked inside the agents' Landlock domain.
func (c *Confinement) Start(cmd *exec.Cmd) error {
	d := &c.domain
	d.once.Do(func() { d.err = d.run(c.landlockSpec()) })
	if d.err != nil {
		return fmt.Errorf("agent landlock domain: %w", d.err)
	}
	done := make(chan error, 1)
	d.reqs <- func() { done <- cmd.Start() }
	return <-done
}

// run starts the domain thread with the ruleset of spec and returns once
// it is restricted (or could not be).
func (d *domainThread) run(spec LandlockSpec) error {
	d.reqs = make(chan func())
	ready := make(chan error, 1)
	go func() {
		// Never unlocked: the restricted thread runs nothing but this
		// goroutine, and the Go runtime creates no thread from a locked
		// one (it asks its template thread), so the restriction reaches
		// no other goroutine of the supervisor.
		runtime.LockOSThread()
		if err := restrictThread(spec); err != nil {
			ready <- err
			return // the locked thread exits with the goroutine
		}
		ready <- nil
		for fn := range d.reqs {
			fn()
		}
	}()
	return <-ready
}

// restrictThread builds spec's ruleset while root (the paths are opened
// now) and enforces it on the calling thread. The supervisor's own binary
// is added read-only: the trampoline is a re-execution of it, from inside
// the domain. No ruleset (no Landlock under best effort) leaves the thread
// as it is.
func restrictThread(spec LandlockSpec) error {
	spec.ReadOnly = append(spec.ReadOnly[:len(spec.ReadOnly):len(spec.ReadOnly)], Path{Path: selfExe, Optional: true})
	fd, _, err := trampoline.BuildRuleset(spec, LandlockABI())
	if err != nil || fd < 0 {
		return err
	}
	defer unix.Close(fd) //nolint:errcheck // enforced or failed; not needed afterwards
	return trampoline.RestrictThread(fd)
}
