//go:build linux

package process

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/errdefs"
)

const supervisorName = compute.SupervisorName

type config struct {
	stateDir       string
	endpoint       string
	supervisorPath string
	cgroupRoot     string // empty: discover the cgroup2 mount
	stopGrace      time.Duration
	// defaultImage is the image of sandboxes that name none: "" (the host
	// filesystem) or a local root filesystem directory.
	defaultImage string
	// supervisorEnv: deps.SupervisorEnv (the gateway's OTLP settings).
	supervisorEnv map[string]string
}

func parseConfig(cfg map[string]any, deps compute.FactoryDeps) (config, error) {
	c := config{
		stateDir:       deps.StateDir,
		endpoint:       deps.GatewayEndpoint,
		supervisorPath: deps.SupervisorPath,
		supervisorEnv:  deps.SupervisorEnv,
		stopGrace:      10 * time.Second,
	}
	for k, v := range cfg {
		switch k {
		case "supervisor_path":
			s, ok := v.(string)
			if !ok {
				return c, fmt.Errorf("process driver: supervisor_path must be a string: %w", errdefs.ErrInvalidArgument)
			}
			c.supervisorPath = s
		case "default_image":
			s, ok := v.(string)
			if !ok {
				return c, fmt.Errorf("process driver: default_image must be a string: %w", errdefs.ErrInvalidArgument)
			}
			c.defaultImage = s
		case "cgroup_root":
			s, ok := v.(string)
			if !ok || (s != "" && !filepath.IsAbs(s)) {
				return c, fmt.Errorf("process driver: cgroup_root must be an absolute path: %w", errdefs.ErrInvalidArgument)
			}
			c.cgroupRoot = s
		case "stop_grace_secs":
			var secs float64
			switch n := v.(type) {
			case int:
				secs = float64(n)
			case int64:
				secs = float64(n)
			case float64:
				secs = n
			default:
				return c, fmt.Errorf("process driver: stop_grace_secs must be a number: %w", errdefs.ErrInvalidArgument)
			}
			if secs < 0 || secs > 3600 {
				return c, fmt.Errorf("process driver: stop_grace_secs %v out of range [0, 3600]: %w", secs, errdefs.ErrInvalidArgument)
			}
			c.stopGrace = time.Duration(secs * float64(time.Second))
		default:
			return c, fmt.Errorf("process driver: unknown config key %q: %w", k, errdefs.ErrInvalidArgument)
		}
	}
	if c.endpoint == "" {
		return c, fmt.Errorf("process driver: the gateway callback endpoint for sandboxes is required: %w", errdefs.ErrInvalidArgument)
	}
	if !strings.HasPrefix(c.endpoint, "unix://") {
		// Sandboxes have a network namespace with loopback only; a unix
		// socket is the one way to the gateway that reaches into it.
		return c, fmt.Errorf("process driver: sandboxes have no network but their own loopback, so the gateway callback endpoint must be a unix:// socket, got %q: %w", c.endpoint, errdefs.ErrInvalidArgument)
	}
	if c.stateDir == "" {
		return c, fmt.Errorf("process driver: state directory is required: %w", errdefs.ErrInvalidArgument)
	}
	abs, err := filepath.Abs(c.stateDir)
	if err != nil {
		return c, fmt.Errorf("process driver: state directory: %w", err)
	}
	c.stateDir = abs
	if c.supervisorPath == "" {
		c.supervisorPath = compute.FindSupervisor()
	}
	return c, nil
}

func (c config) checkSupervisor() error {
	if !filepath.IsAbs(c.supervisorPath) {
		return errdefs.FailedPrecondition(fmt.Sprintf("supervisor binary %s not found next to the gateway or on PATH; set supervisor_path", supervisorName))
	}
	st, err := os.Stat(c.supervisorPath)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return errdefs.FailedPrecondition(fmt.Sprintf("supervisor binary %s does not exist", c.supervisorPath))
		}
		return errdefs.FailedPrecondition(fmt.Sprintf("supervisor binary %s: %v", c.supervisorPath, err))
	}
	if !st.Mode().IsRegular() {
		return errdefs.FailedPrecondition(fmt.Sprintf("supervisor binary %s is not a regular file", c.supervisorPath))
	}
	return nil
}

var (
	idRE  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	dnsRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)
)

const registryImageMsg = "process driver cannot pull images; use a local rootfs directory or another driver"

// rootfsOf returns the local root filesystem directory an image names, ""
// for the host filesystem, or an error for anything else.
func rootfsOf(image string) (string, error) {
	switch {
	case image == "":
		return "", nil
	case strings.HasPrefix(image, "dir:"):
		image = strings.TrimPrefix(image, "dir:")
		if !filepath.IsAbs(image) {
			return "", errdefs.InvalidArgument(fmt.Sprintf("rootfs directory %q must be an absolute path", image))
		}
	case filepath.IsAbs(image):
	default:
		return "", errdefs.InvalidArgument(registryImageMsg)
	}
	dir := filepath.Clean(image)
	st, err := os.Stat(dir)
	if err != nil || !st.IsDir() {
		return "", errdefs.FailedPrecondition(fmt.Sprintf("rootfs directory %q does not exist or is not a directory", dir))
	}
	return dir, nil
}

func validEnv(what string, env map[string]string) error {
	for k, v := range env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return errdefs.InvalidArgument(fmt.Sprintf("%s variable %q is not a valid environment entry", what, k))
		}
	}
	return nil
}
