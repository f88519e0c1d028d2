// Package atomicfile writes files so that readers see either the old or
// the new content, never a partial write: the data goes to a temporary file
// in the same directory, which is renamed over the destination.
package atomicfile

import (
	"os"
	"path/filepath"
)

// Write writes data to path with perm (applied before any byte is
// written, so secrets never sit in a wider-open file).
func Write(path string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() { _ = os.Remove(tmp) }() // fails harmlessly after the rename
	if err := f.Chmod(perm); err != nil {
		_ = f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
