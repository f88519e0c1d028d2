//go:build linux

package process

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"
	"golang.org/x/sys/unix"

	"github.com/openshell-go/openshell/internal/atomicfile"
	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/supervisor/egress/hostdial"
	"github.com/openshell-go/openshell/internal/telemetry"
	"github.com/openshell-go/openshell/internal/version"
)

// Name is the driver's registry name.
const Name = "process"

// Driver runs sandboxes as local supervisor processes. It is safe for
// concurrent use; Close joins its goroutines without stopping sandboxes.
type Driver struct {
	logger *slog.Logger
	cfg    config

	nsOnce sync.Once
	nsErr  error

	mu        sync.Mutex
	closed    bool
	sandboxes map[string]*sandbox // by id
	subs      map[*subscriber]struct{}
	done      chan struct{} // closed by Close

	wg sync.WaitGroup // monitors and watch closers
}

var (
	_ compute.Driver = (*Driver)(nil)
	_ io.Closer      = (*Driver)(nil)
)

// sandbox is one sandbox's in-memory state. Fields are guarded by
// Driver.mu; op serializes Start, Stop and Delete on it.
type sandbox struct {
	op       sync.Mutex
	rec      record
	proc     *running // nil when no process
	deleting bool
	creating bool
	// proxy forwards a user-namespace supervisor's gateway connections
	// (nil otherwise, and while stopped).
	proxy *gatewayProxy
	// dialer serves the host dialer on a socket next to the proxy's, for
	// the supervisor to reconnect to after a gateway restart (nil when
	// proxy is).
	dialer *hostdial.Listener
}

// running is a live supervisor process.
type running struct {
	h      *pidHandle
	exited chan struct{} // closed after the monitor recorded the exit
}

// record is state.json.
type record struct {
	ID         string       `json:"id"`
	Name       string       `json:"name"`
	Namespace  string       `json:"namespace,omitempty"`
	Workspace  string       `json:"workspace,omitempty"`
	Spec       compute.Spec `json:"spec"` // SandboxToken always empty
	InstanceID string       `json:"instance_id"`
	PID        int          `json:"pid,omitempty"`
	StartTime  uint64       `json:"start_time,omitempty"`
	Stopped    bool         `json:"stopped,omitempty"`
	CgroupDir  string       `json:"cgroup_dir,omitempty"`
	// IDBase is the first host id of the sandbox's user namespace range
	// (0: none allocated).
	IDBase uint32 `json:"host_id_base,omitempty"`
	// ExitMessage describes the last unexpected exit.
	ExitMessage string    `json:"exit_message,omitempty"`
	Transition  time.Time `json:"transition"`
	// Broken, set only in memory, says why the state could not be loaded:
	// such a sandbox is reported in error and its directory never written.
	Broken string `json:"-"`
}

// New is the compute.Factory for the process driver. It re-discovers the
// sandboxes recorded under the state directory.
func New(cfg map[string]any, deps compute.FactoryDeps) (compute.Driver, error) {
	return Open(cfg, deps)
}

// Open is New returning the concrete type.
func Open(cfg map[string]any, deps compute.FactoryDeps) (*Driver, error) {
	c, err := parseConfig(cfg, deps)
	if err != nil {
		return nil, err
	}
	logger := deps.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	d := &Driver{
		logger:    logger.With("component", "compute/process"),
		cfg:       c,
		sandboxes: map[string]*sandbox{},
		subs:      map[*subscriber]struct{}{},
		done:      make(chan struct{}),
	}
	if err := os.MkdirAll(d.sandboxesDir(), 0o700); err != nil {
		return nil, fmt.Errorf("process driver: state directory: %w", err)
	}
	if err := d.recover(); err != nil {
		_ = d.Close() // the recover error is the one to report
		return nil, err
	}
	return d, nil
}

func (d *Driver) sandboxesDir() string          { return filepath.Join(d.cfg.stateDir, "sandboxes") }
func (d *Driver) dir(id string) string          { return filepath.Join(d.sandboxesDir(), id) }
func (d *Driver) tokenPath(id string) string    { return filepath.Join(d.dir(id), "token") }
func (d *Driver) workspaceDir(id string) string { return filepath.Join(d.dir(id), "workspace") }
func (d *Driver) layerDir(id string) string     { return filepath.Join(d.dir(id), "rootfs-layer") }
func (d *Driver) proxyDir(id string) string     { return filepath.Join(d.dir(id), "gateway") }

