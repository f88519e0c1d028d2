package gateway

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/openshell-go/openshell/internal/errdefs"
)

// lockFileName is the single-instance lock in the state directory.
const lockFileName = "gateway.lock"

// lockStateDir takes the state directory's single-instance lock: an
// exclusive flock(2) on <dir>/gateway.lock, which then holds this
// process's pid. The lock lasts while the returned file is open; the
// kernel drops it when the process ends, however it ends. A second
// gateway on the same directory gets FailedPrecondition naming the
// holder's pid.
func lockStateDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, lockFileName)
	for {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, fmt.Errorf("state directory lock %s: %w", path, err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			holder := "unknown"
			if data, rerr := os.ReadFile(path); rerr == nil && strings.TrimSpace(string(data)) != "" {
				holder = strings.TrimSpace(string(data))
			}
			_ = f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, errdefs.FailedPrecondition(fmt.Sprintf(
					"state directory %s is in use by another openshell-gateway (pid %s); stop that gateway or give this one its own --state-dir", dir, holder))
			}
			return nil, fmt.Errorf("state directory lock %s: %w", path, err)
		}
		// A failed start-up removes the lock file it created; a file
		// locked after that removal is no longer the lock: open again.
		var held, named unix.Stat_t
		if unix.Fstat(int(f.Fd()), &held) != nil || unix.Stat(path, &named) != nil || held.Ino != named.Ino || held.Dev != named.Dev {
			_ = f.Close()
			continue
		}
		err = f.Truncate(0)
		if err == nil {
			_, err = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
		}
		if err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("state directory lock %s: %w", path, err)
		}
		return f, nil
	}
}

// startupRecord remembers what existed before a gateway start-up, so a
// start-up that fails can remove exactly what it created: a new state
// directory (or the new entries of an existing one, the lock file
// included) and a new SQLite database with its sidecar files. Nothing
// that existed before is touched, in particular never the -wal/-shm files
// of an existing database, which may hold committed data.
type startupRecord struct {
	stateDir string
	before   map[string]bool // entries of an existing state directory; nil when new or unreadable
	remove   []string        // new paths, removed whole
	keep     map[string]bool // never removed
}

// recordStartup takes the record. Call it before creating anything.
func recordStartup(stateDir, dbURL string) *startupRecord {
	r := &startupRecord{stateDir: filepath.Clean(stateDir), keep: map[string]bool{}}
	if top := firstMissing(r.stateDir); top != "" {
		r.remove = append(r.remove, top)
	} else if entries, err := os.ReadDir(r.stateDir); err == nil {
		r.before = map[string]bool{}
		for _, e := range entries {
			r.before[e.Name()] = true
		}
	}
	files := sqliteFiles(dbURL)
	if len(files) == 0 {
		return r
	}
	if firstMissing(files[0]) == "" {
		for _, f := range files {
			r.keep[f] = true
		}
		return r
	}
	for _, f := range files {
		if top := firstMissing(f); top != "" {
			r.remove = append(r.remove, top)
		}
	}
	return r
}

// undo removes what the start-up created. Call it only while holding the
// state directory lock (or before anything was created), after the store
// is closed.
func (r *startupRecord) undo(logger *slog.Logger) {
	paths := make([]string, 0, len(r.remove))
	if r.before != nil {
		entries, _ := os.ReadDir(r.stateDir)
		for _, e := range entries {
			if !r.before[e.Name()] {
				paths = append(paths, filepath.Join(r.stateDir, e.Name()))
			}
		}
	}
	for i := len(r.remove) - 1; i >= 0; i-- {
		paths = append(paths, r.remove[i])
	}
	for _, p := range paths {
		if r.keep[p] {
			continue
		}
		if err := os.RemoveAll(p); err != nil {
			logger.Warn("failed start-up: cannot remove what it created", "path", p, "err", err)
			continue
		}
		logger.Debug("failed start-up: removed what it created", "path", p)
	}
}

// firstMissing returns "" when path exists (or cannot be checked), else
// the top-most missing directory on the way to it (path itself when its
// parent exists).
func firstMissing(path string) string {
	p := filepath.Clean(path)
	if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
		return ""
	}
	for {
		parent := filepath.Dir(p)
		if parent == p {
			return p
		}
		if _, err := os.Lstat(parent); !errors.Is(err, fs.ErrNotExist) {
			return p
		}
		p = parent
	}
}

// sqliteFiles lists the files a sqlite: store URL may create, the
// database first; nil for other URLs and in-memory databases. A path
// with a '?' names both the literal file and the one SQLite opens (the
// part before the '?').
func sqliteFiles(dbURL string) []string {
	path, ok := strings.CutPrefix(dbURL, "sqlite:")
	if !ok {
		return nil
	}
	path = strings.TrimPrefix(path, "//")
	if path == "" || strings.HasPrefix(path, ":memory:") {
		return nil
	}
	names := []string{filepath.Clean(path)}
	if before, _, found := strings.Cut(path, "?"); found && before != "" {
		names = append(names, filepath.Clean(before))
	}
	var out []string
	for _, n := range names {
		out = append(out, n, n+"-wal", n+"-shm", n+"-journal")
	}
	return out
}
