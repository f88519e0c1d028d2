//go:build !cgo

package isolation_test

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/openshell-go/openshell/internal/supervisor/isolation"
)

// heavyInits are the packages (prefixes) whose initialisers the trampoline
// must not wait for: the generated API types and the protobuf registry
// behind them (small leaf packages such as protowire may come first; they
// cost nothing).
var heavyInits = []string{
	"github.com/openshell-go/openshell/api/",
	"google.golang.org/protobuf/internal/filedesc",
	"google.golang.org/protobuf/internal/impl",
	"google.golang.org/protobuf/reflect/protoregistry",
	"google.golang.org/protobuf/types/",
	"google.golang.org/grpc",
}

// TestTrampolineInitialisesBeforeProtobuf runs this test binary as the
// trampoline (it links package isolation like the supervisor does) with
// an undecodable spec and GODEBUG=inittrace=1, and checks that no protobuf
// or gRPC package was initialised before the trampoline took over: their
// initialisers cost every agent spawn about half a millisecond. Only
// without cgo: with cgo the trampoline imports psx, whose import path
// sorts after google.golang.org (the shipped binaries are built without
// cgo).
func TestTrampolineInitialisesBeforeProtobuf(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	specR, specW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	statusR, statusW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd := &exec.Cmd{
		Path:       self,
		Args:       []string{isolation.TrampolineArg0},
		Env:        []string{"GODEBUG=inittrace=1"},
		ExtraFiles: []*os.File{specR, statusW},
		Stderr:     &stderr,
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	specR.Close()
	statusW.Close()
	_, _ = specW.WriteString("not json")
	specW.Close()
	var status bytes.Buffer
	_, _ = status.ReadFrom(statusR)
	_ = cmd.Wait()
	if !strings.Contains(status.String(), "decode agent spec") {
		t.Fatalf("trampoline status = %q, want a spec decoding error", status.String())
	}
	var inits int
	for _, line := range strings.Split(stderr.String(), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "init" {
			continue
		}
		inits++
		for _, heavy := range heavyInits {
			if strings.HasPrefix(f[1], heavy) {
				t.Errorf("package %s was initialised before the trampoline ran", f[1])
			}
		}
	}
	if inits == 0 {
		t.Fatalf("no init trace on the trampoline's stderr: %q", stderr.String())
	}
}