// recover loads every state.json and re-attaches to live supervisors.
func (d *Driver) recover() error {
	entries, err := os.ReadDir(d.sandboxesDir())
	if err != nil {
		return fmt.Errorf("process driver: %w", err)
	}
	var lost []*sandbox
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		rec, ok := d.load(e.Name())
		if !ok {
			continue
		}
		sb := &sandbox{rec: rec}
		d.sandboxes[rec.ID] = sb
		if rec.Broken != "" {
			continue
		}
		if rec.PID > 0 {
			h, err := openPid(rec.PID, rec.StartTime)
			if err == nil {
				// The proxy first: attach starts the monitor, which
				// closes it under d.mu when the supervisor exits.
				d.resumeProxyLocked(sb)
				d.attach(sb, h)
				d.logger.Info("re-attached to running supervisor", "sandbox_id", rec.ID, "pid", rec.PID)
				continue
			}
			sb.rec.PID, sb.rec.StartTime = 0, 0
			if !rec.Stopped {
				sb.rec.ExitMessage = "supervisor process exited while the gateway was not running"
				sb.rec.Transition = time.Now().UTC()
			}
			d.save(sb)
		} else if !rec.Stopped && rec.ExitMessage == "" {
			lost = append(lost, sb)
		}
	}
	// Supervisors started right before a crash, before their pid was saved.
	ids := map[string]bool{}
	for _, sb := range lost {
		ids[sb.rec.InstanceID] = true
	}
	found := findByInstance(ids)
	for _, sb := range lost {
		if pid, ok := found[sb.rec.InstanceID]; ok {
			if h, err := openPid(pid, 0); err == nil {
				sb.rec.PID, sb.rec.StartTime = h.pid, h.startTime
				d.save(sb)
				d.resumeProxyLocked(sb)
				d.attach(sb, h)
				d.logger.Info("found unrecorded supervisor", "sandbox_id", sb.rec.ID, "pid", pid)
				continue
			}
		}
		// A start interrupted between recording the state and the process
		// running (in a user namespace the child dies when the gateway dies
		// before writing its id maps): do it again.
		if err := d.restartLost(sb); err == nil {
			d.logger.Info("restarted a supervisor whose start was interrupted", "sandbox_id", sb.rec.ID, "pid", sb.rec.PID)
			continue
		} else {
			d.logger.Warn("restart a supervisor whose start was interrupted", "sandbox_id", sb.rec.ID, "error", err)
		}
		sb.rec.ExitMessage = "supervisor process was not running when the gateway started"
		sb.rec.Transition = time.Now().UTC()
		d.save(sb)
	}
	return nil
}

// restartLost starts a new incarnation of sb during recover.
func (d *Driver) restartLost(sb *sandbox) error {
	rootfs, l, cgRoot, err := d.validate(compute.Sandbox{ID: sb.rec.ID, Name: sb.rec.Name, Spec: sb.rec.Spec})
	if err != nil {
		return err
	}
	sb.rec.InstanceID = uuid.NewString()
	return d.spawn(sb, rootfs, l, cgRoot)
}

// load reads the state of the sandbox directory named id. It removes the
// directory only when it is what a create that crashed before recording
// its state leaves behind: no state.json and an empty (or no) workspace.
// Any other failure (state.json unreadable, corrupt, or recording another
// id; a workspace with files but no state) keeps the directory untouched
// and returns a record marked Broken, which the driver reports as a
// sandbox in error and never writes. ok is false for a directory that is
// not a sandbox's or was removed.
func (d *Driver) load(id string) (rec record, ok bool) {
	dir := d.dir(id)
	if !idRE.MatchString(id) {
		d.logger.Warn("ignoring a directory that is not a sandbox's", "dir", dir)
		return rec, false
	}
	data, err := os.ReadFile(filepath.Join(dir, "state.json"))
	switch {
	case errors.Is(err, os.ErrNotExist):
		ws, werr := os.ReadDir(d.workspaceDir(id))
		if errors.Is(werr, os.ErrNotExist) || (werr == nil && len(ws) == 0) {
			d.logger.Warn("removing the directory of a create that never recorded its state", "dir", dir)
			if err := os.RemoveAll(dir); err != nil {
				d.logger.Error("remove incomplete sandbox directory", "dir", dir, "error", err)
			}
			return rec, false
		}
		if werr != nil {
			err = fmt.Errorf("state.json is missing and the workspace cannot be read: %w", werr)
		} else {
			err = errors.New("state.json is missing but the workspace holds files")
		}
	case err == nil:
		if err = json.Unmarshal(data, &rec); err == nil && rec.ID != id {
			err = fmt.Errorf("state.json records sandbox %q", rec.ID)
		}
		if err == nil {
			return rec, true
		}
	}
	d.logger.Error("cannot load sandbox state; its directory is kept untouched and the sandbox reported in error",
		"sandbox_id", id, "dir", dir, "error", err)
	return record{
		ID:         id,
		Broken:     fmt.Sprintf("sandbox state in %s cannot be loaded (%v); the directory was kept untouched: repair or remove it, then restart the gateway", dir, err),
		Transition: time.Now().UTC(),
	}, true
}

// Close stops watching processes and ends all watches. It does not stop
// sandboxes. It is idempotent.
func (d *Driver) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	close(d.done)
	for _, sb := range d.sandboxes {
		if sb.proc != nil {
			sb.proc.h.file.Close() // unblocks the monitor
		}
		// The supervisor reconnects to the next gateway's proxy.
		closeProxyLocked(sb)
	}
	d.mu.Unlock()
	d.wg.Wait()
	return nil
}

