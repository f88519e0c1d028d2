package docker

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/errdefs"
)

const (
	supervisorName = compute.SupervisorName
	defaultSocket  = "/var/run/docker.sock"
)

// Image pull policies (image_pull_policy), as Kubernetes spells them.
const (
	PullIfNotPresent = "IfNotPresent"
	PullAlways       = "Always"
	PullNever        = "Never"
)

type config struct {
	stateDir       string
	host           string // Docker API endpoint: unix:///path or tcp://...
	socketPath     string // the unix socket of host, "" for other schemes
	callbackDir    string // host directory holding the gateway's callback socket
	callbackSock   string // its file name
	supervisorPath string
	defaultImage   string
	pullPolicy     string
	pidsLimit      int64
	stopTimeout    time.Duration
}

// parseConfig decodes [openshell.drivers.docker] (with the inherited
// gateway-wide keys). Unknown keys, and known keys this driver cannot
// honour, are InvalidArgument.
func parseConfig(cfg map[string]any, deps compute.FactoryDeps) (config, error) {
	c := config{
		stateDir:       deps.StateDir,
		supervisorPath: deps.SupervisorPath,
		pullPolicy:     PullIfNotPresent,
		stopTimeout:    10 * time.Second,
	}
	bad := func(format string, a ...any) error {
		return fmt.Errorf("docker driver: "+format+": %w", append(a, errdefs.ErrInvalidArgument)...)
	}
	for k, v := range cfg {
		switch k {
		case "socket_path":
			s, ok := v.(string)
			if !ok {
				return c, bad("socket_path must be a string")
			}
			c.host = s
		case "supervisor_bin":
			s, ok := v.(string)
			if !ok || (s != "" && !filepath.IsAbs(s)) {
				return c, bad("supervisor_bin must be an absolute path")
			}
			if s != "" {
				c.supervisorPath = s
			}
		case "default_image":
			s, ok := v.(string)
			if !ok {
				return c, bad("default_image must be a string")
			}
			c.defaultImage = s
		case "image_pull_policy":
			s, ok := v.(string)
			p, known := pullPolicies[strings.ToLower(s)]
			if !ok || !known {
				return c, bad("image_pull_policy must be %s, %s or %s, got %v", PullIfNotPresent, PullAlways, PullNever, v)
			}
			c.pullPolicy = p
		case "sandbox_pids_limit":
			n, ok := integer(v)
			if !ok || n < 0 {
				return c, bad("sandbox_pids_limit must be a non-negative integer (0: no limit), got %v", v)
			}
			c.pidsLimit = n
		case "stop_timeout_secs":
			n, ok := integer(v)
			if !ok || n < 0 || n > 3600 {
				return c, bad("stop_timeout_secs must be an integer in [0, 3600], got %v", v)
			}
			c.stopTimeout = time.Duration(n) * time.Second
		case "supervisor_image", "guest_tls_ca", "guest_tls_cert", "guest_tls_key", "host_gateway_ip", "grpc_endpoint":
			// Inherited gateway-wide keys (and OpenShell's grpc_endpoint)
			// that have no meaning here: refused when set, never ignored.
			if s, ok := v.(string); ok && s == "" {
				continue
			}
			return c, bad("%s is not supported: the docker driver bind-mounts the gateway's own %s binary and sandboxes reach the gateway through its unix callback socket (containers have no network)", k, supervisorName)
		default:
			if openShellOnly[k] {
				if isZero(v) {
					continue
				}
				return c, bad("%s (an OpenShell docker driver key) is not supported by this docker driver: its containers have no network, no bind mounts but the supervisor's, and no driver_config", k)
			}
			return c, bad("unknown config key %q", k)
		}
	}
	if err := c.resolveHost(); err != nil {
		return c, err
	}
	if err := c.resolveCallback(deps.GatewayEndpoint); err != nil {
		return c, err
	}
	if c.stateDir == "" {
		return c, bad("state directory is required")
	}
	abs, err := filepath.Abs(c.stateDir)
	if err != nil {
		return c, fmt.Errorf("docker driver: state directory: %w", err)
	}
	c.stateDir = abs
	if c.supervisorPath == "" {
		c.supervisorPath = compute.FindSupervisor()
	}
	return c, nil
}

