package docker

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/volume"
	"github.com/docker/docker/client"

	"github.com/openshell-go/openshell/internal/atomicfile"
	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/supervisor/egress/hostdial"
	"github.com/openshell-go/openshell/internal/telemetry"
	"github.com/openshell-go/openshell/internal/version"
)

// Name is the driver's registry name.
const Name = "docker"

// Labels on every container and volume the driver creates.
const (
	LabelManagedBy   = "openshell.ai/managed-by"
	LabelGatewayID   = "openshell.ai/gateway-id"
	LabelSandboxID   = "openshell.ai/sandbox-id"
	LabelSandboxName = "openshell.ai/sandbox-name"
	LabelNamespace   = "openshell.ai/namespace"
	LabelWorkspace   = "openshell.ai/workspace"
	managedBy        = "openshell-go"
)

// Paths inside the container.
const (
	SupervisorPath = "/opt/openshell/bin/openshell-sandbox"
	CallbackDir    = "/run/openshell/gateway"
	WorkspaceDir   = "/sandbox"
	// TokenDir holds the sandbox JWT (TokenDir/token, 0600, in a 0700
	// directory, both owned by root), copied into the container's writable
	// layer before it starts.
	TokenDir = "/.openshell"
)

// Driver runs sandboxes as Docker containers. It is safe for concurrent
// use; Close ends its watches and pulls without touching containers.
type Driver struct {
	logger    *slog.Logger
	cfg       config
	cli       *client.Client
	gatewayID string

	supervisorEnv map[string]string // deps.SupervisorEnv (the gateway's OTLP settings)

	ops keyedMutex // by sandbox id (create/start/stop/delete) and by name (create)

	mu      sync.Mutex
	closed  bool
	done    chan struct{}
	pending map[string]*pending // sandboxes waiting for their image
	subs    map[*subscriber]struct{}
	wg      sync.WaitGroup
	// dialers are the host dialers served per sandbox id; nil when
	// containers get none (noEgress says why).
	dialers  map[string]*hostdial.Listener
	noEgress error
}

var (
	_ compute.Driver = (*Driver)(nil)
	_ io.Closer      = (*Driver)(nil)
)

// New is the compute.Factory for the docker driver.
func New(cfg map[string]any, deps compute.FactoryDeps) (compute.Driver, error) {
	return Open(cfg, deps)
}

// Open is New returning the concrete type. It fails with
// FailedPrecondition when the Docker daemon cannot be reached, naming the
// socket and why (missing, permission denied, not answering).
func Open(cfg map[string]any, deps compute.FactoryDeps) (*Driver, error) {
	c, err := parseConfig(cfg, deps)
	if err != nil {
		return nil, err
	}
	logger := deps.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	cli, err := client.NewClientWithOpts(client.WithHost(c.host), client.WithAPIVersionNegotiation())
	if err != nil {
		return nil, fmt.Errorf("docker driver: client for %s: %w", c.host, errdefs.ErrInvalidArgument)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Ping(ctx); err != nil {
		_ = cli.Close()
		return nil, daemonError(c, err)
	}
	cli.NegotiateAPIVersion(ctx)
	dir := filepath.Join(c.stateDir, "docker")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		_ = cli.Close()
		return nil, fmt.Errorf("docker driver: state directory: %w", err)
	}
	gid, err := gatewayID(dir)
	if err != nil {
		_ = cli.Close()
		return nil, err
	}
	d := &Driver{
		logger:    logger.With("component", "compute/docker"),
		cfg:       c,
		cli:       cli,
		gatewayID: gid,
		done:      make(chan struct{}),
		pending:   map[string]*pending{},
		subs:      map[*subscriber]struct{}{},
	}
	d.supervisorEnv = deps.SupervisorEnv
	d.logger.Info("docker engine reachable", "host", c.host, "api_version", cli.ClientVersion(), "gateway_id", gid)
	d.sweepUnstarted(ctx)
	d.sweepVolumes(ctx)
	if d.noEgress = egressAvailable(ctx, d); d.noEgress != nil {
		d.logger.Warn("sandboxes get no host dialer, so no egress", "reason", d.noEgress)
	} else {
		d.dialers = map[string]*hostdial.Listener{}
		if err := d.serveExistingDialers(ctx); err != nil {
			d.closeDialers()
			_ = cli.Close()
			return nil, err
		}
	}
	return d, nil
}