// Capabilities implements compute.Driver.
func (d *Driver) Capabilities(context.Context) (compute.Capabilities, error) {
	return compute.Capabilities{
		DriverName:              Name,
		DriverVersion:           version.Version,
		DefaultImage:            d.cfg.defaultImage,
		GatewayManagesLifecycle: true,
	}, nil
}

// ValidateCreate implements compute.Driver.
func (d *Driver) ValidateCreate(_ context.Context, sb compute.Sandbox) error {
	_, _, _, err := d.validate(sb)
	return err
}

// validate checks sb and returns its rootfs, limits and cgroup root.
func (d *Driver) validate(sb compute.Sandbox) (rootfs string, l limits, cgRoot string, err error) {
	switch {
	case sb.ID == "":
		return "", l, "", errdefs.InvalidArgument("sandbox id is required")
	case !idRE.MatchString(sb.ID):
		return "", l, "", errdefs.InvalidArgument(fmt.Sprintf("sandbox id %q is not valid", sb.ID))
	case sb.Name == "":
		return "", l, "", errdefs.InvalidArgument("sandbox name is required")
	case !dnsRE.MatchString(sb.Name):
		return "", l, "", errdefs.InvalidArgument(fmt.Sprintf("sandbox name %q is not a DNS-1123 label", sb.Name))
	}
	spec := sb.Spec
	if rootfs, err = rootfsOf(spec.Template.Image); err != nil {
		return "", l, "", err
	}
	if rc := spec.Template.RuntimeClassName; rc != "" {
		return "", l, "", errdefs.InvalidArgument(fmt.Sprintf("spec.template.runtime_class_name %q is not supported by the process driver", rc))
	}
	if len(spec.Template.Annotations) > 0 {
		return "", l, "", errdefs.InvalidArgument("spec.template annotations are not supported by the process driver (they are Kubernetes pod annotations)")
	}
	if u := spec.Template.UserNamespaces; u != nil && *u != mappedUserNS() {
		return "", l, "", errdefs.InvalidArgument(userNamespacesRefusal(*u))
	}
	for k := range spec.Template.DriverConfig {
		return "", l, "", errdefs.InvalidArgument(fmt.Sprintf("process driver: unknown driver_config key %q", k))
	}
	if spec.Template.Resources.GPUs > 0 {
		return "", l, "", errdefs.FailedPrecondition("process driver does not support GPUs")
	}
	if err := validEnv("template environment", spec.Template.Environment); err != nil {
		return "", l, "", err
	}
	if err := validEnv("environment", spec.Environment); err != nil {
		return "", l, "", err
	}
	for _, a := range spec.Command {
		if strings.ContainsRune(a, 0) {
			return "", l, "", errdefs.InvalidArgument("command arguments must not contain NUL")
		}
	}
	if l, err = parseLimits(spec.Template.Resources); err != nil {
		return "", l, "", err
	}
	if cgRoot, err = d.cfg.checkCgroup(l); err != nil {
		return "", l, "", err
	}
	if err := d.cfg.checkSupervisor(); err != nil {
		return "", l, "", err
	}
	if err := d.checkNamespaces(); err != nil {
		return "", l, "", err
	}
	return rootfs, l, cgRoot, nil
}

// unprivileged reports whether sandboxes need a user namespace.
func unprivileged() bool { return os.Geteuid() != 0 }

// probeBase is the id range checkNamespaces tries: the first one when
// sandboxes get ranges.
func probeBase() uint32 {
	if mappedUserNS() {
		return idRangeStart
	}
	return 0
}

// sysProcAttr returns the supervisor's clone attributes. base > 0 maps the
// sandbox's ids 0..65535 to host ids base onward (see mappedUserNS).
func (d *Driver) sysProcAttr(base uint32) *syscall.SysProcAttr {
	attr := &syscall.SysProcAttr{
		// CLONE_NEWNS is cloned, not unshared: Go's unshare path also
		// remounts / rprivate, which costs ~2 ms per sandbox on a host
		// with many mounts. The supervisor makes / rprivate itself before
		// its first mount (OPENSHELL_SANDBOX_* contract in doc.go).
		Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC | syscall.CLONE_NEWNET,
		Setpgid:    true,
	}
	if base > 0 {
		userNSAttr(attr, base)
	} else if unprivileged() {
		attr.Cloneflags |= syscall.CLONE_NEWUSER
		attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}}
		attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}}
		attr.GidMappingsEnableSetgroups = false
	}
	return attr
}