// openShellOnly are keys of OpenShell's docker driver this one does not
// implement; a zero value (false, "", 0) does nothing and is accepted.
var openShellOnly = map[string]bool{
	"sandbox_runtime_image": true, "network_name": true, "ssh_socket_path": true,
	"enable_bind_mounts": true, "allow_driver_config": true, "resource_admission": true,
	"https_proxy": true, "no_proxy": true, "proxy_auth_file": true, "proxy_auth_allow_insecure": true,
	"proxy_connect_by_hostname": true, "proxy_ca_bundle": true,
}

func isZero(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case string:
		return x == ""
	case bool:
		return !x
	}
	n, ok := integer(v)
	return ok && n == 0
}

var pullPolicies = map[string]string{
	"ifnotpresent": PullIfNotPresent,
	"always":       PullAlways,
	"never":        PullNever,
}

func integer(v any) (int64, bool) {
	switch n := v.(type) {
	case int:
		return int64(n), true
	case int64:
		return n, true
	case float64:
		if n == float64(int64(n)) {
			return int64(n), true
		}
	}
	return 0, false
}

// resolveHost picks the Docker API endpoint: socket_path, else DOCKER_HOST,
// else /var/run/docker.sock.
func (c *config) resolveHost() error {
	h := c.host
	if h == "" {
		h = os.Getenv("DOCKER_HOST")
	}
	if h == "" {
		h = defaultSocket
	}
	if filepath.IsAbs(h) {
		h = "unix://" + h
	}
	u, err := url.Parse(h)
	if err != nil || u.Scheme == "" {
		return fmt.Errorf("docker driver: socket_path %q is neither an absolute path nor a unix:// or tcp:// URL: %w", h, errdefs.ErrInvalidArgument)
	}
	switch u.Scheme {
	case "unix":
		c.socketPath = u.Path
	case "tcp", "http", "https":
		// The driver bind-mounts host paths, so the daemon must run on
		// this machine; a TCP endpoint on loopback is accepted as is.
	default:
		return fmt.Errorf("docker driver: unsupported Docker endpoint scheme %q in %q: %w", u.Scheme, h, errdefs.ErrInvalidArgument)
	}
	c.host = h
	return nil
}

// resolveCallback checks the gateway's callback endpoint: sandboxes have
// no network, so it must be a unix socket, whose directory is bind-mounted
// into each container.
func (c *config) resolveCallback(endpoint string) error {
	if endpoint == "" {
		return fmt.Errorf("docker driver: the gateway callback endpoint for sandboxes is required: %w", errdefs.ErrInvalidArgument)
	}
	p, ok := strings.CutPrefix(endpoint, "unix://")
	if !ok || !filepath.IsAbs(p) {
		return fmt.Errorf("docker driver: containers run without a network, so the gateway callback endpoint must be a unix:// socket with an absolute path, got %q: %w", endpoint, errdefs.ErrInvalidArgument)
	}
	c.callbackDir, c.callbackSock = filepath.Split(filepath.Clean(p))
	c.callbackDir = filepath.Clean(c.callbackDir)
	return nil
}

func (c config) checkSupervisor() error {
	if !filepath.IsAbs(c.supervisorPath) {
		return errdefs.FailedPrecondition(fmt.Sprintf("supervisor binary %s not found next to the gateway or on PATH; set supervisor_bin", supervisorName))
	}
	st, err := os.Stat(c.supervisorPath)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return errdefs.FailedPrecondition(fmt.Sprintf("supervisor binary %s does not exist", c.supervisorPath))
	case err != nil:
		return errdefs.FailedPrecondition(fmt.Sprintf("supervisor binary %s: %v", c.supervisorPath, err))
	case !st.Mode().IsRegular():
		return errdefs.FailedPrecondition(fmt.Sprintf("supervisor binary %s is not a regular file", c.supervisorPath))
	}
	return nil
}
