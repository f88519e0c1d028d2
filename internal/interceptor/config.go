package interceptor

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/pelletier/go-toml/v2"
)

// Defaults and bounds of the per-interceptor settings.
const (
	DefaultTimeout          = 500 * time.Millisecond
	DefaultMaxResponseBytes = 1 << 20
	DefaultMaxPatches       = 32
	minTimeout              = 10 * time.Millisecond
	maxTimeout              = 30 * time.Second
)

// FailurePolicy says what a failed evaluation does to the call.
type FailurePolicy string

// The failure policies.
const (
	FailClosed FailurePolicy = "fail_closed"
	FailOpen   FailurePolicy = "fail_open"
)

// BindingPolicy says how the operator's bindings limit the manifest's.
type BindingPolicy string

// The binding policies.
const (
	// Dynamic accepts every valid manifest binding.
	Dynamic BindingPolicy = "dynamic"
	// Allowlist accepts manifest bindings only for configured RPC/phase pairs.
	Allowlist BindingPolicy = "allowlist"
	// Exact requires the manifest's RPC/phase pairs to equal the configured ones.
	Exact BindingPolicy = "exact"
)

// Config is one [[openshell.gateway.interceptors]] entry.
type Config struct {
	Name                   string
	Endpoint               string
	Audience               string
	Order                  int64
	FailurePolicy          FailurePolicy // "" = the manifest's, else fail_closed
	BindingPolicy          BindingPolicy
	Timeout                time.Duration
	MaxResponseBytes       int
	MaxPatches             int
	TLSCACertPath          string
	AllowInsecureTransport bool
	Bindings               []BindingConfig
}

// BindingConfig is one operator binding: an RPC, its phases and an optional
// failure policy that overrides the manifest's for that RPC.
type BindingConfig struct {
	RPC           string
	Phases        []Phase
	FailurePolicy FailurePolicy
}

type fileInterceptor struct {
	Name                   string        `toml:"name"`
	GRPCEndpoint           string        `toml:"grpc_endpoint"`
	Audience               string        `toml:"audience"`
	Order                  int64         `toml:"order"`
	FailurePolicy          string        `toml:"failure_policy"`
	BindingPolicy          string        `toml:"binding_policy"`
	Timeout                string        `toml:"timeout"`
	MaxResponseBytes       *int64        `toml:"max_response_bytes"`
	MaxPatches             *int64        `toml:"max_patches"`
	TLSCACertPath          string        `toml:"tls_ca_cert_path"`
	AllowInsecureTransport bool          `toml:"allow_insecure_transport"`
	Bindings               []fileBinding `toml:"bindings"`
}

type fileBinding struct {
	RPC           string   `toml:"rpc"`
	Phases        []string `toml:"phases"`
	FailurePolicy string   `toml:"failure_policy"`
}

var nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9._-]{0,62})$`)

// ParseConfigs decodes and checks the raw [[openshell.gateway.interceptors]]
// tables. Unknown keys are errors.
func ParseConfigs(raw []map[string]any) ([]Config, error) {
	var out []Config
	seen := map[string]bool{}
	for i, m := range raw {
		b, err := toml.Marshal(m)
		if err != nil {
			return nil, fmt.Errorf("interceptors[%d]: %w", i, err)
		}
		var f fileInterceptor
		dec := toml.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&f); err != nil {
			var sm *toml.StrictMissingError
			if errors.As(err, &sm) {
				return nil, fmt.Errorf("interceptors[%d]: unknown key: %s", i, strings.TrimSpace(sm.String()))
			}
			return nil, fmt.Errorf("interceptors[%d]: %w", i, err)
		}
		c, err := f.check()
		if err != nil {
			if f.Name != "" {
				return nil, fmt.Errorf("interceptor %q: %w", f.Name, err)
			}
			return nil, fmt.Errorf("interceptors[%d]: %w", i, err)
		}
		if seen[c.Name] {
			return nil, fmt.Errorf("interceptor %q: configured twice", c.Name)
		}
		seen[c.Name] = true
		out = append(out, c)
	}
	return out, nil
}

func (f fileInterceptor) check() (Config, error) {
	c := Config{
		Name: f.Name, Endpoint: f.GRPCEndpoint, Audience: f.Audience, Order: f.Order,
		TLSCACertPath: f.TLSCACertPath, AllowInsecureTransport: f.AllowInsecureTransport,
		Timeout: DefaultTimeout, MaxResponseBytes: DefaultMaxResponseBytes, MaxPatches: DefaultMaxPatches,
	}
	if !nameRE.MatchString(c.Name) {
		return c, fmt.Errorf("name %q: want 1-63 lowercase letters, digits, '.', '_' or '-'", c.Name)
	}
	if c.Audience == "" {
		c.Audience = "urn:openshell:extension:interceptor:" + c.Name
	}
	if err := checkEndpoint(c.Endpoint, c.AllowInsecureTransport, c.TLSCACertPath); err != nil {
		return c, err
	}
	var err error
	if c.FailurePolicy, err = parseFailurePolicy(f.FailurePolicy); err != nil {
		return c, err
	}
	switch BindingPolicy(f.BindingPolicy) {
	case "", Dynamic:
		c.BindingPolicy = Dynamic
	case Allowlist, Exact:
		c.BindingPolicy = BindingPolicy(f.BindingPolicy)
	default:
		return c, fmt.Errorf("binding_policy %q: want dynamic, allowlist or exact", f.BindingPolicy)
	}
	if f.Timeout != "" {
		if c.Timeout, err = parseTimeout(f.Timeout); err != nil {
			return c, err
		}
	}
	if f.MaxResponseBytes != nil {
		if *f.MaxResponseBytes <= 0 || *f.MaxResponseBytes > 64<<20 {
			return c, fmt.Errorf("max_response_bytes %d: want 1-%d", *f.MaxResponseBytes, 64<<20)
		}
		c.MaxResponseBytes = int(*f.MaxResponseBytes)
	}
	if f.MaxPatches != nil {
		if *f.MaxPatches <= 0 || *f.MaxPatches > 1024 {
			return c, fmt.Errorf("max_patches %d: want 1-1024", *f.MaxPatches)
		}
		c.MaxPatches = int(*f.MaxPatches)
	}
	if c.BindingPolicy == Dynamic && len(f.Bindings) > 0 {
		return c, errors.New("bindings are used only with binding_policy allowlist or exact")
	}
	if c.BindingPolicy != Dynamic && len(f.Bindings) == 0 {
		return c, fmt.Errorf("binding_policy %s needs at least one [[bindings]] entry", c.BindingPolicy)
	}
	rpcs := map[string]bool{}
	for _, b := range f.Bindings {
		bc := BindingConfig{RPC: b.RPC}
		if _, err := resolveRPC(b.RPC); err != nil {
			return c, fmt.Errorf("bindings: %w", err)
		}
		if rpcs[b.RPC] {
			return c, fmt.Errorf("bindings: rpc %q configured twice", b.RPC)
		}
		rpcs[b.RPC] = true
		if len(b.Phases) == 0 {
			return c, fmt.Errorf("bindings: rpc %q: phases is empty", b.RPC)
		}
		for _, p := range b.Phases {
			ph, ok := phaseByName[p]
			if !ok {
				return c, fmt.Errorf("bindings: rpc %q: phase %q: want modify_operation, validate or post_commit", b.RPC, p)
			}
			bc.Phases = append(bc.Phases, ph)
		}
		if bc.FailurePolicy, err = parseFailurePolicy(b.FailurePolicy); err != nil {
			return c, fmt.Errorf("bindings: rpc %q: %w", b.RPC, err)
		}
		c.Bindings = append(c.Bindings, bc)
	}
	return c, nil
}

func checkEndpoint(ep string, insecure bool, caPath string) error {
	switch {
	case strings.HasPrefix(ep, "unix://"):
		if !strings.HasPrefix(ep, "unix:///") {
			return fmt.Errorf("grpc_endpoint %q: want unix:///absolute/path", ep)
		}
	case strings.HasPrefix(ep, "https://"):
	case strings.HasPrefix(ep, "http://"):
		if !insecure {
			return fmt.Errorf("grpc_endpoint %q is plaintext: use https:// or unix://, or set allow_insecure_transport = true", ep)
		}
	default:
		return fmt.Errorf("grpc_endpoint %q: want https://, http:// or unix://", ep)
	}
	if caPath != "" && !strings.HasPrefix(ep, "https://") {
		return errors.New("tls_ca_cert_path is used only with an https:// grpc_endpoint")
	}
	return nil
}

func parseFailurePolicy(s string) (FailurePolicy, error) {
	switch FailurePolicy(s) {
	case "", FailClosed, FailOpen:
		return FailurePolicy(s), nil
	}
	return "", fmt.Errorf("failure_policy %q: want fail_closed or fail_open", s)
}

// parseTimeout reads the compact duration form: an integer and ms or s.
func parseTimeout(s string) (time.Duration, error) {
	unit, num := time.Duration(0), ""
	switch {
	case strings.HasSuffix(s, "ms"):
		unit, num = time.Millisecond, strings.TrimSuffix(s, "ms")
	case strings.HasSuffix(s, "s"):
		unit, num = time.Second, strings.TrimSuffix(s, "s")
	default:
		return 0, fmt.Errorf("timeout %q: want an integer followed by ms or s", s)
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("timeout %q: want an integer followed by ms or s", s)
	}
	d := time.Duration(n) * unit
	if d < minTimeout || d > maxTimeout {
		return 0, fmt.Errorf("timeout %q: want 10ms-30s", s)
	}
	return d, nil
}