// checkNamespaces verifies once that this host lets the gateway create the
// sandbox namespaces. It clones a child with the real flags that execs a
// path that cannot exist: ENOENT from exec proves every namespace step
// before it succeeded, anything else names what failed.
func (d *Driver) checkNamespaces() error {
	d.nsOnce.Do(func() {
		// At the root: the sandbox's host ids may not search the state
		// directory.
		probe := "/.openshell-namespace-probe-does-not-exist"
		_, err := os.StartProcess(probe, []string{probe}, &os.ProcAttr{
			Env: []string{}, Files: []*os.File{nil, nil, nil}, Sys: d.sysProcAttr(probeBase()),
		})
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return
		}
		what := "pid, mount, uts, ipc and network namespaces"
		if unprivileged() || probeBase() > 0 {
			what = "a user namespace (with pid, mount, uts, ipc and network namespaces)"
		}
		d.nsErr = errdefs.FailedPrecondition(fmt.Sprintf("process driver cannot create %s on this host: %v", what, err))
	})
	return d.nsErr
}

// Create implements compute.Driver.
func (d *Driver) Create(ctx context.Context, in compute.Sandbox) error {
	rootfs, l, cgRoot, err := d.validate(in)
	if err != nil {
		return err
	}
	sb := &sandbox{creating: true, rec: record{
		ID: in.ID, Name: in.Name, Namespace: in.Namespace, Workspace: in.Workspace,
		Spec: in.Spec, InstanceID: uuid.NewString(), Transition: time.Now().UTC(),
	}}
	sb.rec.Spec.SandboxToken = ""
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return errdefs.Unavailable("process driver is closed")
	}
	if _, dup := d.sandboxes[in.ID]; dup {
		d.mu.Unlock()
		return errdefs.AlreadyExists(fmt.Sprintf("sandbox %q already exists", in.ID))
	}
	for _, other := range d.sandboxes {
		if other.rec.Name == in.Name {
			d.mu.Unlock()
			return errdefs.AlreadyExists(fmt.Sprintf("sandbox named %q already exists", in.Name))
		}
	}
	d.sandboxes[in.ID] = sb
	sb.op.Lock()
	d.mu.Unlock()
	defer sb.op.Unlock()

	if err := os.Mkdir(d.dir(in.ID), 0o700); err != nil {
		// Never remove a directory this create did not make: it may be
		// a sandbox whose state could not be loaded.
		d.mu.Lock()
		delete(d.sandboxes, in.ID)
		d.mu.Unlock()
		if errors.Is(err, os.ErrExist) {
			return errdefs.AlreadyExists(fmt.Sprintf("sandbox %q: directory %s already exists", in.ID, d.dir(in.ID)))
		}
		return fmt.Errorf("sandbox %q: %w", in.ID, err)
	}
	if err := d.createFiles(sb, in.Spec.SandboxToken); err != nil {
		d.abandon(sb)
		return err
	}
	if err := d.spawn(sb, rootfs, l, cgRoot); err != nil {
		d.abandon(sb)
		return err
	}
	d.mu.Lock()
	sb.creating = false
	pid := sb.rec.PID
	d.emitLocked(d.sandboxEventLocked(sb))
	d.mu.Unlock()
	d.logger.Info("sandbox created", "sandbox_id", in.ID, "sandbox_name", in.Name, "pid", pid)
	return nil
}

// abandon undoes a failed create once it made the sandbox directory: no
// process, no directory, no token.
func (d *Driver) abandon(sb *sandbox) {
	_ = os.RemoveAll(d.dir(sb.rec.ID))
	d.mu.Lock()
	delete(d.sandboxes, sb.rec.ID)
	d.mu.Unlock()
}

