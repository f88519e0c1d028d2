package compute

import (
	"os"
	"os/exec"
	"path/filepath"
)

// SupervisorName is the file name of the sandbox supervisor binary.
const SupervisorName = "openshell-sandbox"

// FindSupervisor looks for the supervisor binary next to the running
// executable, then on $PATH, and returns its absolute path. It returns the
// bare SupervisorName when neither has it, so a driver's ValidateCreate
// reports the missing binary.
func FindSupervisor() string {
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), SupervisorName)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			return p
		}
	}
	if p, err := exec.LookPath(SupervisorName); err == nil {
		if abs, err := filepath.Abs(p); err == nil {
			return abs
		}
	}
	return SupervisorName
}
