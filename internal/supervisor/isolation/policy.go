package isolation

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
)

// SandboxUser is the name of the unprivileged user the agent runs as by
// default, and the only name a policy may give besides a numeric id.
const SandboxUser = "sandbox"

// DefaultUID and DefaultGID are used for the sandbox user when the
// sandbox's /etc/passwd (or /etc/group) has no "sandbox" entry.
const (
	DefaultUID = 1000
	DefaultGID = 1000
)

// maxID is the largest uid/gid a policy may name (2^32-2; 2^32-1 is the
// kernel's "no id").
const maxID = 1<<32 - 2

// Compatibility modes of LandlockPolicy.compatibility.
const (
	BestEffort      = "best_effort"
	HardRequirement = "hard_requirement"
)

// User is the identity agent processes run as.
type User struct {
	UID, GID uint32
	Name     string // "sandbox" or the passwd name of UID; may be empty
	Home     string // passwd home directory; may be empty
}

// Confinement is what every agent process of a sandbox runs under. It is
// built once from the sandbox policy by FromPolicy and used read-only
// afterwards (safe for concurrent use).
type Confinement struct {
	User User
	// ReadOnly and ReadWrite are the Landlock rules (policy paths first,
	// then the supervisor's baseline).
	ReadOnly, ReadWrite []Path
	// HardLandlock is LandlockPolicy.compatibility == hard_requirement:
	// no Landlock support, or a policy path that cannot be opened, fails
	// every spawn instead of being skipped.
	HardLandlock bool
	// DefaultFilesystem is true when the policy had no filesystem
	// section and the supervisor's default rules apply.
	DefaultFilesystem bool

	// domain starts every agent process inside one Landlock domain (see
	// Confinement.Start).
	domain domainThread
}

// defaultReadOnly and defaultReadWrite apply when the policy has no
// filesystem section (besides the working directory, read-write).
var (
	defaultReadOnly  = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt"}
	defaultReadWrite = []string{"/tmp"}
)

// baselineReadOnly and baselineReadWrite are added to every ruleset: the
// paths a shell and most programs need to work at all. /proc is
// read-only: its sensitive parts are guarded by the kernel's ptrace access
// checks (another uid's /proc/<pid>/environ, mem, fd) and writes to
// /proc/sys are refused.
var (
	baselineReadOnly  = []string{"/proc", "/dev/urandom", "/dev/random", "/dev/zero"}
	baselineReadWrite = []string{"/dev/null", "/dev/full", "/dev/tty", "/dev/ptmx", "/dev/pts"}
)

// FromPolicy builds the confinement for policy (nil means no policy). root
// is the directory holding the sandbox's etc/passwd and etc/group (the
// supervisor's "/" after its namespace setup); workdir is the agent's
// working directory, added read-write when the policy has no filesystem
// section or sets include_workdir, except when it is "/" (a container
// image without WORKDIR): "/" is never read-write.
func FromPolicy(policy *sandboxv1.SandboxPolicy, root, workdir string) (*Confinement, error) {
	if workdir != "" && filepath.Clean(workdir) == "/" {
		workdir = ""
	}
	u, err := ResolveUser(root, policy.GetProcess().GetRunAsUser(), policy.GetProcess().GetRunAsGroup())
	if err != nil {
		return nil, err
	}
	c := &Confinement{User: u}
	switch mode := policy.GetLandlock().GetCompatibility(); mode {
	case "", BestEffort:
	case HardRequirement:
		c.HardLandlock = true
	default:
		return nil, fmt.Errorf("landlock compatibility must be %q or %q, got %q", BestEffort, HardRequirement, mode)
	}
	fs := policy.GetFilesystem()
	var ro, rw []Path
	if fs == nil {
		c.DefaultFilesystem = true
		ro = paths(defaultReadOnly, true)
		rw = paths(defaultReadWrite, true)
		if workdir != "" {
			rw = append(rw, Path{Path: workdir})
		}
	} else {
		for _, p := range fs.GetReadOnly() {
			if err := checkPath(p); err != nil {
				return nil, err
			}
			ro = append(ro, Path{Path: p})
		}
		for _, p := range fs.GetReadWrite() {
			if err := checkPath(p); err != nil {
				return nil, err
			}
			if filepath.Clean(p) == "/" {
				return nil, fmt.Errorf("read-write path is overly broad: %s", p)
			}
			rw = append(rw, Path{Path: p})
		}
		if fs.GetIncludeWorkdir() && workdir != "" {
			rw = append(rw, Path{Path: workdir})
		}
	}
	c.ReadOnly = append(ro, paths(baselineReadOnly, true)...)
	c.ReadWrite = append(rw, paths(baselineReadWrite, true)...)
	return c, nil
}

