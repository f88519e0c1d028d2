package securityevent

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
)

// SinkStdout is the sink name for standard output.
const SinkStdout = "stdout"

// Defaults of the file sink's rotation.
const (
	DefaultMaxSizeMB = 100
	DefaultMaxFiles  = 5
)

// OpenSink opens the sink named by spec: "stdout", or an absolute file path
// (created 0600, appended to, rotated when a write would take it past
// maxSizeMB megabytes; maxFiles rotated files path.1 … path.N are kept).
// stdout is used for standard output. Close the result when done.
func OpenSink(spec string, maxSizeMB, maxFiles int, stdout io.Writer) (io.WriteCloser, error) {
	if spec == SinkStdout {
		return nopCloser{stdout}, nil
	}
	if !filepath.IsAbs(spec) {
		return nil, fmt.Errorf("security event sink %q: want %q or an absolute file path", spec, SinkStdout)
	}
	if maxSizeMB <= 0 || maxFiles < 0 {
		return nil, errors.New("security event sink: max size must be positive and max files not negative")
	}
	if err := os.MkdirAll(filepath.Dir(spec), 0o700); err != nil {
		return nil, fmt.Errorf("security event sink: %w", err)
	}
	f := &RotatingFile{Path: spec, MaxBytes: int64(maxSizeMB) << 20, MaxFiles: maxFiles}
	if err := f.open(); err != nil {
		return nil, err
	}
	return f, nil
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }

// RotatingFile appends to Path and rotates it by size. Safe for concurrent
// use. A line is never split across files.
type RotatingFile struct {
	Path     string
	MaxBytes int64
	MaxFiles int

	mu   sync.Mutex
	f    *os.File
	size int64
}

func (r *RotatingFile) open() error {
	f, err := os.OpenFile(r.Path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("security event sink: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("security event sink: %w", err)
	}
	r.f, r.size = f, st.Size()
	return nil
}

// Write appends p, rotating first when p would take the file past MaxBytes.
func (r *RotatingFile) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.f == nil {
		if err := r.open(); err != nil {
			return 0, err
		}
	}
	if r.size > 0 && r.size+int64(len(p)) > r.MaxBytes {
		if err := r.rotate(); err != nil {
			return 0, err
		}
	}
	n, err := r.f.Write(p)
	r.size += int64(n)
	return n, err
}

// rotate shifts path.N-1 → path.N … path → path.1 and reopens path.
func (r *RotatingFile) rotate() error {
	if err := r.f.Close(); err != nil {
		return err
	}
	r.f = nil
	if r.MaxFiles == 0 {
		if err := os.Remove(r.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return r.open()
	}
	for i := r.MaxFiles - 1; i >= 1; i-- {
		if err := os.Rename(fmt.Sprintf("%s.%d", r.Path, i), fmt.Sprintf("%s.%d", r.Path, i+1)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	if err := os.Rename(r.Path, r.Path+".1"); err != nil {
		return err
	}
	return r.open()
}

// Close closes the file.
func (r *RotatingFile) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.f == nil {
		return nil
	}
	err := r.f.Close()
	r.f = nil
	return err
}