// sweepUnstarted removes this gateway's containers that were created but
// never started: a create the gateway died in the middle of (the token may
// not even be in the container). The create never returned, so the
// gateway's recovery then drops the sandbox; left alone, it would wait in
// Starting forever. Their volumes go with sweepVolumes.
func (d *Driver) sweepUnstarted(ctx context.Context) {
	list, err := d.cli.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(
		filters.Arg("label", LabelGatewayID+"="+d.gatewayID),
		filters.Arg("status", container.StateCreated),
	)})
	if err != nil {
		d.logger.Warn("list unstarted containers", "error", err)
		return
	}
	for _, c := range list {
		id := c.Labels[LabelSandboxID]
		if err := d.cli.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true}); err != nil {
			d.logger.Warn("remove a container whose create was interrupted", "sandbox_id", id, "container", c.ID, "error", err)
			continue
		}
		d.logger.Warn("removed a container whose create was interrupted", "sandbox_id", id, "container", c.ID)
	}
}

// sweepVolumes removes this gateway's workspace volumes that have no
// container: what a create interrupted between the volume and the
// container leaves. Failures are logged; nothing else is touched.
func (d *Driver) sweepVolumes(ctx context.Context) {
	vols, err := d.cli.VolumeList(ctx, volume.ListOptions{Filters: filters.NewArgs(filters.Arg("label", LabelGatewayID+"="+d.gatewayID))})
	if err != nil {
		d.logger.Warn("list workspace volumes", "error", err)
		return
	}
	for _, v := range vols.Volumes {
		id := v.Labels[LabelSandboxID]
		if id == "" || v.Name != volumeName(id) {
			continue
		}
		c, err := d.find(ctx, compute.Ref{ID: id})
		if err != nil || c != nil {
			continue
		}
		if err := d.cli.VolumeRemove(ctx, v.Name, false); err != nil {
			d.logger.Warn("remove a workspace volume without its container", "volume", v.Name, "error", err)
			continue
		}
		d.logger.Warn("removed a workspace volume without its container", "sandbox_id", id, "volume", v.Name)
	}
}

// daemonError explains why the daemon at c.host cannot be reached: for a
// unix socket it dials the socket itself to tell a missing socket, a
// permission problem and a dead daemon apart.
func daemonError(c config, err error) error {
	if c.socketPath != "" {
		_, serr := os.Stat(c.socketPath)
		if errors.Is(serr, os.ErrNotExist) {
			return errdefs.FailedPrecondition(fmt.Sprintf("docker driver: Docker socket %s does not exist: is dockerd running? (set socket_path in [openshell.drivers.docker] or DOCKER_HOST)", c.socketPath))
		}
		derr := serr
		if derr == nil {
			var conn net.Conn
			if conn, derr = net.DialTimeout("unix", c.socketPath, 2*time.Second); derr == nil {
				conn.Close()
			}
		}
		switch {
		case errors.Is(derr, os.ErrPermission) || errors.Is(derr, syscall.EACCES) || errors.Is(derr, syscall.EPERM):
			return errdefs.FailedPrecondition(fmt.Sprintf("docker driver: permission denied on Docker socket %s: the gateway's user needs access to it (root or the socket's group)", c.socketPath))
		case errors.Is(derr, syscall.ECONNREFUSED):
			return errdefs.FailedPrecondition(fmt.Sprintf("docker driver: nothing listens on Docker socket %s: is dockerd running?", c.socketPath))
		}
	}
	return errdefs.FailedPrecondition(fmt.Sprintf("docker driver: Docker Engine at %s is not reachable: %v", c.host, err))
}