func paths(ps []string, optional bool) []Path {
	out := make([]Path, len(ps))
	for i, p := range ps {
		out[i] = Path{Path: p, Optional: optional}
	}
	return out
}

// checkPath enforces the policy path rules the supervisor relies on (the
// gateway validates them too, before a policy is stored).
func checkPath(p string) error {
	if !filepath.IsAbs(p) {
		return fmt.Errorf("filesystem path must be absolute: %s", p)
	}
	for _, c := range strings.Split(p, "/") {
		if c == ".." {
			return fmt.Errorf("path contains '..' traversal component: %s", p)
		}
	}
	return nil
}

// ResolveUser resolves a policy's run_as_user and run_as_group. Empty or
// "sandbox" means the sandbox user: the "sandbox" entry of root's
// etc/passwd (and group of etc/group) when present, else
// DefaultUID/DefaultGID. A numeric user without a group runs with the
// primary group of its passwd entry, or the gid of the same number. Root
// (id 0) is refused, as is any other name.
func ResolveUser(root, runAsUser, runAsGroup string) (User, error) {
	passwd := readDB(filepath.Join(root, "etc/passwd"))
	groups := readDB(filepath.Join(root, "etc/group"))
	var u User
	switch runAsUser {
	case "", SandboxUser:
		u = User{UID: DefaultUID, GID: DefaultGID, Name: SandboxUser}
		if e, ok := lookupName(passwd, SandboxUser); ok {
			uid, uerr := strconv.ParseUint(e[2], 10, 32)
			gid, gerr := strconv.ParseUint(e[3], 10, 32)
			if uerr != nil || gerr != nil {
				return User{}, fmt.Errorf("%s: malformed %q entry", filepath.Join(root, "etc/passwd"), SandboxUser)
			}
			u.UID, u.GID, u.Home = uint32(uid), uint32(gid), field(e, 5)
		}
	default:
		uid, err := parseID(runAsUser)
		if err != nil {
			return User{}, fmt.Errorf("run_as_user must be '%s' or a numeric UID/GID in range [1, %d], got '%s'", SandboxUser, uint64(maxID), runAsUser)
		}
		u = User{UID: uid, GID: uid}
		if e, ok := lookupID(passwd, runAsUser); ok {
			u.Name, u.Home = e[0], field(e, 5)
			if gid, err := parseID(e[3]); err == nil {
				u.GID = gid
			}
		}
	}
	switch runAsGroup {
	case "":
	case SandboxUser:
		if e, ok := lookupName(groups, SandboxUser); ok {
			if gid, err := parseID(e[2]); err == nil {
				u.GID = gid
				break
			}
		}
		if e, ok := lookupName(passwd, SandboxUser); ok {
			if gid, err := parseID(e[3]); err == nil {
				u.GID = gid
				break
			}
		}
		u.GID = DefaultGID
	default:
		gid, err := parseID(runAsGroup)
		if err != nil {
			return User{}, fmt.Errorf("run_as_group must be '%s' or a numeric UID/GID in range [1, %d], got '%s'", SandboxUser, uint64(maxID), runAsGroup)
		}
		u.GID = gid
	}
	if u.UID == 0 || u.GID == 0 {
		return User{}, fmt.Errorf("the agent never runs as root (resolved uid %d, gid %d)", u.UID, u.GID)
	}
	return u, nil
}

// parseID parses a uid/gid in [1, 2^32-2].
func parseID(s string) (uint32, error) {
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n < 1 || n > maxID {
		return 0, fmt.Errorf("invalid id %q", s)
	}
	return uint32(n), nil
}

func field(e []string, i int) string {
	if i < len(e) {
		return e[i]
	}
	return ""
}

// readDB reads a colon-separated database (passwd, group); a missing or
// unreadable file is empty.
func readDB(path string) [][]string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	return parseDB(f)
}

func parseDB(r io.Reader) [][]string {
	var out [][]string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if e := strings.Split(line, ":"); len(e) >= 4 {
			out = append(out, e)
		}
	}
	return out
}

func lookupName(db [][]string, name string) ([]string, bool) {
	for _, e := range db {
		if e[0] == name {
			return e, true
		}
	}
	return nil, false
}

// lookupID finds a passwd entry by uid.
func lookupID(db [][]string, id string) ([]string, bool) {
	for _, e := range db {
		if e[2] == id {
			return e, true
		}
	}
	return nil, false
}
