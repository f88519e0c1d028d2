package isolation

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Launch is one agent process being started inside a Confinement.
type Launch struct {
	conf    *Confinement
	started bool
	dir     string // working directory, for errors
}

// Command returns a command that runs argv confined by c, with env
// (HOME, USER and LOGNAME are set for the agent's user) in dir; the
// program is resolved with env's PATH. The caller sets its stdio and
// SysProcAttr (process group, session, controlling terminal; not ids,
// namespaces or capabilities), starts it with Launch.Start (not
// cmd.Start: the agent must be forked from the Confinement's domain
// thread, and Started refuses a launch that was not) and then calls
// Launch.Started exactly once, whether the start succeeded or not.
func (c *Confinement) Command(argv, env []string, dir string) (*exec.Cmd, *Launch, error) {
	if len(argv) == 0 {
		return nil, nil, errors.New("agent command is empty")
	}
	if c.User.UID == 0 || c.User.GID == 0 {
		return nil, nil, fmt.Errorf("refusing to run the agent as uid %d gid %d", c.User.UID, c.User.GID)
	}
	home := c.User.Home
	if home == "" {
		home = dir
	}
	if home == "" {
		home = "/"
	}
	name := c.User.Name
	if name == "" {
		name = fmt.Sprint(c.User.UID)
	}
	env = setEnv(env, "HOME", home)
	env = setEnv(env, "USER", name)
	env = setEnv(env, "LOGNAME", name)
	path, err := lookPath(argv[0], env, dir)
	if err != nil {
		return nil, nil, err
	}
	// cmd.Start refuses to run it: only Launch.Start clears Err.
	cmd := &exec.Cmd{Path: path, Args: argv, Env: env, Dir: dir, Err: errNotLaunched}
	return cmd, &Launch{conf: c, dir: dir}, nil
}

// errNotLaunched is what an agent command started without Launch.Start
// fails with: outside the domain thread it would run unconfined.
var errNotLaunched = errors.New("agent command not started through Launch.Start (outside the agents' confinement)")

// Start starts cmd (from Command) as the agent's user and group, with no
// supplementary groups, forked from the Confinement's domain thread (see
// domainThread), so that it runs under every layer of the confinement
// from its first instruction.
func (l *Launch) Start(cmd *exec.Cmd) error {
	l.started = true
	sys := cmd.SysProcAttr
	if sys == nil {
		sys = &syscall.SysProcAttr{}
		cmd.SysProcAttr = sys
	}
	if sys.Cloneflags != 0 || sys.Unshareflags != 0 || sys.Chroot != "" || len(sys.AmbientCaps) > 0 ||
		sys.UidMappings != nil || sys.GidMappings != nil || sys.UseCgroupFD || len(cmd.ExtraFiles) > 0 {
		return errors.New("agent command sets namespaces, a root, capabilities, a cgroup or extra files")
	}
	u := l.conf.User
	sys.Credential = &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: []uint32{}}
	if cmd.Err == errNotLaunched { //nolint:errorlint // the sentinel set by Command itself
		cmd.Err = nil
	}
	return l.conf.domain.start(l.conf, cmd)
}

// Started finishes a launch after Launch.Start returned startErr and
// returns the error of the spawn: startErr, or errNotLaunched for a
// command started some other way (Command makes cmd.Start refuse it).
func (l *Launch) Started(startErr error) error {
	if startErr == nil && !l.started {
		return errNotLaunched
	}
	if startErr != nil {
		// os/exec names the program; a working directory the agent may
		// not enter fails the same way (EACCES, ENOENT).
		return fmt.Errorf("agent process (as uid %d in %s): %w", l.conf.User.UID, l.dir, startErr)
	}
	return nil
}

// lookPath resolves file like a shell, with the agent's PATH (relative
// entries and a relative file against dir).
func lookPath(file string, env []string, dir string) (string, error) {
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
	for _, d := range strings.Split(pathEnv, ":") {
		if d == "" {
			d = "."
		}
		p := d + "/" + file
		check := p
		if !strings.HasPrefix(p, "/") && dir != "" {
			check = dir + "/" + p
		}
		var st unix.Stat_t
		if unix.Stat(check, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG && st.Mode&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("exec %s: executable file not found in $PATH", file)
}

// setEnv sets k=v in env, replacing every existing k.
func setEnv(env []string, k, v string) []string {
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if !strings.HasPrefix(kv, k+"=") {
			out = append(out, kv)
		}
	}
	return append(out, k+"="+v)
}
