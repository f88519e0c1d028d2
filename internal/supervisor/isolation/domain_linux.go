package isolation

import (
	"errors"
	"fmt"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// domainThread is the OS thread every agent process of a Confinement is
// forked from. The thread alone, not the rest of the supervisor, carries
// the confinement the agents inherit through fork and execve: an empty
// capability bounding set and no inheritable or ambient capabilities,
// no_new_privs, the Confinement's Landlock domain and the seccomp filter
// (all of them per-thread attributes in Linux). The forked child then only
// switches to the agent's uid and gid (os/exec's Credential: setgroups to
// none, setgid, setuid, which as root clears the permitted and effective
// sets), changes to its directory and execve's the agent: no trampoline,
// no second program start per agent process.
//
// Every agent process of a Confinement (main process, execs, SSH
// sessions) therefore shares one Landlock domain: Landlock's scopes let
// them signal each other and connect to each other's abstract unix
// sockets, while the supervisor and everything else outside the domain
// stays out of their reach.
type domainThread struct {
	once sync.Once
	err  error
	reqs chan func()
}

// start runs cmd.Start on the domain thread, after marking every
// descriptor of the supervisor close-on-exec (the agent gets its stdio and
// nothing else the supervisor holds; os/exec clears the flag on what it
// passes).
func (d *domainThread) start(c *Confinement, cmd *exec.Cmd) error {
	d.once.Do(func() { d.err = d.run(c.landlockSpec()) })
	if d.err != nil {
		return fmt.Errorf("agent confinement failed: %w", d.err)
	}
	done := make(chan error, 1)
	d.reqs <- func() {
		if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
			done <- fmt.Errorf("mark the supervisor's descriptors close-on-exec: %w", err)
			return
		}
		done <- cmd.Start()
	}
	return <-done
}

// run starts the domain thread, confined by spec's Landlock rules, and
// returns once it is confined (or could not be).
func (d *domainThread) run(spec LandlockSpec) error {
	d.reqs = make(chan func())
	ready := make(chan error, 1)
	go func() {
		// Never unlocked: the confined thread runs nothing but this
		// goroutine, and the Go runtime creates no thread from a locked
		// one (it asks its template thread), so the confinement reaches
		// no other goroutine of the supervisor.
		runtime.LockOSThread()
		if err := confineThread(spec); err != nil {
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

// confineThread confines the calling (locked) OS thread as agents must
// start: it builds the Landlock ruleset while root (the rule paths are
// opened now, so DAC does not hide a granted path), empties the
// capability bounding set and the inheritable and ambient sets, sets
// no_new_privs, enforces the ruleset and installs the seccomp filter, each
// on this thread only; then checks what the agents will inherit.
func confineThread(spec LandlockSpec) error {
	prog, err := filterProgram()
	if err != nil {
		return err
	}
	rulesetFD, _, err := buildRuleset(spec, LandlockABI())
	if err != nil {
		return err
	}
	if rulesetFD >= 0 {
		defer unix.Close(rulesetFD) //nolint:errcheck // enforced or failed; not needed afterwards
	}
	last, err := lastCap()
	if err != nil {
		return err
	}
	if err := dropThreadCaps(last); err != nil {
		return err
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("set no_new_privs: %w", err)
	}
	if rulesetFD >= 0 {
		if err := landlockRestrictThread(rulesetFD); err != nil {
			return err
		}
	}
	if err := loadFilter(prog); err != nil {
		return err
	}
	return checkThread(last)
}

// lastCap is the highest capability number the kernel knows.
func lastCap() (int, error) {
	for c := 0; c < 64; c++ {
		if _, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0); err != nil {
			if errors.Is(err, unix.EINVAL) && c > 0 {
				return c - 1, nil
			}
			return 0, fmt.Errorf("read capability bounding set: %w", err)
		}
	}
	return 63, nil
}

// dropThreadCaps clears the ambient set, drops every capability from the
// bounding set and clears the inheritable set of the calling thread,
// keeping its effective and permitted sets (CAP_SETUID and CAP_SETGID are
// still needed to switch to the agent's ids after the fork).
func dropThreadCaps(last int) error {
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	for c := 0; c <= last; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			return fmt.Errorf("drop capability %d from the bounding set (the supervisor needs CAP_SETPCAP): %w", c, err)
		}
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	data[0].Inheritable, data[1].Inheritable = 0, 0
	// capset(2) on this thread only (Go's syscall.Capset would not be
	// per-thread either way; the raw call makes it explicit).
	if _, _, e := syscall.RawSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return fmt.Errorf("clear inheritable capabilities: %w", e)
	}
	return nil
}

// Securebits (linux/securebits.h) that keep capabilities across setuid.
const (
	secbitNoSetuidFixup = 1 << 2
	secbitKeepCaps      = 1 << 4
)

// checkThread verifies on the calling thread what an agent forked from it
// inherits: no bounding, ambient or inheritable capability, no_new_privs,
// and securebits that let setuid clear the permitted and effective sets.
func checkThread(last int) error {
	for c := 0; c <= last; c++ {
		if v, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0); err != nil || v != 0 {
			return fmt.Errorf("capability %d is still in the bounding set", c)
		}
		if v, err := unix.PrctlRetInt(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_IS_SET, uintptr(c), 0, 0); err != nil || v != 0 {
			return fmt.Errorf("capability %d is still ambient", c)
		}
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	if data[0].Inheritable != 0 || data[1].Inheritable != 0 {
		return fmt.Errorf("inheritable capabilities left: %#x %#x", data[0].Inheritable, data[1].Inheritable)
	}
	if v, err := unix.PrctlRetInt(unix.PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("read no_new_privs: %w", err)
	} else if v != 1 {
		return errors.New("no_new_privs is not set")
	}
	// SECBIT_KEEP_CAPS or SECBIT_NO_SETUID_FIXUP would keep the
	// capabilities across the switch to the agent's uid.
	bits, err := unix.PrctlRetInt(unix.PR_GET_SECUREBITS, 0, 0, 0, 0)
	if err != nil {
		return fmt.Errorf("read securebits: %w", err)
	}
	if bits&(secbitKeepCaps|secbitNoSetuidFixup) != 0 {
		return fmt.Errorf("securebits %#x keep capabilities across setuid", bits)
	}
	return nil
}