// gatewayID returns this gateway's id, created once in dir. Containers
// carry it, so several gateways can share one Docker Engine.
func gatewayID(dir string) (string, error) {
	p := filepath.Join(dir, "gateway-id")
	if b, err := os.ReadFile(p); err == nil {
		if id := strings.TrimSpace(string(b)); idRE.MatchString(id) {
			return id, nil
		}
		return "", fmt.Errorf("docker driver: %s does not hold a gateway id: %w", p, errdefs.ErrFailedPrecondition)
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("docker driver: %w", err)
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	if err := atomicfile.Write(p, []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("docker driver: %w", err)
	}
	return id, nil
}

// GatewayID is the id in the gateway-id label of this driver's containers.
func (d *Driver) GatewayID() string { return d.gatewayID }

// Close ends every watch and pending pull and closes the client. It never
// stops containers. Idempotent.
func (d *Driver) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	close(d.done)
	for _, p := range d.pending {
		p.cancel()
	}
	d.mu.Unlock()
	d.wg.Wait()
	d.closeDialers()
	return d.cli.Close()
}

// Capabilities implements compute.Driver.
func (d *Driver) Capabilities(context.Context) (compute.Capabilities, error) {
	return compute.Capabilities{
		DriverName:    Name,
		DriverVersion: version.Version,
		DefaultImage:  d.cfg.defaultImage,
		// Containers outlive the gateway; it does not stop them.
		GatewayManagesLifecycle: false,
	}, nil
}

var (
	idRE  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	dnsRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)
)

// ValidateCreate implements compute.Driver. It reads (never changes) the
// daemon's image store when image_pull_policy is Never.
func (d *Driver) ValidateCreate(ctx context.Context, sb compute.Sandbox) error {
	_, err := d.validate(ctx, sb)
	return err
}

// plan is a validated create request.
type plan struct {
	sb    compute.Sandbox
	image string
	res   container.Resources
}

func (d *Driver) validate(ctx context.Context, sb compute.Sandbox) (plan, error) {
	switch {
	case sb.ID == "":
		return plan{}, errdefs.InvalidArgument("sandbox id is required")
	case !idRE.MatchString(sb.ID):
		return plan{}, errdefs.InvalidArgument(fmt.Sprintf("sandbox id %q is not valid", sb.ID))
	case sb.Name == "":
		return plan{}, errdefs.InvalidArgument("sandbox name is required")
	case !dnsRE.MatchString(sb.Name):
		return plan{}, errdefs.InvalidArgument(fmt.Sprintf("sandbox name %q is not a DNS-1123 label", sb.Name))
	}
	t := sb.Spec.Template
	p := plan{sb: sb, image: t.Image}
	if p.image == "" {
		p.image = d.cfg.defaultImage
	}
	if p.image == "" {
		return plan{}, errdefs.InvalidArgument("docker driver: the sandbox names no image and default_image is not set in [openshell.drivers.docker]")
	}
	if strings.HasPrefix(p.image, "dir:") || filepath.IsAbs(p.image) {
		return plan{}, errdefs.InvalidArgument(fmt.Sprintf("docker driver runs container images, not root filesystem directories: %q", p.image))
	}
	if rc := t.RuntimeClassName; rc != "" {
		return plan{}, errdefs.InvalidArgument(fmt.Sprintf("spec.template.runtime_class_name %q is not supported by the docker driver", rc))
	}
	if len(t.Annotations) > 0 {
		return plan{}, errdefs.InvalidArgument("spec.template annotations are not supported by the docker driver (they are Kubernetes pod annotations)")
	}
	if t.UserNamespaces != nil && *t.UserNamespaces {
		return plan{}, errdefs.InvalidArgument("spec.template.user_namespaces is not supported by the docker driver (user namespace remapping is a daemon-wide Docker setting)")
	}
	for k := range t.DriverConfig {
		return plan{}, errdefs.InvalidArgument(fmt.Sprintf("docker driver: unknown driver_config key %q", k))
	}
	for what, env := range map[string]map[string]string{"template environment": t.Environment, "environment": sb.Spec.Environment} {
		for k, v := range env {
			if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
				return plan{}, errdefs.InvalidArgument(fmt.Sprintf("%s variable %q is not a valid environment entry", what, k))
			}
		}
	}
	for _, a := range sb.Spec.Command {
		if strings.ContainsRune(a, 0) {
			return plan{}, errdefs.InvalidArgument("command arguments must not contain NUL")
		}
	}
	var err error
	if p.res, err = resources(t.Resources, d.cfg.pidsLimit); err != nil {
		return plan{}, err
	}
	if err := d.cfg.checkSupervisor(); err != nil {
		return plan{}, err
	}
	if d.cfg.pullPolicy == PullNever {
		if _, err := d.cli.ImageInspect(ctx, p.image); err != nil {
			if cerrdefs.IsNotFound(err) {
				return plan{}, errdefs.FailedPrecondition(fmt.Sprintf("image %q is not present on the Docker Engine and image_pull_policy is Never", p.image))
			}
			return plan{}, d.apiError("inspect image "+p.image, err)
		}
	}
	return p, nil
}

