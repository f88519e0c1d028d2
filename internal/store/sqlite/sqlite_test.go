package sqlite_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openshell-go/openshell/internal/store"
	"github.com/openshell-go/openshell/internal/store/sqlite"
	"github.com/openshell-go/openshell/internal/store/storetest"
)

func openFile(t testing.TB, path string) *sqlite.Store {
	t.Helper()
	s, err := sqlite.Open(t.Context(), path, sqlite.Options{})
	if err != nil {
		t.Fatalf("Open(%q): %v", path, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformanceFile(t *testing.T) {
	storetest.Run(t, func(t testing.TB) store.Store {
		return openFile(t, filepath.Join(t.TempDir(), "gateway.db"))
	})
}

func TestConformanceMemory(t *testing.T) {
	storetest.Run(t, func(t testing.TB) store.Store { return openFile(t, sqlite.Memory) })
}

func TestFileModes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "missing", "state")
	path := filepath.Join(dir, "gateway.db")
	s := openFile(t, path)
	if _, err := s.Create(t.Context(), store.TypeSandbox, storetest.Sandbox("a", "default", "a", nil)); err != nil {
		t.Fatal(err)
	}
	wantMode := func(p string, want fs.FileMode) {
		t.Helper()
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != want {
			t.Fatalf("mode of %s = %v, want %v", p, got, want)
		}
	}
	wantMode(dir, 0o700)
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		wantMode(p, 0o600)
	}
	// Reopening repairs modes loosened in between.
	s.Close()
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		if err := os.Chmod(p, 0o644); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	s2 := openFile(t, path)
	if err := s2.Get(t.Context(), store.TypeSandbox, "a", storetest.Sandbox("", "", "", nil)); err != nil {
		t.Fatalf("Get after reopen: %v", err)
	}
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		if _, err := os.Stat(p); err == nil {
			wantMode(p, 0o600)
		}
	}
}

func TestUnwritablePath(t *testing.T) {
	var path string
	if os.Geteuid() == 0 {
		// root ignores modes; /proc refuses new files for everyone.
		path = "/proc/self/openshell-gateway.db"
	} else {
		dir := t.TempDir()
		if err := os.Chmod(dir, 0o500); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Chmod(dir, 0o700) })
		path = filepath.Join(dir, "gateway.db")
	}
	_, err := sqlite.Open(t.Context(), path, sqlite.Options{})
	if err == nil {
		t.Fatalf("Open(%q) succeeded on an unwritable path", path)
	}
	if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "cannot open for writing") {
		t.Fatalf("Open(%q) error = %q, want it to name the path and the cause", path, err)
	}
}

func TestMigrationsIdempotent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gateway.db")
	openFile(t, path).Close()
	s := openFile(t, path)
	files, err := fs.Glob(os.DirFS("migrations"), "*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("migrations = %v, %v", files, err)
	}
	var n int
	if err := s.SQL().QueryRowContext(t.Context(), `SELECT COUNT(*) FROM schema_migrations`).Scan(&n); err != nil || n != len(files) {
		t.Fatalf("schema_migrations rows = %d, %v; want one per migration (%d)", n, err, len(files))
	}
}