// createFiles fills the new sandbox directory.
func (d *Driver) createFiles(sb *sandbox, token string) error {
	if err := os.Mkdir(d.workspaceDir(sb.rec.ID), 0o755); err != nil {
		return fmt.Errorf("sandbox %q: workspace: %w", sb.rec.ID, err)
	}
	if token != "" {
		// A fresh directory: exclusive create is enough, no rename needed.
		f, err := os.OpenFile(d.tokenPath(sb.rec.ID), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err == nil {
			_, err = f.WriteString(token)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			return fmt.Errorf("sandbox %q: token file: %w", sb.rec.ID, err)
		}
	}
	return nil // spawn records the state before it forks
}

// spawn starts a new supervisor incarnation for sb. sb.op must be held.
func (d *Driver) spawn(sb *sandbox, rootfs string, l limits, cgRoot string) error {
	id := sb.rec.ID
	var base uint32
	if mappedUserNS() {
		d.mu.Lock()
		err := d.allocIDBaseLocked(sb)
		base = sb.rec.IDBase
		d.mu.Unlock()
		if err != nil {
			return errdefs.ResourceExhausted(err.Error())
		}
	}
	attr := d.sysProcAttr(base)
	if !l.empty() {
		dir, fd, err := setupCgroup(cgRoot, id, l)
		if err != nil {
			return err
		}
		defer fd.Close()
		attr.UseCgroupFD = true
		attr.CgroupFD = int(fd.Fd())
		d.mu.Lock()
		sb.rec.CgroupDir = dir
		d.mu.Unlock()
	}
	logFile, err := os.OpenFile(filepath.Join(d.dir(id), "supervisor.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("sandbox %q: supervisor log: %w", id, err)
	}
	defer logFile.Close()

	// The supervisor's egress proxy dials upstream through this channel:
	// the sandbox's network namespace has loopback only.
	dialServe, dialChild, err := hostdial.Pair()
	if err != nil {
		return fmt.Errorf("sandbox %q: %w", id, err)
	}
	defer dialChild.Close()
	serving := false
	defer func() {
		if !serving {
			_ = dialServe.Close()
		}
	}()

	cmd := exec.Command(d.cfg.supervisorPath)
	cmd.Dir = d.workspaceDir(id)
	cmd.Env = d.environ(sb, rootfs)
	cmd.ExtraFiles = []*os.File{dialChild} // fd 3, OPENSHELL_EGRESS_DIALER_FD
	var imageSock *os.File
	if base > 0 {
		// Appends fds 4 and up.
		in := &inherited{cmd: cmd}
		defer in.close()
		if imageSock, err = d.prepareUserNS(sb, in, base, rootfs); err != nil {
			return err
		}
		if imageSock != nil {
			defer imageSock.Close()
		}
	} else if err := d.prepareOwnIDs(sb, cmd); err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = attr
	// Persist the incarnation before the process exists, so a gateway
	// crash right after the fork can find it by OPENSHELL_INSTANCE_ID.
	d.mu.Lock()
	sb.rec.PID, sb.rec.StartTime, sb.rec.ExitMessage = 0, 0, ""
	err = d.saveErr(sb)
	d.mu.Unlock()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		_ = removeCgroup(sb.rec.CgroupDir)
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, os.ErrPermission) {
			return errdefs.FailedPrecondition(fmt.Sprintf("start supervisor %s: %v", d.cfg.supervisorPath, err))
		}
		if attr.UseCgroupFD {
			return errdefs.FailedPrecondition(fmt.Sprintf("start supervisor in cgroup %s: %v", sb.rec.CgroupDir, err))
		}
		return fmt.Errorf("sandbox %q: start supervisor: %w", id, err)
	}
	pid := cmd.Process.Pid
	if imageSock != nil {
		// The supervisor waits for its image before it mounts anything.
		if err := sendImageMount(imageSock, pid, rootfs); err != nil {
			_ = signalGroup(pid, syscall.SIGKILL)
			_, _ = cmd.Process.Wait()
			_ = removeCgroup(sb.rec.CgroupDir)
			return errdefs.FailedPrecondition(fmt.Sprintf("sandbox %q: %v", id, err))
		}
	}
	// Serve ends when the supervisor (the only other holder) exits.
	serving = true
	go func() { _ = hostdial.Serve(dialServe, dialTimeout, nil) }()
	// The child is ours and unreaped, so its pid cannot be reused.
	h, err := openPid(pid, 0)
	if err != nil {
		_ = signalGroup(pid, syscall.SIGKILL)
		_, _ = cmd.Process.Wait()
		_ = removeCgroup(sb.rec.CgroupDir)
		return fmt.Errorf("sandbox %q: watch supervisor: %w", id, err)
	}
	_ = cmd.Process.Release()
	d.mu.Lock()
	sb.rec.PID, sb.rec.StartTime = pid, h.startTime
	sb.rec.Transition = time.Now().UTC()
	err = d.saveErr(sb)
	d.mu.Unlock()
	if err != nil {
		_ = signalGroup(pid, syscall.SIGKILL)
		_, _ = h.wait()
		h.file.Close()
		_ = removeCgroup(sb.rec.CgroupDir)
		return err
	}
	d.mu.Lock()
	d.attach(sb, h)
	d.mu.Unlock()
	return nil
}

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

func (d *Driver) environ(sb *sandbox, rootfs string) []string {
	spec := sb.rec.Spec
	id := sb.rec.ID
	env := map[string]string{"PATH": defaultPath, "HOME": "/sandbox"}
	maps.Copy(env, spec.Template.Environment)
	maps.Copy(env, spec.Environment)
	maps.DeleteFunc(env, func(k, _ string) bool { return telemetry.IsSupervisorEnv(k) })
	maps.Copy(env, d.cfg.supervisorEnv)
	command := spec.Command
	if command == nil {
		command = []string{}
	}
	cmdJSON, _ := json.Marshal(command)
	env["OPENSHELL_SANDBOX_ID"] = id
	env["OPENSHELL_SANDBOX_NAME"] = sb.rec.Name
	env["OPENSHELL_ENDPOINT"] = d.cfg.endpoint
	env["OPENSHELL_SANDBOX_COMMAND"] = string(cmdJSON)
	env["OPENSHELL_SANDBOX_TTY"] = strconv.FormatBool(spec.TTY)
	env["OPENSHELL_LOG_LEVEL"] = spec.LogLevel
	env["OPENSHELL_WORKSPACE_DIR"] = d.workspaceDir(id)
	env["OPENSHELL_INSTANCE_ID"] = sb.rec.InstanceID
	env["OPENSHELL_SANDBOX_HOSTNAME"] = sb.rec.Name
	env["OPENSHELL_PRIVATE_TMP"] = "true"
	env["OPENSHELL_PRIVATE_NETWORK"] = "true"
	env["OPENSHELL_EGRESS_DIALER_FD"] = "3"
	for _, k := range []string{"OPENSHELL_SANDBOX_TOKEN", "OPENSHELL_SANDBOX_TOKEN_FILE", "OPENSHELL_ROOTFS", "OPENSHELL_ROOTFS_LAYER", "OPENSHELL_EGRESS_TEST_HOSTS", "OPENSHELL_EGRESS_TEST_CA_FILE", "OPENSHELL_EGRESS_DIALER_SOCKET"} {
		delete(env, k) // only the driver sets these
	}
	if _, err := os.Stat(d.tokenPath(id)); err == nil {
		env["OPENSHELL_SANDBOX_TOKEN_FILE"] = d.tokenPath(id)
	}
	if rootfs != "" {
		env["OPENSHELL_ROOTFS"] = rootfs
		env["OPENSHELL_ROOTFS_LAYER"] = d.layerDir(id)
	}
	// Test-only resolver override of the egress proxy: from the gateway's
	// own environment, never from a sandbox spec.
	for _, k := range []string{"OPENSHELL_EGRESS_TEST_HOSTS", "OPENSHELL_EGRESS_TEST_CA_FILE"} {
		if v := os.Getenv(k); v != "" {
			env[k] = v
		}
	}
	out := make([]string, 0, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		out = append(out, k+"="+env[k])
	}
	return out
}