// apiError maps a Docker API error to an errdefs kind.
func (d *Driver) apiError(what string, err error) error {
	switch {
	case err == nil:
		return nil
	case cerrdefs.IsNotFound(err):
		return fmt.Errorf("docker driver: %s: %w: %w", what, err, errdefs.ErrNotFound)
	case cerrdefs.IsConflict(err):
		return fmt.Errorf("docker driver: %s: %w: %w", what, err, errdefs.ErrAlreadyExists)
	case cerrdefs.IsInvalidArgument(err):
		return fmt.Errorf("docker driver: %s: %w: %w", what, err, errdefs.ErrInvalidArgument)
	case client.IsErrConnectionFailed(err), cerrdefs.IsUnavailable(err):
		return fmt.Errorf("docker driver: %s: %w: %w", what, err, errdefs.ErrUnavailable)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	}
	return fmt.Errorf("docker driver: %s: %w", what, err)
}

func (d *Driver) op(key string) func() { return d.ops.lock(key) }

func containerName(id string) string { return "openshell-" + id }
func volumeName(id string) string    { return "openshell-" + id + "-workspace" }

func (d *Driver) labels(sb compute.Sandbox) map[string]string {
	l := map[string]string{
		LabelManagedBy:   managedBy,
		LabelGatewayID:   d.gatewayID,
		LabelSandboxID:   sb.ID,
		LabelSandboxName: sb.Name,
	}
	if sb.Namespace != "" {
		l[LabelNamespace] = sb.Namespace
	}
	if sb.Workspace != "" {
		l[LabelWorkspace] = sb.Workspace
	}
	return l
}

// Create implements compute.Driver. With the image present (and
// image_pull_policy not Always) the container is created and started
// before Create returns. Otherwise the sandbox is recorded as pulling and
// Create returns at once; the pull's progress and any failure are
// platform events of the sandbox, and the container follows the pull.
func (d *Driver) Create(ctx context.Context, sb compute.Sandbox) error {
	p, err := d.validate(ctx, sb)
	if err != nil {
		return err
	}
	unlock := d.op(sb.ID)
	defer unlock()
	// Names are unique too: two creates of one name under different ids
	// must not both pass checkUnique.
	unlockName := d.op("name\x00" + sb.Name)
	defer unlockName()
	if err := d.checkUnique(ctx, sb); err != nil {
		return err
	}
	pull := d.cfg.pullPolicy == PullAlways
	if !pull {
		if _, err := d.cli.ImageInspect(ctx, p.image); err != nil {
			if !cerrdefs.IsNotFound(err) {
				return d.apiError("inspect image "+p.image, err)
			}
			pull = true
		}
	}
	if pull {
		return d.startPull(p)
	}
	return d.createContainer(ctx, p)
}

