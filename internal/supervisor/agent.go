package supervisor

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	"github.com/openshell-go/openshell/internal/supervisor/isolation"
)

// agentLauncher builds the commands of agent processes (main process,
// exec and SSH sessions): every one runs confined by the sandbox policy
// (isolation.Confinement). Until prepare has succeeded every
// command fails: an agent never starts unconfined.
type agentLauncher struct {
	log     *slog.Logger
	workdir string

	mu   sync.Mutex
	conf *isolation.Confinement
	err  error
}

func newAgentLauncher(log *slog.Logger, workdir string) *agentLauncher {
	return &agentLauncher{log: log, workdir: workdir, err: errors.New("the sandbox policy has not been loaded yet")}
}

// prepare builds the confinement for policy, reports the kernel's
// Landlock ABI and the rule paths that will be skipped, and gives the
// workspace to the agent's user. Its error says why agents cannot start.
func (a *agentLauncher) prepare(policy *sandboxv1.SandboxPolicy) error {
	conf, err := a.build(policy)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.conf, a.err = conf, err
	if err != nil {
		a.conf = nil
	}
	return err
}

// confinement is the prepared confinement, nil when agents cannot start.
func (a *agentLauncher) confinement() *isolation.Confinement {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.conf
}

// refuse makes every later command fail with err: a layer the policy
// requires could not be set up, so no agent process starts.
func (a *agentLauncher) refuse(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.conf, a.err = nil, err
}

func (a *agentLauncher) build(policy *sandboxv1.SandboxPolicy) (*isolation.Confinement, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("the supervisor runs as uid %d: it needs root to start agent processes as an unprivileged user", os.Geteuid())
	}
	if err := checkConfinementCaps(); err != nil {
		return nil, err
	}
	conf, err := isolation.FromPolicy(policy, "/", a.workdir)
	if err != nil {
		return nil, err
	}
	if err := conf.CheckIdentity(); err != nil {
		return nil, err
	}
	abi, skipped, err := conf.CheckLandlock()
	mode := isolation.BestEffort
	if conf.HardLandlock {
		mode = isolation.HardRequirement
	}
	if abi > 0 {
		a.log.Info("landlock available", "abi", abi, "compatibility", mode, "scopes", strings.Join(isolation.LandlockScopes(abi), ","))
	} else {
		a.log.Warn("landlock is not available on this kernel: filesystem rules are not enforced", "compatibility", mode)
	}
	for _, p := range skipped {
		a.log.Warn("landlock rule path skipped", "path", p.Path, "reason", p.Reason(), "err", p.Err)
	}
	if err != nil {
		return nil, err
	}
	a.log.Info("agent processes run confined", "uid", conf.User.UID, "gid", conf.User.GID,
		"default_filesystem", conf.DefaultFilesystem, "seccomp", true, "no_new_privs", true, "capabilities", "none")
	switch {
	case a.workdir == "":
	case filepath.Clean(a.workdir) == "/":
		// A container image without WORKDIR: "/" is neither given to the
		// agent's user nor made writable (isolation.FromPolicy).
		a.log.Warn("the working directory is /: it stays read-only for agent processes; set WORKDIR in the image or a workspace volume")
	default:
		giveWorkspace(a.log, a.workdir, conf.User)
	}
	return conf, nil
}

// giveWorkspace makes the workspace directory itself (not its contents)
// owned by the agent's user, so the agent can create files in it.
func giveWorkspace(log *slog.Logger, dir string, u isolation.User) {
	fi, err := os.Stat(dir)
	if err != nil {
		return // the spawn reports an unusable working directory
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid == u.UID && st.Gid == u.GID {
		return
	}
	if err := os.Chown(dir, int(u.UID), int(u.GID)); err != nil {
		log.Warn("cannot give the workspace to the agent user", "dir", dir, "uid", u.UID, "err", err)
	}
}

// command returns the confined command for argv with env in dir and the
// launch to complete with procTable.startAgent.
func (a *agentLauncher) command(argv, env []string, dir string) (*exec.Cmd, *isolation.Launch, error) {
	a.mu.Lock()
	conf, err := a.conf, a.err
	a.mu.Unlock()
	if conf == nil {
		return nil, nil, fmt.Errorf("agent processes cannot start: %w", err)
	}
	return conf.Command(argv, env, dir)
}

// startAgent starts a command from agentLauncher.command inside the
// sandbox's confinement (isolation.Launch.Start).
func (t *procTable) startAgent(cmd *exec.Cmd, l *isolation.Launch) (*proc, error) {
	p, err := t.start(cmd, l.Start)
	if err := l.Started(err); err != nil {
		return nil, err
	}
	return p, nil
}

// confinementCaps are the capabilities the supervisor needs to start a
// confined agent process: SETGID and SETUID switch to the agent's user,
// SETPCAP empties its bounding set, KILL signals it (another uid). The
// Kubernetes driver's pod spec grants exactly these and CHOWN (for
// giveWorkspace, which only warns).
var confinementCaps = []struct {
	bit  int
	name string
}{{unix.CAP_KILL, "CAP_KILL"}, {unix.CAP_SETGID, "CAP_SETGID"}, {unix.CAP_SETPCAP, "CAP_SETPCAP"}, {unix.CAP_SETUID, "CAP_SETUID"}}

// checkConfinementCaps reports the confinementCaps missing from the
// supervisor's effective or bounding set (the confinement's domain thread
// uses them before it empties its own bounding set), so that a container
// started without them reports the policy FAILED before any agent process
// is attempted instead of failing each spawn.
func checkConfinementCaps() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("read the supervisor's capabilities: %w", err)
	}
	var missing []string
	for _, c := range confinementCaps {
		inBounding, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c.bit), 0, 0, 0)
		if err != nil || inBounding != 1 || data[c.bit/32].Effective&(1<<(uint(c.bit)%32)) == 0 {
			missing = append(missing, c.name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("the supervisor lacks %s, which it needs to start agent processes as an unprivileged user without capabilities", strings.Join(missing, ", "))
	}
	return nil
}