// attach starts the monitor for a running process. d.mu must be held.
func (d *Driver) attach(sb *sandbox, h *pidHandle) {
	r := &running{h: h, exited: make(chan struct{})}
	sb.proc = r
	d.wg.Add(1)
	go d.monitor(sb, r)
}

// monitor waits for the process to exit and records how.
func (d *Driver) monitor(sb *sandbox, r *running) {
	defer d.wg.Done()
	info, err := r.h.wait()
	r.h.file.Close()
	if err != nil {
		// Close: the driver stops watching; the process keeps running.
		return
	}
	now := time.Now().UTC()
	d.mu.Lock()
	if sb.proc == r {
		sb.proc = nil
		closeProxyLocked(sb)
	}
	sb.rec.PID, sb.rec.StartTime = 0, 0
	sb.rec.Transition = now
	unexpected := !sb.rec.Stopped && !sb.deleting
	if unexpected {
		sb.rec.ExitMessage = info.String()
	}
	if !sb.deleting {
		d.save(sb)
	}
	close(r.exited)
	id := sb.rec.ID
	if !sb.creating {
		ev := d.sandboxEventLocked(sb)
		pe := compute.Event{Kind: compute.EventPlatform, SandboxID: id, Platform: compute.PlatformEvent{
			Time: now, Source: Name, Type: "Normal", Reason: "ProcessStopped", Message: info.String(),
			Metadata: map[string]string{"pid": strconv.Itoa(r.h.pid), "instance_id": sb.rec.InstanceID},
		}}
		if unexpected {
			pe.Platform.Type, pe.Platform.Reason = "Warning", "ProcessExited"
		}
		if info.known {
			pe.Platform.Metadata["exit_code"] = strconv.Itoa(info.code)
		}
		if info.signal != 0 {
			pe.Platform.Metadata["signal"] = unix.SignalName(info.signal)
		}
		d.emitLocked(pe)
		d.emitLocked(ev)
	}
	d.mu.Unlock()
	d.logger.Info("supervisor exited", "sandbox_id", id, "pid", r.h.pid, "status", info.String(), "unexpected", unexpected)
}

// Get implements compute.Driver.
func (d *Driver) Get(_ context.Context, ref compute.Ref) (compute.Sandbox, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	sb, err := d.findLocked(ref)
	if err != nil {
		return compute.Sandbox{}, err
	}
	return d.viewLocked(sb), nil
}

// List implements compute.Driver.
func (d *Driver) List(context.Context) ([]compute.Sandbox, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]compute.Sandbox, 0, len(d.sandboxes))
	for _, sb := range d.sandboxes {
		if !sb.creating {
			out = append(out, d.viewLocked(sb))
		}
	}
	slices.SortFunc(out, func(a, b compute.Sandbox) int { return cmpString(a.Name, b.Name) })
	return out, nil
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func (d *Driver) findLocked(ref compute.Ref) (*sandbox, error) {
	if ref.ID != "" {
		if sb, ok := d.sandboxes[ref.ID]; ok && !sb.creating {
			return sb, nil
		}
	}
	if ref.Name != "" {
		for _, sb := range d.sandboxes {
			if sb.rec.Name == ref.Name && !sb.creating {
				return sb, nil
			}
		}
	}
	what := ref.ID
	if what == "" {
		what = ref.Name
	}
	return nil, errdefs.NotFound(fmt.Sprintf("sandbox %q not found", what))
}

func (d *Driver) viewLocked(sb *sandbox) compute.Sandbox {
	rec := sb.rec
	return compute.Sandbox{
		ID: rec.ID, Name: rec.Name, Namespace: rec.Namespace, Workspace: rec.Workspace,
		Spec:   rec.Spec,
		Status: d.statusLocked(sb),
	}
}

