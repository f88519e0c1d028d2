package isolation

import (
	"errors"
	"fmt"
	"syscall"

	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
)

// LandlockABI is the kernel's Landlock ABI version, 0 when Landlock is not
// available (not built in, or not enabled at boot).
func LandlockABI() int {
	v, err := ll.LandlockGetABIVersion()
	if err != nil || v < 0 {
		return 0
	}
	return v
}

// handledFS is every filesystem right the kernel's ABI knows: each one not
// granted by a rule is denied.
func handledFS(abi int) uint64 {
	var h uint64
	switch {
	case abi <= 0:
		return 0
	case abi >= 9:
		h |= ll.AccessFSResolveUnix
		fallthrough
	case abi >= 5:
		h |= ll.AccessFSIoctlDev
		fallthrough
	case abi >= 3:
		h |= ll.AccessFSTruncate
		fallthrough
	case abi >= 2:
		h |= ll.AccessFSRefer
		fallthrough
	default:
		h |= ll.AccessFSExecute | ll.AccessFSWriteFile | ll.AccessFSReadFile | ll.AccessFSReadDir |
			ll.AccessFSRemoveDir | ll.AccessFSRemoveFile | ll.AccessFSMakeChar | ll.AccessFSMakeDir |
			ll.AccessFSMakeReg | ll.AccessFSMakeSock | ll.AccessFSMakeFifo | ll.AccessFSMakeBlock |
			ll.AccessFSMakeSym
	}
	return h
}

const (
	// readOnlyRights: read files, list directories, execute.
	readOnlyRights = ll.AccessFSExecute | ll.AccessFSReadFile | ll.AccessFSReadDir
	// fileRights are the rights that apply to a non-directory.
	fileRights = ll.AccessFSExecute | ll.AccessFSWriteFile | ll.AccessFSReadFile |
		ll.AccessFSTruncate | ll.AccessFSIoctlDev
)

// LandlockSpec is the Landlock part of a Spec.
type LandlockSpec struct {
	ReadOnly  []Path `json:"read_only,omitempty"`
	ReadWrite []Path `json:"read_write,omitempty"`
	Hard      bool   `json:"hard,omitempty"`
}

// PathProblem is a rule path that cannot be used.
type PathProblem struct {
	Path string
	Err  error
}

func (p PathProblem) Error() string { return fmt.Sprintf("landlock path %s: %v", p.Path, p.Err) }

// reason is the human-readable cause of a path problem.
func (p PathProblem) Reason() string {
	switch {
	case errors.Is(p.Err, unix.ENOENT):
		return "path does not exist"
	case errors.Is(p.Err, unix.EACCES), errors.Is(p.Err, unix.EPERM):
		return "permission denied"
	case errors.Is(p.Err, unix.ELOOP):
		return "symlink loop"
	}
	return p.Err.Error()
}

// buildRuleset creates the Landlock ruleset for s with the kernel's ABI.
// It returns -1 when nothing is to be enforced (no Landlock under best
// effort, or no usable path), and the problems with the skipped paths.
// Under s.Hard every problem, and a kernel without Landlock, is an error.
func buildRuleset(s LandlockSpec, abi int) (fd int, skipped []PathProblem, err error) {
	if abi <= 0 {
		if s.Hard {
			return -1, nil, errors.New("landlock is required (hard_requirement) but the kernel does not support it")
		}
		return -1, nil, nil
	}
	handled := handledFS(abi)
	attr := ll.RulesetAttr{HandledAccessFS: handled}
	fd, err = ll.LandlockCreateRuleset(&attr, 0)
	if err != nil {
		if s.Hard {
			return -1, nil, fmt.Errorf("landlock_create_ruleset: %w", err)
		}
		return -1, nil, nil
	}
	added := 0
	add := func(p Path, rights uint64) error {
		perr := addRule(fd, p.Path, rights&handled)
		if perr == nil {
			added++
			return nil
		}
		pp := PathProblem{Path: p.Path, Err: perr}
		if s.Hard && !p.Optional {
			return pp
		}
		if !p.Optional || !errors.Is(perr, unix.ENOENT) {
			skipped = append(skipped, pp)
		}
		return nil
	}
	for _, p := range s.ReadOnly {
		if err := add(p, readOnlyRights); err != nil {
			unix.Close(fd) //nolint:errcheck // the ruleset is abandoned
			return -1, skipped, err
		}
	}
	for _, p := range s.ReadWrite {
		if err := add(p, handled); err != nil {
			unix.Close(fd) //nolint:errcheck // the ruleset is abandoned
			return -1, skipped, err
		}
	}
	if added == 0 {
		unix.Close(fd) //nolint:errcheck // the ruleset is abandoned
		if s.Hard {
			return -1, skipped, errors.New("landlock is required (hard_requirement) but no rule path could be opened")
		}
		return -1, skipped, nil
	}
	return fd, skipped, nil
}

// addRule adds a path-beneath rule for path; a non-directory gets only the
// rights that apply to files.
func addRule(rulesetFD int, path string, rights uint64) error {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd) //nolint:errcheck // an O_PATH descriptor
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		rights &= fileRights
	}
	if rights == 0 {
		return nil
	}
	return ll.LandlockAddPathBeneathRule(rulesetFD, &ll.PathBeneathAttr{ParentFd: fd, AllowedAccess: rights}, 0)
}

// CheckLandlock reports, from the supervisor's point of view, what the
// trampoline will do with c's Landlock rules: the kernel's ABI and the
// paths it will skip. Under hard_requirement a problem is an error.
func (c *Confinement) CheckLandlock() (abi int, skipped []PathProblem, err error) {
	abi = LandlockABI()
	fd, skipped, err := buildRuleset(c.landlockSpec(), abi)
	if fd >= 0 {
		unix.Close(fd) //nolint:errcheck // only a check
	}
	return abi, skipped, err
}

func (c *Confinement) landlockSpec() LandlockSpec {
	return LandlockSpec{ReadOnly: c.ReadOnly, ReadWrite: c.ReadWrite, Hard: c.HardLandlock}
}
