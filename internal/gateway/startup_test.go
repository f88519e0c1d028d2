package gateway

import (
	"bytes"
	"context"
	"io/fs"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	storeopen "github.com/openshell-go/openshell/internal/store/open"
)

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// tree maps every path under dir to its mode and, for regular files, its
// content.
func tree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := e.Info()
		if err != nil {
			return err
		}
		v := info.Mode().String()
		if info.Mode().IsRegular() && !strings.Contains(filepath.Base(p), ".db") { // a database may be rewritten, never removed
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			v += " " + string(data)
		}
		out[p] = v
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestFailedStartupLeavesNothing: a start-up that fails removes what it
// created (state directory or its new entries, a new database file and
// the directories made for it) and keeps everything that existed before.
func TestFailedStartupLeavesNothing(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(t *testing.T, base string) (dbURL string)
		state   func(base string) string
		args    []string
		wantErr string
	}{
		{
			name: "file that is not a database",
			setup: func(t *testing.T, base string) string {
				writeTestFile(t, filepath.Join(base, "junk.db"), "not a database")
				return "sqlite:" + filepath.Join(base, "junk.db")
			},
			wantErr: "file is not a database",
		},
		{
			name: "database path that is a directory",
			setup: func(_ *testing.T, base string) string {
				return "sqlite:" + filepath.Join(base, "new", "db.d") + "/"
			},
			wantErr: "is a directory",
		},
		{
			name: "new database the driver cannot open",
			setup: func(_ *testing.T, base string) string {
				return "sqlite:" + filepath.Join(base, "dbdir", "x.db") + "?_pragma=journal_mode(BOGUS)"
			},
			wantErr: "open store",
		},
		{
			name: "late failure with existing state directory and database",
			setup: func(t *testing.T, base string) string {
				state := filepath.Join(base, "state")
				if err := os.MkdirAll(state, 0o700); err != nil {
					t.Fatal(err)
				}
				writeTestFile(t, filepath.Join(state, "notes.txt"), "kept")
				url := "sqlite:" + filepath.Join(state, "openshell.db")
				st, err := storeopen.Open(t.Context(), url, nil)
				if err != nil {
					t.Fatal(err)
				}
				if err := ensureDefaultWorkspace(t.Context(), st); err != nil {
					t.Fatal(err)
				}
				if err := st.Close(); err != nil {
					t.Fatal(err)
				}
				return url
			},
			args:    []string{"--drivers", "bogus"},
			wantErr: "compute driver bogus",
		},
		{
			name: "late failure with new state directory",
			setup: func(_ *testing.T, base string) string {
				return "sqlite:" + filepath.Join(base, "state", "openshell.db")
			},
			args:    []string{"--drivers", "bogus"},
			wantErr: "compute driver bogus",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := t.TempDir()
			t.Setenv("XDG_CONFIG_HOME", filepath.Join(base, "config"))
			t.Setenv("XDG_STATE_HOME", filepath.Join(base, "xdg-state"))
			dbURL := tt.setup(t, base)
			before := tree(t, base)
			args := append([]string{"--disable-tls", "--port", freePort(t), "--state-dir", filepath.Join(base, "state"), "--db-url", dbURL}, tt.args...)
			var stderr bytes.Buffer
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second) // a start-up that wrongly succeeds serves until then
			defer cancel()
			err := Run(ctx, args, &stderr, &stderr)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || ExitCode(err) != 1 {
				t.Fatalf("Run(%q) = %v (exit %d), want an error containing %q, exit 1", args, err, ExitCode(err), tt.wantErr)
			}
			after := tree(t, base)
			if !maps.Equal(before, after) {
				var added, changed []string
				for p, v := range after {
					if w, ok := before[p]; !ok {
						added = append(added, p)
					} else if v != w {
						changed = append(changed, p)
					}
				}
				slices.Sort(added)
				t.Errorf("failed start-up (%v) left behind %q, changed %q", err, added, changed)
			}
		})
	}
}

func writeTestFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