func (d *Driver) statusLocked(sb *sandbox) compute.Status {
	rec := sb.rec
	ts := rec.Transition.Format(time.RFC3339)
	st := compute.Status{SandboxName: rec.Name, InstanceID: rec.InstanceID, Deleting: sb.deleting}
	switch {
	case rec.Broken != "":
		st.Conditions = []compute.Condition{{Type: compute.ConditionReady, Status: "False", Reason: "Error",
			Message: rec.Broken, LastTransitionTime: ts}}
	case sb.proc != nil && !rec.Stopped:
		st.Conditions = []compute.Condition{{Type: compute.ConditionReady, Status: "True", Reason: "Running",
			Message: fmt.Sprintf("supervisor process running (pid %d)", rec.PID), LastTransitionTime: ts}}
	case rec.Stopped:
		msg := "sandbox stopped"
		if sb.proc != nil {
			msg = "sandbox stopping"
		}
		st.Conditions = []compute.Condition{
			{Type: compute.ConditionReady, Status: "False", Reason: "Stopped", Message: msg, LastTransitionTime: ts},
			{Type: compute.ConditionSuspended, Status: "True", Reason: "Stopped", Message: msg, LastTransitionTime: ts},
		}
	default:
		msg := rec.ExitMessage
		if msg == "" {
			msg = "supervisor process is not running"
		}
		st.Conditions = []compute.Condition{{Type: compute.ConditionReady, Status: "False", Reason: "ProcessExited",
			Message: msg, LastTransitionTime: ts}}
	}
	return st
}

func (d *Driver) sandboxEventLocked(sb *sandbox) compute.Event {
	return compute.Event{Kind: compute.EventSandbox, SandboxID: sb.rec.ID, Sandbox: d.viewLocked(sb)}
}

// lookup finds a sandbox and locks its op mutex.
func (d *Driver) lookup(ref compute.Ref) (*sandbox, error) {
	d.mu.Lock()
	sb, err := d.findLocked(ref)
	d.mu.Unlock()
	if err != nil {
		return nil, err
	}
	sb.op.Lock()
	return sb, nil
}

// usableLocked refuses Stop and Start on a sandbox being deleted or whose
// state could not be loaded. d.mu must be held.
func usableLocked(sb *sandbox) error {
	switch {
	case sb.deleting:
		return errdefs.FailedPrecondition(fmt.Sprintf("sandbox %q is being deleted", sb.rec.Name))
	case sb.rec.Broken != "":
		return errdefs.FailedPrecondition(sb.rec.Broken)
	}
	return nil
}

// Stop implements compute.Driver: SIGTERM to the process group, SIGKILL
// after the grace period. It returns once the process is gone.
func (d *Driver) Stop(ctx context.Context, ref compute.Ref) error {
	sb, err := d.lookup(ref)
	if err != nil {
		return err
	}
	defer sb.op.Unlock()
	d.mu.Lock()
	if err := usableLocked(sb); err != nil {
		d.mu.Unlock()
		return err
	}
	wasStopped := sb.rec.Stopped
	sb.rec.Stopped = true
	r := sb.proc
	if !wasStopped {
		sb.rec.Transition = time.Now().UTC()
		if err := d.saveErr(sb); err != nil {
			sb.rec.Stopped = false
			d.mu.Unlock()
			return err
		}
		if r == nil {
			d.emitLocked(d.sandboxEventLocked(sb))
		}
	}
	d.mu.Unlock()
	if r == nil {
		return nil
	}
	return d.terminate(ctx, r)
}

// killWait bounds the wait for a supervisor to exit after SIGKILL.
const killWait = 10 * time.Second

// terminate ends a running supervisor: SIGTERM to its process group, then
// SIGKILL after the stop grace period or as soon as ctx ends, and waits for
// the monitor to record the exit (see kill). It returns ctx's error when
// ctx ends before the exit was recorded; the process has been sent SIGKILL
// by then.
func (d *Driver) terminate(ctx context.Context, r *running) error {
	if err := signalGroup(r.h.pid, syscall.SIGTERM); err != nil {
		return fmt.Errorf("signal supervisor %d: %w", r.h.pid, err)
	}
	grace := time.NewTimer(d.cfg.stopGrace)
	defer grace.Stop()
	select {
	case <-r.exited:
		return nil
	case <-grace.C:
	case <-ctx.Done():
	}
	return d.kill(ctx, r)
}

