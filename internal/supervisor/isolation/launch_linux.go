package isolation

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"

	"github.com/openshell-go/openshell/internal/supervisor/isolation/trampoline"
)

// TrampolineArg0 is argv[0] of the supervisor binary re-executed as the
// agent trampoline.
const TrampolineArg0 = trampoline.Arg0

// Spec is what the trampoline is told over fd 3.
type Spec = trampoline.Spec

// trampolineEnv is the trampoline's own environment (the agent gets the
// spec's): a short-lived Go program that needs no second processor and no
// garbage collection before it execve's.
var trampolineEnv = []string{"GOGC=off", "GOMAXPROCS=1"}

// selfExe is the binary the trampoline runs from. /proc/self/exe stays
// valid after the supervisor pivots into a rootfs.
const selfExe = "/proc/self/exe"

// Launch is one agent process being started through the trampoline.
type Launch struct {
	conf            *Confinement
	started         bool
	spec            []byte
	specR, specW    *os.File
	statusR, status *os.File
}

// Command returns a command that runs argv confined by c, with env
// (HOME, USER and LOGNAME are set for the agent's user) in dir. The caller
// sets its stdio and SysProcAttr (process group, session, controlling
// terminal), must not set ExtraFiles, starts it with Launch.Start (not
// cmd.Start: the trampoline must be forked inside the agents' Landlock
// domain, and Started refuses a launch that was not) and then calls
// Launch.Started exactly once, whether the start succeeded or not.
func (c *Confinement) Command(argv, env []string, dir string) (*exec.Cmd, *Launch, error) {
	if len(argv) == 0 {
		return nil, nil, errors.New("agent command is empty")
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
	spec, err := json.Marshal(Spec{
		Argv: argv, Env: env, Dir: dir,
		UID: c.User.UID, GID: c.User.GID,
		// The domain thread's ruleset (Confinement.Start).
		Landlock: LandlockSpec{Inherited: true},
	})
	if err != nil {
		return nil, nil, err
	}
	l := &Launch{conf: c, spec: spec}
	if l.specR, l.specW, err = os.Pipe(); err != nil {
		return nil, nil, err
	}
	if l.statusR, l.status, err = os.Pipe(); err != nil {
		l.specR.Close()
		l.specW.Close()
		return nil, nil, err
	}
	cmd := &exec.Cmd{
		Path:       selfExe,
		Args:       []string{TrampolineArg0},
		Env:        trampolineEnv,
		ExtraFiles: []*os.File{l.specR, l.status}, // fds 3 and 4
	}
	return cmd, l, nil
}

// Start starts cmd (from Command) inside the agents' Landlock domain
// (Confinement.Start).
func (l *Launch) Start(cmd *exec.Cmd) error {
	l.started = true
	return l.conf.Start(cmd)
}

// Started finishes a launch after Launch.Start returned startErr: it hands
// the spec to the trampoline and waits until the trampoline has either
// execve'd the agent (nil) or failed (its error; the trampoline then
// exits 127 and must still be reaped by the caller). A trampoline started
// some other way gets no spec and exits without running the agent.
func (l *Launch) Started(startErr error) error {
	l.specR.Close()
	l.status.Close()
	defer l.statusR.Close()
	if startErr == nil && !l.started {
		startErr = errors.New("agent trampoline not started through Launch.Start (outside the agents' Landlock domain)")
	}
	if startErr != nil {
		l.specW.Close()
		return startErr
	}
	_, werr := l.specW.Write(l.spec)
	l.specW.Close()
	msg, rerr := io.ReadAll(io.LimitReader(l.statusR, 64<<10))
	switch {
	case len(msg) > 0:
		return fmt.Errorf("agent confinement failed: %s", msg)
	case rerr != nil:
		return fmt.Errorf("agent trampoline status: %w", rerr)
	case werr != nil:
		return fmt.Errorf("agent trampoline did not take its spec: %w", werr)
	}
	return nil
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
