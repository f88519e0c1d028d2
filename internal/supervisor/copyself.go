package supervisor

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// copySelf installs this executable at dst (mode 0755). The Kubernetes
// driver's init container runs `openshell-sandbox copy-self DST` from the
// supervisor image to put the supervisor into a volume shared with the
// agent container, whose image need not contain it.
func copySelf(args []string, stdout io.Writer) error {
	if len(args) != 1 || args[0] == "" {
		return errors.New("usage: openshell-sandbox copy-self DESTINATION")
	}
	dst := args[0]
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("copy-self: find own executable: %w", err)
	}
	src, err := os.Open(self)
	if err != nil {
		return fmt.Errorf("copy-self: %w", err)
	}
	defer func() { _ = src.Close() }()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("copy-self: %w", err)
	}
	// Write next to the destination and rename, so a reader never sees a
	// partial binary.
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".openshell-sandbox-*")
	if err != nil {
		return fmt.Errorf("copy-self: %w", err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if _, err := io.Copy(tmp, src); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("copy-self: %w", err)
	}
	if err := tmp.Chmod(0o755); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("copy-self: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("copy-self: %w", err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return fmt.Errorf("copy-self: %w", err)
	}
	_, _ = fmt.Fprintf(stdout, "installed openshell-sandbox at %s\n", dst)
	return nil
}
