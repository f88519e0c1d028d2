//go:build linux

package process_test

import (
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/compute/computetest"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// TestRecoverKeepsUnloadableState proves that a sandbox directory whose
// state cannot be loaded survives Open with its workspace untouched, is
// reported in error, and is never written by Stop, Start or Create.
// Run as uid 65534 by TestUnprivileged it also covers EACCES.
func TestRecoverKeepsUnloadableState(t *testing.T) {
	valid := func(id string) []byte {
		data, _ := json.Marshal(map[string]any{"id": id, "name": "kept", "instance_id": "i-1", "stopped": true,
			"transition": time.Now().UTC()})
		return data
	}
	tests := []struct {
		name    string
		setup   func(t *testing.T, dir, id string) // dir/workspace exists with a user file
		wantMsg string
	}{
		{"state.json is a directory", func(t *testing.T, dir, _ string) {
			mkdir(t, filepath.Join(dir, "state.json"))
		}, "is a directory"},
		{"corrupt state.json", func(t *testing.T, dir, _ string) {
			writeFile(t, filepath.Join(dir, "state.json"), []byte(`{"id": "trunc`), 0o600)
		}, "unexpected end of JSON input"},
		{"state.json of another sandbox", func(t *testing.T, dir, _ string) {
			writeFile(t, filepath.Join(dir, "state.json"), valid("someone-else"), 0o600)
		}, `records sandbox "someone-else"`},
		{"state.json missing, workspace in use", func(*testing.T, string, string) {},
			"state.json is missing but the workspace holds files"},
	}
	if os.Getuid() != 0 {
		tests = append(tests, struct {
			name    string
			setup   func(t *testing.T, dir, id string)
			wantMsg string
		}{"state.json unreadable (EACCES)", func(t *testing.T, dir, id string) {
			writeFile(t, filepath.Join(dir, "state.json"), valid(id), 0o000)
		}, "permission denied"})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			state := t.TempDir()
			id := computetest.NewID()
			dir := filepath.Join(state, "sandboxes", id)
			userFile := filepath.Join(dir, "workspace", "notes.txt")
			mkdir(t, filepath.Dir(userFile))
			writeFile(t, userFile, []byte("user data"), 0o644)
			tt.setup(t, dir, id)
			before := snapshot(t, dir)

			d := open(t, state, nil)
			if after := snapshot(t, dir); !maps.Equal(before, after) {
				t.Fatalf("Open changed the sandbox directory:\nbefore %v\nafter  %v", before, after)
			}
			got, err := d.Get(t.Context(), compute.Ref{ID: id})
			if err != nil {
				t.Fatalf("Get(%s) after Open error = %v, want the sandbox reported in error", id, err)
			}
			c, _ := computetest.Cond(got, compute.ConditionReady)
			if c.Status != "False" || c.Reason != "Error" || !strings.Contains(c.Message, tt.wantMsg) || !strings.Contains(c.Message, "kept untouched") {
				t.Errorf("Ready condition = %+v, want False/Error naming %q and the kept directory", c, tt.wantMsg)
			}
			if list, _ := d.List(t.Context()); len(list) != 1 || list[0].ID != id {
				t.Errorf("List() = %+v, want only %s", list, id)
			}
			for op, f := range map[string]func() error{
				"Stop":  func() error { return d.Stop(t.Context(), compute.Ref{ID: id}) },
				"Start": func() error { return d.Start(t.Context(), compute.Ref{ID: id}) },
			} {
				if err := f(); errdefs.Code(err) != codes.FailedPrecondition {
					t.Errorf("%s() on unloadable sandbox error = %v, want FailedPrecondition", op, err)
				}
			}
			d.Close()
			// A second driver (a new gateway process) sees the same.
			d2 := open(t, state, nil)
			if _, err := d2.Get(t.Context(), compute.Ref{ID: id}); err != nil {
				t.Errorf("Get(%s) after a second Open error = %v", id, err)
			}
			d2.Close()
			if after := snapshot(t, dir); !maps.Equal(before, after) {
				t.Errorf("sandbox directory changed:\nbefore %v\nafter  %v", before, after)
			}
		})
	}
}

// TestCreateKeepsExistingDirectory: a create whose directory exists (a
// sandbox the driver could not load) fails without touching it.
func TestCreateKeepsExistingDirectory(t *testing.T) {
	requireNamespaces(t)
	state := t.TempDir()
	d := open(t, state, nil)
	sb := goodSandbox(computetest.NewID(), computetest.NewName())
	userFile := filepath.Join(state, "sandboxes", sb.ID, "workspace", "notes.txt")
	mkdir(t, filepath.Dir(userFile))
	writeFile(t, userFile, []byte("user data"), 0o644)
	if err := d.Create(t.Context(), sb); errdefs.Code(err) != codes.AlreadyExists {
		t.Fatalf("Create() over an existing directory error = %v, want AlreadyExists", err)
	}
	if data, err := os.ReadFile(userFile); err != nil || string(data) != "user data" {
		t.Errorf("user file after Create = %q, %v, want it untouched", data, err)
	}
	if _, err := d.Get(t.Context(), compute.Ref{ID: sb.ID}); errdefs.Code(err) != codes.NotFound {
		t.Errorf("Get after failed Create error = %v, want NotFound", err)
	}
}

func mkdir(t testing.TB, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t testing.TB, name string, data []byte, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(name, data, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(name, mode); err != nil { // umask-proof
		t.Fatal(err)
	}
}

// snapshot maps every path under dir to its mode and (for readable
// regular files) content.
func snapshot(t testing.TB, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := e.Info()
		if err != nil {
			return err
		}
		v := info.Mode().String()
		if info.Mode().IsRegular() {
			if data, err := os.ReadFile(p); err == nil {
				v += " " + string(data)
			} else if !errors.Is(err, os.ErrPermission) {
				return err
			}
		}
		out[p] = v
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
