package computetrace_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/openshell-go/openshell/internal/citest"
	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/compute/computetest"
	"github.com/openshell-go/openshell/internal/compute/computetrace"
	"github.com/openshell-go/openshell/internal/compute/process"
)

var fakeSupervisor string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "computetrace-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if runtime.GOOS == "linux" {
		fakeSupervisor = filepath.Join(dir, "openshell-sandbox")
		out, err := exec.Command("go", "build", "-o", fakeSupervisor, "../process/testdata/fakesupervisor").CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "build fake supervisor: %v\n%s", err, out)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func newProcess(t *testing.T) compute.Driver {
	t.Helper()
	d, err := process.New(map[string]any{"supervisor_path": fakeSupervisor, "stop_grace_secs": 5},
		compute.FactoryDeps{Logger: slog.New(slog.NewTextHandler(t.Output(), nil)), StateDir: t.TempDir(), GatewayEndpoint: "unix:///run/openshell/sandbox.sock"})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestProcessConformanceTraced: the process driver wrapped by computetrace
// passes the driver conformance suite and keeps its abilities.
func TestProcessConformanceTraced(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the process driver needs Linux")
	}
	probe := newProcess(t)
	defer probe.(io.Closer).Close()
	if err := probe.ValidateCreate(t.Context(), compute.Sandbox{ID: "p", Name: "p"}); err != nil {
		citest.SkipOrFail(t, "process driver unusable here: %v", err)
	}
	wrapped := computetrace.New(probe, "process")
	_, inCloser := probe.(io.Closer)
	_, outCloser := wrapped.(io.Closer)
	_, inLis := probe.(compute.ListenerRequirer)
	_, outLis := wrapped.(compute.ListenerRequirer)
	_, inScope := probe.(compute.WorkspaceScoper)
	_, outScope := wrapped.(compute.WorkspaceScoper)
	if inCloser != outCloser || inLis != outLis || inScope != outScope {
		t.Errorf("wrapped process driver abilities closer/listeners/scoper = %v/%v/%v, want %v/%v/%v",
			outCloser, outLis, outScope, inCloser, inLis, inScope)
	}
	computetest.Run(t, func(t *testing.T) compute.Driver {
		d := computetrace.New(newProcess(t), "process")
		t.Cleanup(func() {
			list, _ := d.List(context.Background())
			for _, sb := range list {
				_, _ = d.Delete(context.Background(), compute.Ref{ID: sb.ID})
			}
			d.(io.Closer).Close()
		})
		return d
	}, computetest.Options{Sandbox: func(id, name string) compute.Sandbox {
		return compute.Sandbox{ID: id, Name: name, Workspace: "default", Spec: compute.Spec{
			SandboxToken: "eyJ.test-token.sig", Command: []string{"/bin/sh", "-c", "sleep 60"},
		}}
	}})
}
