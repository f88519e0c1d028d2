//go:build cgo

package trampoline

import (
	"syscall"

	"kernel.org/pub/linux/libs/security/libcap/psx"
)

// allThreadsSyscall runs a system call on every OS thread of the process
// (its fourth to sixth arguments zero, as prctl and capset need them):
// with cgo the runtime refuses syscall.AllThreadsSyscall and psx signals
// every pthread instead.
func allThreadsSyscall(nr, a1, a2, a3 uintptr) (uintptr, uintptr, syscall.Errno) {
	return psx.Syscall6(nr, a1, a2, a3, 0, 0, 0)
}