// kill sends SIGKILL to the supervisor's process group and waits for the
// monitor to record the exit, at most until ctx ends or killWait passed.
func (d *Driver) kill(ctx context.Context, r *running) error {
	if err := signalGroup(r.h.pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill supervisor %d: %w", r.h.pid, err)
	}
	bound := time.NewTimer(killWait)
	defer bound.Stop()
	select {
	case <-r.exited:
		return nil
	case <-d.done:
		return errdefs.Unavailable("process driver is closed")
	case <-ctx.Done():
		select {
		case <-r.exited: // exited while ctx ended: still a success
			return nil
		default:
		}
		return fmt.Errorf("supervisor %d: sent SIGKILL, exit not yet observed: %w", r.h.pid, ctx.Err())
	case <-bound.C:
		return errdefs.Unavailable(fmt.Sprintf("supervisor %d did not exit within %v of SIGKILL", r.h.pid, killWait))
	}
}

// Start implements compute.Driver. A sandbox whose process is running is
// left alone.
func (d *Driver) Start(ctx context.Context, ref compute.Ref) error {
	sb, err := d.lookup(ref)
	if err != nil {
		return err
	}
	defer sb.op.Unlock()
	d.mu.Lock()
	if err := usableLocked(sb); err != nil {
		d.mu.Unlock()
		return err
	}
	if d.closed {
		d.mu.Unlock()
		return errdefs.Unavailable("process driver is closed")
	}
	if sb.proc != nil {
		if sb.rec.Stopped {
			sb.rec.Stopped = false
			d.save(sb)
			d.emitLocked(d.sandboxEventLocked(sb))
		}
		d.mu.Unlock()
		return nil
	}
	spec := sb.rec.Spec
	d.mu.Unlock()
	rootfs, l, cgRoot, err := d.validate(compute.Sandbox{ID: sb.rec.ID, Name: sb.rec.Name, Spec: spec})
	if err != nil {
		return err
	}
	d.mu.Lock()
	prevInstance, prevStopped := sb.rec.InstanceID, sb.rec.Stopped
	sb.rec.InstanceID = uuid.NewString()
	sb.rec.Stopped = false
	d.mu.Unlock()
	if err := d.spawn(sb, rootfs, l, cgRoot); err != nil {
		d.mu.Lock()
		sb.rec.InstanceID, sb.rec.Stopped = prevInstance, prevStopped
		d.save(sb)
		d.mu.Unlock()
		return err
	}
	d.mu.Lock()
	d.emitLocked(d.sandboxEventLocked(sb))
	d.mu.Unlock()
	return nil
}

// Delete implements compute.Driver: it ends the process group as Stop
// does (SIGTERM, SIGKILL after the grace period or when ctx ends) and
// removes the sandbox directory (workspace and token included), also for a
// sandbox whose state could not be loaded.
func (d *Driver) Delete(ctx context.Context, ref compute.Ref) (bool, error) {
	sb, err := d.lookup(ref)
	if errors.Is(err, errdefs.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer sb.op.Unlock()
	d.mu.Lock()
	if _, ok := d.sandboxes[sb.rec.ID]; !ok {
		d.mu.Unlock()
		return false, nil // deleted while we waited for the op lock
	}
	sb.deleting = true
	r := sb.proc
	cgroupDir := sb.rec.CgroupDir
	d.emitLocked(d.sandboxEventLocked(sb))
	d.mu.Unlock()
	if r != nil {
		if err := d.terminate(ctx, r); err != nil {
			return false, err
		}
	}
	if err := removeCgroup(cgroupDir); err != nil {
		d.logger.Warn("remove sandbox cgroup", "sandbox_id", sb.rec.ID, "error", err)
	}
	d.mu.Lock()
	closeProxyLocked(sb)
	d.mu.Unlock()
	if err := os.RemoveAll(d.dir(sb.rec.ID)); err != nil {
		return false, fmt.Errorf("sandbox %q: remove state: %w", sb.rec.ID, err)
	}
	d.mu.Lock()
	delete(d.sandboxes, sb.rec.ID)
	d.emitLocked(compute.Event{Kind: compute.EventDeleted, SandboxID: sb.rec.ID})
	d.mu.Unlock()
	d.logger.Info("sandbox deleted", "sandbox_id", sb.rec.ID)
	return true, nil
}

// save persists sb.rec, logging failures (used where the in-memory state
// stays authoritative).
func (d *Driver) save(sb *sandbox) {
	if err := d.saveErr(sb); err != nil {
		d.logger.Error("persist sandbox state", "sandbox_id", sb.rec.ID, "error", err)
	}
}

// saveErr persists sb.rec. d.mu must be held.
func (d *Driver) saveErr(sb *sandbox) error {
	data, err := json.MarshalIndent(sb.rec, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(d.dir(sb.rec.ID), "state.json"), data, 0o600); err != nil {
		return fmt.Errorf("sandbox %q: save state: %w", sb.rec.ID, err)
	}
	return nil
}

// userNamespacesRefusal explains why the process driver cannot honour an
// explicit user_namespaces request: whether a sandbox's root maps to an
// unprivileged host id range is decided by the driver, not the request.
func userNamespacesRefusal(want bool) string {
	if !want {
		return "spec.template user_namespaces=false is not supported by the process driver: sandboxes always map their root to an unprivileged host id range"
	}
	return "spec.template user_namespaces=true is not supported by the process driver when the gateway does not run as root (only its own id can be mapped)"
}
