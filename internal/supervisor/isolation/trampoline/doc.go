// Package trampoline is the agent side of package isolation: the code that
// runs in the re-executed supervisor binary, confines it and execve's the
// agent (the steps are listed in package isolation's documentation).
//
// It is a package of its own so that its init function runs as early as
// possible in the re-executed binary. Go initialises packages in import
// path order, each one as soon as everything it imports is initialised: an
// import that sorts after google.golang.org and is not already initialised
// by then lets every ready protobuf and gRPC package initialise first
// (about half a millisecond per spawn). So this package imports only part
// of the standard library (not path/filepath), golang.org/x/sys/unix and
// golang.org/x/net/bpf: not the policy types (which pull in protobuf), and
// not go-landlock or psx (kernel.org). The Landlock system calls are
// therefore made here directly, and psx is used only in cgo builds, where
// the runtime refuses syscall.AllThreadsSyscall. Package isolation's
// TestTrampolineInitialisesBeforeProtobuf checks the order (without cgo,
// as the binaries are built).
//
// The trampoline runs with GOGC=off and GOMAXPROCS=1 in its own
// environment (the agent gets the spec's environment).
package trampoline