// checkUnique refuses a second sandbox with sb's id or name.
func (d *Driver) checkUnique(ctx context.Context, sb compute.Sandbox) error {
	d.mu.Lock()
	for _, p := range d.pending {
		if p.plan.sb.ID == sb.ID || p.plan.sb.Name == sb.Name {
			d.mu.Unlock()
			return errdefs.AlreadyExists(fmt.Sprintf("sandbox %q (id %s) already exists", sb.Name, sb.ID))
		}
	}
	d.mu.Unlock()
	for _, f := range []filters.KeyValuePair{
		filters.Arg("label", LabelSandboxID+"="+sb.ID),
		filters.Arg("label", LabelSandboxName+"="+sb.Name),
	} {
		list, err := d.cli.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", LabelGatewayID+"="+d.gatewayID), f)})
		if err != nil {
			return d.apiError("list containers", err)
		}
		if len(list) > 0 {
			return errdefs.AlreadyExists(fmt.Sprintf("sandbox %q (id %s) already exists", sb.Name, sb.ID))
		}
	}
	return nil
}

// createContainer creates the workspace volume and the container, copies
// the token in and starts it. On failure nothing is left behind. Call
// under the sandbox's op lock.
func (d *Driver) createContainer(ctx context.Context, p plan) (err error) {
	sb := p.sb
	labels := d.labels(sb)
	if _, err := d.cli.VolumeCreate(ctx, volume.CreateOptions{Name: volumeName(sb.ID), Labels: labels}); err != nil {
		return d.apiError("create workspace volume", err)
	}
	created := false
	defer func() {
		if err == nil {
			return
		}
		_ = d.dropDialer(sb.ID)
		cctx := context.WithoutCancel(ctx)
		if created {
			_ = d.cli.ContainerRemove(cctx, containerName(sb.ID), container.RemoveOptions{Force: true, RemoveVolumes: true})
		}
		_ = d.cli.VolumeRemove(cctx, volumeName(sb.ID), true)
	}()
	if err := d.serveDialer(sb.ID); err != nil {
		return err
	}
	cfg, hc := d.containerConfig(p, labels)
	if _, err := d.cli.ContainerCreate(ctx, cfg, hc, nil, nil, containerName(sb.ID)); err != nil {
		if cerrdefs.IsConflict(err) {
			return errdefs.AlreadyExists(fmt.Sprintf("sandbox %q (id %s): container %s already exists", sb.Name, sb.ID, containerName(sb.ID)))
		}
		return d.apiError("create container", err)
	}
	created = true
	if tok := sb.Spec.SandboxToken; tok != "" {
		if err := d.cli.CopyToContainer(ctx, containerName(sb.ID), "/", tokenArchive(tok), container.CopyToContainerOptions{}); err != nil {
			return d.apiError("copy the sandbox token into the container", err)
		}
	}
	if err := d.cli.ContainerStart(ctx, containerName(sb.ID), container.StartOptions{}); err != nil {
		return d.startError(sb, err)
	}
	d.logger.Info("sandbox container started", "sandbox_id", sb.ID, "name", sb.Name, "image", p.image)
	return nil
}

// startError explains a failed container start (a GPU request the daemon
// cannot serve is the common one).
func (d *Driver) startError(sb compute.Sandbox, err error) error {
	msg := err.Error()
	if sb.Spec.Template.Resources.GPUs > 0 && strings.Contains(msg, "device driver") {
		return errdefs.FailedPrecondition(fmt.Sprintf("docker driver: the Docker Engine cannot provide %d GPU(s) (install and configure the NVIDIA container toolkit): %s", sb.Spec.Template.Resources.GPUs, msg))
	}
	return d.apiError("start container", err)
}

// tokenArchive is a tar stream holding TokenDir/token (0600 in a 0700
// directory, root-owned) with tok.
func tokenArchive(tok string) io.Reader {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	now := time.Now()
	dir := strings.TrimPrefix(TokenDir, "/")
	_ = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir + "/", Mode: 0o700, ModTime: now})
	_ = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: dir + "/token", Mode: 0o600, Size: int64(len(tok)), ModTime: now})
	_, _ = tw.Write([]byte(tok))
	_ = tw.Close()
	return &buf
}

