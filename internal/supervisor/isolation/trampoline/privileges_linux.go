package trampoline

import (
	"errors"
	"fmt"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// allThreadsPrctl runs prctl on every OS thread of the process.
func allThreadsPrctl(option, arg2 uintptr) error {
	if _, _, e := allThreadsSyscall(unix.SYS_PRCTL, option, arg2, 0); e != 0 {
		return e
	}
	return nil
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

// dropPrivileges makes every thread of the process uid/gid with no
// supplementary groups and no capabilities, and empties the bounding set
// of the calling thread: the one that will execve, whose bounding set is
// the only one the agent inherits (execve ends every other thread). A
// bounding-set drop on all threads costs a stop of every thread per
// capability, about 2 ms per spawn. It must run as root (CAP_SETPCAP,
// CAP_SETGID, CAP_SETUID) and checks the result on the calling thread.
func dropPrivileges(uid, gid uint32) error {
	if uid == 0 || gid == 0 {
		return fmt.Errorf("refusing to run the agent as uid %d gid %d", uid, gid)
	}
	last, err := lastCap()
	if err != nil {
		return err
	}
	if err := allThreadsPrctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL); err != nil {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	for c := 0; c <= last; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			return fmt.Errorf("drop capability %d from the bounding set (the supervisor needs CAP_SETPCAP): %w", c, err)
		}
	}
	// The Go runtime applies these to every thread.
	if err := syscall.Setgroups([]int{}); err != nil {
		return fmt.Errorf("clear supplementary groups: %w", err)
	}
	if err := syscall.Setresgid(int(gid), int(gid), int(gid)); err != nil {
		return fmt.Errorf("switch to gid %d: %w", gid, err)
	}
	if err := syscall.Setresuid(int(uid), int(uid), int(uid)); err != nil {
		return fmt.Errorf("switch to uid %d (is it mapped in this user namespace?): %w", uid, err)
	}
	// Leaving root clears the permitted, effective and ambient sets; the
	// inheritable set is cleared explicitly.
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if _, _, e := allThreadsSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return fmt.Errorf("clear capability sets: %w", e)
	}
	return checkUnprivileged(uid, gid, last)
}

// checkUnprivileged verifies on the calling thread what dropPrivileges
// promised; any capability left, in any set, is an error.
func checkUnprivileged(uid, gid uint32, last int) error {
	r, e, s := unix.Getresuid()
	if r != int(uid) || e != int(uid) || s != int(uid) {
		return fmt.Errorf("uid is %d/%d/%d after the switch, want %d", r, e, s, uid)
	}
	r, e, s = unix.Getresgid()
	if r != int(gid) || e != int(gid) || s != int(gid) {
		return fmt.Errorf("gid is %d/%d/%d after the switch, want %d", r, e, s, gid)
	}
	groups, err := unix.Getgroups()
	if err != nil {
		return fmt.Errorf("getgroups: %w", err)
	}
	if len(groups) != 0 {
		return fmt.Errorf("supplementary groups not cleared: %v", groups)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	for _, d := range data {
		if d.Effective != 0 || d.Permitted != 0 || d.Inheritable != 0 {
			return fmt.Errorf("capabilities left after the switch: %+v", data)
		}
	}
	for c := 0; c <= last; c++ {
		if v, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0); err != nil || v != 0 {
			return fmt.Errorf("capability %d is still in the bounding set", c)
		}
		if v, err := unix.PrctlRetInt(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_IS_SET, uintptr(c), 0, 0); err != nil || v != 0 {
			return fmt.Errorf("capability %d is still ambient", c)
		}
	}
	return nil
}

// setNoNewPrivs sets no_new_privs on every thread and checks it on the
// calling one.
func setNoNewPrivs() error {
	if err := allThreadsPrctl(unix.PR_SET_NO_NEW_PRIVS, 1); err != nil {
		return fmt.Errorf("set no_new_privs: %w", err)
	}
	if v, err := unix.PrctlRetInt(unix.PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("read no_new_privs: %w", err)
	} else if v != 1 {
		return errors.New("no_new_privs is not set")
	}
	return nil
}
