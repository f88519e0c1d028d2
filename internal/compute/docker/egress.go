package docker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"

	"github.com/openshell-go/openshell/internal/supervisor/egress/hostdial"
)

// EgressDir is where a container sees the directory of its host dialer
// socket (EgressDir/dialer.sock): <state_dir>/docker/egress/<sandbox id>,
// mode 0700, owned by the gateway's user (root), bind-mounted read-only.
// Only the supervisor (the container's root) may open it; the agent's
// uid cannot enter the directory.
const EgressDir = "/run/openshell/egress"

const (
	dialerSocketName = "dialer.sock"
	// dialTimeout bounds one upstream dial of the host dialer.
	dialTimeout = 30 * time.Second
)

// egressAvailable reports whether the driver can give containers a host
// dialer, and why not. The socket's peer check expects the supervisor as
// host uid 0: the gateway must run as root (to own the socket as root)
// and the Engine must not remap the container's root (userns-remap,
// rootless).
func egressAvailable(ctx context.Context, d *Driver) error {
	if os.Geteuid() != 0 {
		return errors.New("the gateway does not run as root")
	}
	info, err := d.cli.Info(ctx)
	if err != nil {
		return fmt.Errorf("docker info: %w", err)
	}
	for _, o := range info.SecurityOptions {
		if o == "name=userns" || o == "name=rootless" {
			return fmt.Errorf("the Docker Engine remaps container users (%s)", o)
		}
	}
	return nil
}

func (d *Driver) egressDir(id string) string {
	return filepath.Join(d.cfg.stateDir, "docker", "egress", id)
}

// serveDialer serves sandbox id's host dialer on its socket, replacing a
// stale socket of a previous gateway process. Idempotent.
func (d *Driver) serveDialer(id string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dialers == nil {
		return nil // egress unavailable
	}
	if d.closed {
		return fmt.Errorf("sandbox %s: host dialer: the docker driver is closed", id)
	}
	if _, ok := d.dialers[id]; ok {
		return nil
	}
	dir := d.egressDir(id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("sandbox %s: host dialer directory: %w", id, err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("sandbox %s: host dialer directory: %w", id, err)
	}
	l, err := hostdial.Listen(dir, dialerSocketName, 0, 0, dialTimeout, nil)
	if err != nil {
		return fmt.Errorf("sandbox %s: host dialer socket: %w", id, err)
	}
	d.dialers[id] = l
	return nil
}

// dropDialer stops serving sandbox id's dialer and removes its directory.
func (d *Driver) dropDialer(id string) error {
	d.mu.Lock()
	l := d.dialers[id]
	delete(d.dialers, id)
	d.mu.Unlock()
	if l != nil {
		l.Close()
	}
	if err := os.RemoveAll(d.egressDir(id)); err != nil {
		return fmt.Errorf("sandbox %s: remove host dialer directory: %w", id, err)
	}
	return nil
}

// serveExistingDialers serves the dialer of every container of this
// gateway (a re-attaching driver: their supervisors reconnect to the same
// socket) and removes the dialer directories of sandboxes that have no
// container any more.
func (d *Driver) serveExistingDialers(ctx context.Context) error {
	list, err := d.cli.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(
		filters.Arg("label", LabelGatewayID+"="+d.gatewayID))})
	if err != nil {
		return d.apiError("list containers", err)
	}
	have := map[string]bool{}
	for _, c := range list {
		id := c.Labels[LabelSandboxID]
		if id == "" {
			continue
		}
		have[id] = true
		if err := d.serveDialer(id); err != nil {
			return err
		}
	}
	ents, err := os.ReadDir(filepath.Join(d.cfg.stateDir, "docker", "egress"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("docker driver: %w", err)
	}
	for _, e := range ents {
		if !have[e.Name()] {
			_ = os.RemoveAll(filepath.Join(d.cfg.stateDir, "docker", "egress", e.Name()))
		}
	}
	return nil
}

// closeDialers stops serving every dialer (the sockets go; running
// supervisors reconnect when the next gateway serves them again).
func (d *Driver) closeDialers() {
	d.mu.Lock()
	ls := d.dialers
	if ls != nil {
		d.dialers = map[string]*hostdial.Listener{}
	}
	d.mu.Unlock()
	for _, l := range ls {
		l.Close()
	}
}