// containerConfig builds the container for p (see the package doc).
func (d *Driver) containerConfig(p plan, labels map[string]string) (*container.Config, *container.HostConfig) {
	sb := p.sb
	env := map[string]string{"HOME": WorkspaceDir}
	maps.Copy(env, sb.Spec.Template.Environment)
	maps.Copy(env, sb.Spec.Environment)
	for k := range env {
		if strings.HasPrefix(k, "OPENSHELL_SANDBOX_TOKEN") || strings.HasPrefix(k, "OPENSHELL_EGRESS_") {
			delete(env, k)
		}
	}
	maps.DeleteFunc(env, func(k, _ string) bool { return telemetry.IsSupervisorEnv(k) })
	maps.Copy(env, d.supervisorEnv)
	cmd, _ := json.Marshal(sb.Spec.Command)
	if sb.Spec.Command == nil {
		cmd = []byte("[]")
	}
	env["OPENSHELL_SANDBOX_ID"] = sb.ID
	env["OPENSHELL_SANDBOX_NAME"] = sb.Name
	env["OPENSHELL_ENDPOINT"] = "unix://" + CallbackDir + "/" + d.cfg.callbackSock
	env["OPENSHELL_SANDBOX_COMMAND"] = string(cmd)
	env["OPENSHELL_SANDBOX_TTY"] = fmt.Sprint(sb.Spec.TTY)
	env["OPENSHELL_LOG_LEVEL"] = sb.Spec.LogLevel
	env["OPENSHELL_WORKSPACE_DIR"] = WorkspaceDir
	if sb.Spec.SandboxToken != "" {
		env["OPENSHELL_SANDBOX_TOKEN_FILE"] = TokenDir + "/token"
	}
	// The container's network namespace has loopback only (network mode
	// none); with the host dialer the supervisor runs the egress proxy.
	env["OPENSHELL_PRIVATE_NETWORK"] = "true"
	if d.dialers != nil {
		env["OPENSHELL_EGRESS_DIALER_PATH"] = EgressDir + "/" + dialerSocketName
		// Test only, from the gateway's own environment (as the process
		// driver does): the proxy's resolver override.
		if v := os.Getenv("OPENSHELL_EGRESS_TEST_HOSTS"); v != "" {
			env["OPENSHELL_EGRESS_TEST_HOSTS"] = v
		}
	}
	list := make([]string, 0, len(env))
	for _, k := range sortedKeys(env) {
		list = append(list, k+"="+env[k])
	}
	cfg := &container.Config{
		Image:      p.image,
		Hostname:   sb.Name,
		Entrypoint: []string{SupervisorPath},
		Cmd:        nil,
		Env:        list,
		WorkingDir: WorkspaceDir,
		Labels:     labels,
		StopSignal: "SIGTERM",
	}
	timeout := int(d.cfg.stopTimeout / time.Second)
	cfg.StopTimeout = &timeout
	caps := []string{"CHOWN", "KILL", "SETGID", "SETPCAP", "SETUID"}
	if os.Geteuid() != 0 {
		// The callback socket and its directory belong to the gateway's
		// user, not to the container's root.
		caps = append(caps, "DAC_OVERRIDE")
	}
	hc := &container.HostConfig{
		NetworkMode: "none",
		Mounts: []mount.Mount{
			{Type: mount.TypeBind, Source: d.cfg.supervisorPath, Target: SupervisorPath, ReadOnly: true},
			{Type: mount.TypeBind, Source: d.cfg.callbackDir, Target: CallbackDir, ReadOnly: true},
			{Type: mount.TypeVolume, Source: volumeName(sb.ID), Target: WorkspaceDir},
		},
		Tmpfs:         map[string]string{"/tmp": "rw,nosuid,nodev,mode=1777"},
		CapDrop:       []string{"ALL"},
		CapAdd:        caps,
		SecurityOpt:   []string{"no-new-privileges:true"},
		RestartPolicy: container.RestartPolicy{Name: container.RestartPolicyDisabled},
		Resources:     p.res,
		Init:          new(bool), // the supervisor is pid 1 and reaps
	}
	if d.dialers != nil {
		hc.Mounts = append(hc.Mounts, mount.Mount{Type: mount.TypeBind, Source: d.egressDir(sb.ID), Target: EgressDir, ReadOnly: true})
	}
	return cfg, hc
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// find returns the container of ref (by id label, then name label); nil
// when none.
func (d *Driver) find(ctx context.Context, ref compute.Ref) (*container.Summary, error) {
	var f filters.KeyValuePair
	switch {
	case ref.ID != "":
		f = filters.Arg("label", LabelSandboxID+"="+ref.ID)
	case ref.Name != "":
		f = filters.Arg("label", LabelSandboxName+"="+ref.Name)
	default:
		return nil, errdefs.InvalidArgument("sandbox id or name is required")
	}
	list, err := d.cli.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", LabelGatewayID+"="+d.gatewayID), f)})
	if err != nil {
		return nil, d.apiError("list containers", err)
	}
	if len(list) == 0 {
		return nil, nil
	}
	return &list[0], nil
}

func notFound(ref compute.Ref) error {
	if ref.ID != "" {
		return errdefs.NotFound(fmt.Sprintf("sandbox %s not found", ref.ID))
	}
	return errdefs.NotFound(fmt.Sprintf("sandbox %q not found", ref.Name))
}

// Get implements compute.Driver.
func (d *Driver) Get(ctx context.Context, ref compute.Ref) (compute.Sandbox, error) {
	if p := d.pendingOf(ref); p != nil {
		return *p, nil
	}
	c, err := d.find(ctx, ref)
	if err != nil {
		return compute.Sandbox{}, err
	}
	if c == nil {
		return compute.Sandbox{}, notFound(ref)
	}
	return d.inspect(ctx, c.ID)
}

// inspect reads one container into a sandbox; NotFound when it is gone.
func (d *Driver) inspect(ctx context.Context, containerID string) (compute.Sandbox, error) {
	info, err := d.cli.ContainerInspect(ctx, containerID)
	if err != nil {
		return compute.Sandbox{}, d.apiError("inspect container "+containerID, err)
	}
	return d.sandboxOf(info), nil
}

// List implements compute.Driver.
func (d *Driver) List(ctx context.Context) ([]compute.Sandbox, error) {
	list, err := d.cli.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", LabelGatewayID+"="+d.gatewayID))})
	if err != nil {
		return nil, d.apiError("list containers", err)
	}
	out := d.pendingList()
	for _, c := range list {
		sb, err := d.inspect(ctx, c.ID)
		if errors.Is(err, errdefs.ErrNotFound) {
			continue // removed meanwhile
		}
		if err != nil {
			return nil, err
		}
		out = append(out, sb)
	}
	return out, nil
}

// Stop implements compute.Driver: the container stops (SIGTERM, then
// SIGKILL after stop_timeout_secs); its writable layer and workspace
// volume stay.
func (d *Driver) Stop(ctx context.Context, ref compute.Ref) error {
	if p := d.pendingOf(ref); p != nil {
		return errdefs.FailedPrecondition(fmt.Sprintf("sandbox %s is still waiting for its image", p.ID))
	}
	c, unlock, err := d.lockAndMarkStopped(ctx, ref, true)
	if err != nil {
		return err
	}
	defer unlock()
	timeout := int(d.cfg.stopTimeout / time.Second)
	if err := d.cli.ContainerStop(ctx, c.ID, container.StopOptions{Timeout: &timeout}); err != nil && !cerrdefs.IsNotModified(err) {
		return d.apiError("stop container", err)
	}
	return nil
}

// lockAndMarkStopped finds ref's container, takes the sandbox's op lock
// and records whether the gateway stopped it. On success the caller must
// call unlock; on error the lock is not held.
func (d *Driver) lockAndMarkStopped(ctx context.Context, ref compute.Ref, stopped bool) (*container.Summary, func(), error) {
	c, err := d.find(ctx, ref)
	if err != nil {
		return nil, nil, err
	}
	if c == nil {
		return nil, nil, notFound(ref)
	}
	id := c.Labels[LabelSandboxID]
	unlock := d.op(id)
	if err := d.setStopped(id, stopped); err != nil {
		unlock()
		return nil, nil, err
	}
	return c, unlock, nil
}

// Start implements compute.Driver: the same container starts again, with
// its workspace volume.
func (d *Driver) Start(ctx context.Context, ref compute.Ref) error {
	if p := d.pendingOf(ref); p != nil {
		if c, _ := readyCondition(*p); c.Reason != "Pulling" {
			return errdefs.FailedPrecondition(fmt.Sprintf("sandbox %s cannot start: %s", p.ID, c.Message))
		}
		return nil // it starts once its image is there
	}
	c, unlock, err := d.lockAndMarkStopped(ctx, ref, false)
	if err != nil {
		return err
	}
	defer unlock()
	info, err := d.cli.ContainerInspect(ctx, c.ID)
	if err != nil {
		return d.apiError("inspect container", err)
	}
	if info.State != nil && (info.State.Running || info.State.Restarting) {
		return nil
	}
	if err := d.cli.ContainerStart(ctx, c.ID, container.StartOptions{}); err != nil && !cerrdefs.IsNotModified(err) {
		return d.apiError("start container", err)
	}
	return nil
}

// Delete implements compute.Driver: the container (force), its workspace
// volume and the driver's marker go.
func (d *Driver) Delete(ctx context.Context, ref compute.Ref) (bool, error) {
	id, deleted := d.dropPending(ref)
	if ref.ID != "" {
		id = ref.ID
	}
	if id == "" {
		c, err := d.find(ctx, ref)
		if err != nil || c == nil {
			return deleted, err
		}
		id = c.Labels[LabelSandboxID]
	}
	// Under the op lock a create of this sandbox (after its pull) has
	// either finished, and its container is found below, or not begun.
	unlock := d.op(id)
	defer unlock()
	c, err := d.find(ctx, compute.Ref{ID: id})
	if err != nil {
		return deleted, err
	}
	if c != nil {
		err := d.cli.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true, RemoveVolumes: true})
		switch {
		case err == nil:
			deleted = true
		case cerrdefs.IsNotFound(err):
		default:
			return deleted, d.apiError("remove container", err)
		}
	}
	err = d.cli.VolumeRemove(ctx, volumeName(id), false)
	switch {
	case err == nil:
		deleted = true
	case cerrdefs.IsNotFound(err):
	default:
		return deleted, d.apiError("remove workspace volume", err)
	}
	if err := d.setStopped(id, false); err != nil {
		return deleted, err
	}
	if err := d.dropDialer(id); err != nil {
		return deleted, err
	}
	if deleted {
		d.logger.Info("sandbox container removed", "sandbox_id", id)
	}
	return deleted, nil
}

// stoppedPath marks a sandbox the gateway stopped (as opposed to one whose
// supervisor exited on its own); Docker keeps no such intent.
func (d *Driver) stoppedPath(id string) string {
	return filepath.Join(d.cfg.stateDir, "docker", "stopped", id)
}

func (d *Driver) setStopped(id string, stopped bool) error {
	p := d.stoppedPath(id)
	if !stopped {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("docker driver: %w", err)
		}
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return fmt.Errorf("docker driver: %w", err)
	}
	if err := atomicfile.Write(p, nil, 0o600); err != nil {
		return fmt.Errorf("docker driver: %w", err)
	}
	return nil
}

func (d *Driver) isStopped(id string) bool {
	_, err := os.Stat(d.stoppedPath(id))
	return err == nil
}

func readyCondition(sb compute.Sandbox) (compute.Condition, bool) {
	for _, c := range sb.Status.Conditions {
		if c.Type == compute.ConditionReady {
			return c, true
		}
	}
	return compute.Condition{}, false
}
