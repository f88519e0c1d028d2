package isolation

import (
	"errors"
	"fmt"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The three Landlock system calls are made here directly; go-landlock
// would bring psx (all-thread system calls through cgo), which the
// per-thread confinement does not need.

// landlockCreateRuleset is landlock_create_ruleset(2) with a nil attr
// when attr is nil (a version or errata query).
func landlockCreateRuleset(attr *unix.LandlockRulesetAttr, flags uintptr) (int, error) {
	var p, size uintptr
	if attr != nil {
		p, size = uintptr(unsafe.Pointer(attr)), unsafe.Sizeof(*attr)
	}
	r, _, e := syscall.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, p, size, flags)
	if e != 0 {
		return -1, e
	}
	return int(r), nil
}

func landlockAddPathBeneathRule(rulesetFD int, attr *unix.LandlockPathBeneathAttr) error {
	_, _, e := syscall.Syscall6(unix.SYS_LANDLOCK_ADD_RULE, uintptr(rulesetFD), unix.LANDLOCK_RULE_PATH_BENEATH, uintptr(unsafe.Pointer(attr)), 0, 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

// landlockRestrictThread enforces the ruleset on the calling OS thread
// only (no_new_privs must be set): what it forks afterwards starts in that
// Landlock domain.
func landlockRestrictThread(rulesetFD int) error {
	if _, _, e := syscall.RawSyscall(unix.SYS_LANDLOCK_RESTRICT_SELF, uintptr(rulesetFD), 0, 0); e != 0 {
		return fmt.Errorf("landlock_restrict_self: %w", e)
	}
	return nil
}

// LandlockABI is the kernel's Landlock ABI version, 0 when Landlock is not
// available (not built in, or not enabled at boot).
func LandlockABI() int {
	v, err := landlockCreateRuleset(nil, unix.LANDLOCK_CREATE_RULESET_VERSION)
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
		h |= unix.LANDLOCK_ACCESS_FS_RESOLVE_UNIX
		fallthrough
	case abi >= 5:
		h |= unix.LANDLOCK_ACCESS_FS_IOCTL_DEV
		fallthrough
	case abi >= 3:
		h |= unix.LANDLOCK_ACCESS_FS_TRUNCATE
		fallthrough
	case abi >= 2:
		h |= unix.LANDLOCK_ACCESS_FS_REFER
		fallthrough
	default:
		h |= unix.LANDLOCK_ACCESS_FS_EXECUTE | unix.LANDLOCK_ACCESS_FS_WRITE_FILE | unix.LANDLOCK_ACCESS_FS_READ_FILE | unix.LANDLOCK_ACCESS_FS_READ_DIR |
			unix.LANDLOCK_ACCESS_FS_REMOVE_DIR | unix.LANDLOCK_ACCESS_FS_REMOVE_FILE | unix.LANDLOCK_ACCESS_FS_MAKE_CHAR | unix.LANDLOCK_ACCESS_FS_MAKE_DIR |
			unix.LANDLOCK_ACCESS_FS_MAKE_REG | unix.LANDLOCK_ACCESS_FS_MAKE_SOCK | unix.LANDLOCK_ACCESS_FS_MAKE_FIFO | unix.LANDLOCK_ACCESS_FS_MAKE_BLOCK |
			unix.LANDLOCK_ACCESS_FS_MAKE_SYM
	}
	return h
}

// scopes are the IPC scopes the kernel's ABI offers (6 and later): an
// agent process may signal, and connect to abstract unix sockets of, only
// processes in its own Landlock domain or one nested in it.
func scopes(abi int) uint64 {
	if abi >= 6 {
		return unix.LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | unix.LANDLOCK_SCOPE_SIGNAL
	}
	return 0
}

// LandlockScopes names the IPC scopes agent processes get on a kernel of
// Landlock ABI abi: "abstract_unix_socket" and "signal" from ABI 6.
func LandlockScopes(abi int) []string {
	var names []string
	if scopes(abi)&unix.LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET != 0 {
		names = append(names, "abstract_unix_socket")
	}
	if scopes(abi)&unix.LANDLOCK_SCOPE_SIGNAL != 0 {
		names = append(names, "signal")
	}
	return names
}

const (
	// readOnlyRights: read files, list directories, execute.
	readOnlyRights = unix.LANDLOCK_ACCESS_FS_EXECUTE | unix.LANDLOCK_ACCESS_FS_READ_FILE | unix.LANDLOCK_ACCESS_FS_READ_DIR
	// fileRights are the rights that apply to a non-directory.
	fileRights = unix.LANDLOCK_ACCESS_FS_EXECUTE | unix.LANDLOCK_ACCESS_FS_WRITE_FILE | unix.LANDLOCK_ACCESS_FS_READ_FILE |
		unix.LANDLOCK_ACCESS_FS_TRUNCATE | unix.LANDLOCK_ACCESS_FS_IOCTL_DEV
)

// LandlockSpec is the Landlock part of a Confinement.
type LandlockSpec struct {
	ReadOnly  []Path
	ReadWrite []Path
	Hard      bool
}

// Path is one Landlock rule path.
type Path struct {
	Path string
	// Optional paths (the supervisor's baseline and defaults) are skipped
	// when they cannot be opened, whatever the compatibility mode.
	Optional bool
}

// PathProblem is a rule path that cannot be used.
type PathProblem struct {
	Path string
	Err  error
}

func (p PathProblem) Error() string { return fmt.Sprintf("landlock path %s: %v", p.Path, p.Err) }

// Reason is the human-readable cause of a path problem.
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

// buildRuleset creates the Landlock ruleset for s with the kernel's ABI,
// scoped (ABI 6 and later) to abstract unix sockets and signals of the
// agent's own domain. It returns -1 when nothing is to be enforced (no
// Landlock under best effort), a ruleset with the scopes only when no path
// is usable under best effort, and the problems with the skipped paths.
// Under s.Hard every problem, and a kernel without Landlock, is an error.
func buildRuleset(s LandlockSpec, abi int) (fd int, skipped []PathProblem, err error) {
	if abi <= 0 {
		if s.Hard {
			return -1, nil, errors.New("landlock is required (hard_requirement) but the kernel does not support it")
		}
		return -1, nil, nil
	}
	handled := handledFS(abi)
	attr := unix.LandlockRulesetAttr{Handled_access_fs: handled, Scoped: scopes(abi)}
	fd, err = landlockCreateRuleset(&attr, 0)
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
		if attr.Scoped == 0 {
			return -1, skipped, nil
		}
		// No filesystem rules, but the scopes still apply (best effort:
		// none if the kernel refuses them).
		scoped := unix.LandlockRulesetAttr{Scoped: attr.Scoped}
		if sfd, serr := landlockCreateRuleset(&scoped, 0); serr == nil {
			return sfd, skipped, nil
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
	return landlockAddPathBeneathRule(rulesetFD, &unix.LandlockPathBeneathAttr{Allowed_access: rights, Parent_fd: int32(fd)})
}
