//go:build !cgo

package trampoline

import "syscall"

// allThreadsSyscall runs a system call on every OS thread of the process
// (its fourth to sixth arguments zero, as prctl and capset need them).
// Without cgo the Go runtime does it itself; this is exactly what psx does
// in such a build, without importing psx, whose import path would order
// the protobuf and gRPC package initialisers before this package's init
// (see doc.go).
func allThreadsSyscall(nr, a1, a2, a3 uintptr) (uintptr, uintptr, syscall.Errno) {
	return syscall.AllThreadsSyscall6(nr, a1, a2, a3, 0, 0, 0)
}
