package cli

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/cobra"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

var update = flag.Bool("update", false, "rewrite golden files in testdata")

func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden (run go test -update): %v", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("%s mismatch (-want +got):\n%s", path, diff)
	}
}

// commandPaths lists every command path of the tree, e.g. ["sandbox", "exec"].
func commandPaths() [][]string {
	var out [][]string
	var walk func(c *cobra.Command, path []string)
	walk = func(c *cobra.Command, path []string) {
		out = append(out, path)
		for _, sub := range c.Commands() {
			if sub.Name() == "help" {
				continue
			}
			walk(sub, append(append([]string(nil), path...), sub.Name()))
		}
	}
	a := newApp(nil, &bytes.Buffer{}, &bytes.Buffer{})
	walk(a.newRootCmd(), nil)
	return out
}

func TestHelpGolden(t *testing.T) {
	paths := commandPaths()
	if len(paths) < 25 {
		t.Fatalf("only %d commands found", len(paths))
	}
	for _, p := range paths {
		name := "openshell"
		if len(p) > 0 {
			name += "_" + strings.Join(p, "_")
		}
		t.Run(name, func(t *testing.T) {
			tt := newTester(t)
			r := tt.run(append(append([]string(nil), p...), "--help")...)
			if r.err != nil {
				t.Fatalf("%v --help: %v", p, r.err)
			}
			checkGolden(t, filepath.Join("help", name+".golden"), r.stdout)
		})
	}
}

func listFake() *fakeGateway {
	return &fakeGateway{
		listSandboxes: func(_ context.Context, r *openshellv1.ListSandboxesRequest) (*openshellv1.ListSandboxesResponse, error) {
			a := testSandbox("alpha", openshellv1.SandboxPhase_SANDBOX_PHASE_READY)
			b := testSandbox("beta-longer-name", openshellv1.SandboxPhase_SANDBOX_PHASE_PROVISIONING)
			b.Metadata.CreatedAtMs = fixedNow.Add(-30 * 24 * 3600e9).UnixMilli()
			b.Spec.Template = nil
			return &openshellv1.ListSandboxesResponse{Sandboxes: []*openshellv1.Sandbox{a, b}}, nil
		},
		getSandbox: func(_ context.Context, r *openshellv1.GetSandboxRequest) (*openshellv1.SandboxResponse, error) {
			return &openshellv1.SandboxResponse{Sandbox: testSandbox(r.GetName(), openshellv1.SandboxPhase_SANDBOX_PHASE_READY)}, nil
		},
	}
}

func TestOutputGolden(t *testing.T) {
	ep := listFake().serve(t)
	for _, tc := range []struct {
		golden string
		args   []string
	}{
		{"list_table.golden", []string{"sandbox", "list"}},
		{"list_all_table.golden", []string{"sandbox", "list", "--all-workspaces"}},
		{"list_names.golden", []string{"sandbox", "list", "--names"}},
		{"list_json.golden", []string{"sandbox", "list", "-o", "json"}},
		{"list_yaml.golden", []string{"sandbox", "list", "-o", "yaml"}},
		{"get_table.golden", []string{"sb", "get", "alpha"}},
		{"get_json.golden", []string{"sandbox", "get", "alpha", "-o", "json"}},
	} {
		t.Run(tc.golden, func(t *testing.T) {
			tt := newTester(t)
			r := tt.run(append([]string{"--gateway-endpoint", ep}, tc.args...)...)
			if r.err != nil {
				t.Fatalf("run: %v (stderr %q)", r.err, r.stderr)
			}
			checkGolden(t, filepath.Join("output", tc.golden), r.stdout)
		})
	}
}
