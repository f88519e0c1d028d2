package supervisor

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/openshell-go/openshell/internal/atomicfile"
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
	data, err := os.ReadFile(self)
	if err != nil {
		return fmt.Errorf("copy-self: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("copy-self: %w", err)
	}
	// Renamed into place, so the agent container never sees a partial binary.
	if err := atomicfile.Write(dst, data, 0o755); err != nil {
		return fmt.Errorf("copy-self: %w", err)
	}
	_, _ = fmt.Fprintf(stdout, "installed openshell-sandbox at %s\n", dst)
	return nil
}
