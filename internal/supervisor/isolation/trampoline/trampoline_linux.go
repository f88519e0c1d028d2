package trampoline

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

func init() {
	if len(os.Args) == 1 && os.Args[0] == Arg0 {
		trampolineMain()
	}
}

// trampolineMain confines this process and execve's the agent; it returns
// only by exiting.
func trampolineMain() {
	// Per-thread state (the bounding set read back, the thread that
	// execve's) stays on this thread; it is never unlocked.
	runtime.LockOSThread()
	status := os.NewFile(StatusFD, "status")
	defer func() {
		if r := recover(); r != nil {
			fail(status, fmt.Errorf("agent trampoline panicked: %v", r))
		}
	}()
	if _, err := unix.FcntlInt(StatusFD, unix.F_SETFD, unix.FD_CLOEXEC); err != nil {
		os.Exit(126) // no status channel: the supervisor sees an empty exit
	}
	err := confineAndExec(os.NewFile(SpecFD, "spec"))
	fail(status, err)
}

func fail(status *os.File, err error) {
	_, _ = status.WriteString(err.Error())
	os.Exit(127)
}

func confineAndExec(specFile *os.File) error {
	data, err := io.ReadAll(io.LimitReader(specFile, 16<<20))
	specFile.Close()
	if err != nil {
		return fmt.Errorf("read agent spec: %w", err)
	}
	var s Spec
	if err := json.Unmarshal(data, &s); err != nil {
		return fmt.Errorf("decode agent spec: %w", err)
	}
	if len(s.Argv) == 0 {
		return errors.New("agent spec has no command")
	}
	// The agent gets stdin, stdout and stderr and nothing else, whatever
	// the supervisor holds without close-on-exec (the status pipe closes
	// at execve, which is what reports success).
	if err := closeOnExecFrom(3); err != nil {
		return err
	}
	prog, err := filterProgram()
	if err != nil {
		return err
	}
	// Rule paths are opened while still root, so a path the agent could
	// not open itself can still be granted (DAC applies on top).
	rulesetFD := -1
	if !s.Landlock.Inherited {
		if rulesetFD, _, err = BuildRuleset(s.Landlock, LandlockABI()); err != nil {
			return err
		}
	}
	if err := dropPrivileges(s.UID, s.GID); err != nil {
		return err
	}
	if err := setNoNewPrivs(); err != nil {
		return err
	}
	if rulesetFD >= 0 {
		if err := landlockRestrictAllThreads(rulesetFD); err != nil {
			return fmt.Errorf("landlock_restrict_self: %w", err)
		}
		unix.Close(rulesetFD) //nolint:errcheck // enforced; the descriptor is no longer needed
	}
	if s.Dir != "" {
		if err := unix.Chdir(s.Dir); err != nil {
			return fmt.Errorf("chdir %s: %w", s.Dir, err)
		}
	}
	path, err := lookPath(s.Argv[0], s.Env)
	if err != nil {
		return err
	}
	if err := loadFilter(prog); err != nil {
		return err
	}
	err = unix.Exec(path, s.Argv, s.Env)
	return fmt.Errorf("exec %s: %w", s.Argv[0], err)
}

// closeOnExecFrom marks every descriptor from first on close-on-exec:
// close_range(2) where the kernel has it (5.11), else each entry of
// /proc/self/fd.
func closeOnExecFrom(first int) error {
	if err := unix.CloseRange(uint(first), ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err == nil {
		return nil
	}
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return fmt.Errorf("list inherited descriptors: %w", err)
	}
	for _, e := range entries {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd < first {
			continue
		}
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC); err != nil && !errors.Is(err, unix.EBADF) {
			return fmt.Errorf("mark descriptor %d close-on-exec: %w", fd, err)
		}
	}
	return nil
}

// lookPath resolves file like a shell, with the agent's PATH.
func lookPath(file string, env []string) (string, error) {
	if strings.Contains(file, "/") {
		return file, nil
	}
	pathEnv := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			pathEnv = v
		}
	}
	if pathEnv == "" {
		return "", fmt.Errorf("exec %s: executable file not found in $PATH", file)
	}
	// dir + "/" + file, as execvp(3) builds it; not path/filepath, whose
	// import would order the protobuf package initialisers before this
	// package's init (see doc.go).
	for _, dir := range strings.Split(pathEnv, ":") {
		if dir == "" {
			dir = "."
		}
		p := dir + "/" + file
		var st unix.Stat_t
		if unix.Stat(p, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG && unix.Access(p, unix.X_OK) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("exec %s: executable file not found in $PATH", file)
}
