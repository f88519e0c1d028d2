package kubernetes

import (
	"fmt"
	"math"
	"net/url"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/version"
)

// Workspace modes.
const (
	ModeShared   = "shared"
	ModeManaged  = "managed"
	ModeOperator = "operator"
)

// Defaults.
const (
	DefaultNamespace          = "openshell"
	DefaultServiceAccountName = "openshell-sandbox"
	DefaultSATokenTTLSecs     = 3600
)

// Config is the parsed [openshell.drivers.kubernetes] table.
type Config struct {
	Kubeconfig         string
	SandboxNamespace   string
	WorkspaceMode      string
	AllowedNamespaces  []string
	GatewayID          string
	DefaultImage       string
	SupervisorImage    string
	ImagePullPolicy    string
	ServiceAccountName string
	// AdditionalBootstrapServiceAccountNames are accepted for bootstrap
	// only (accounts something other than the driver assigns to pods).
	AdditionalBootstrapServiceAccountNames []string
	// SelectableServiceAccountNames may be requested per sandbox
	// (template.service_account_name) besides ServiceAccountName.
	SelectableServiceAccountNames []string
	RuntimeClassName              string
	ClientTLSSecretName           string
	SATokenTTLSecs                int64
	GatewayEndpoint               string
	// SupervisorEnv is FactoryDeps.SupervisorEnv (the gateway's OTLP
	// settings); not a TOML key.
	SupervisorEnv        map[string]string
	EnableUserNamespaces bool
	WorkspacePVC         *WorkspacePVC
	AllowAdoption        bool
	// SandboxAPIVersion pins the Sandbox API version ("v1beta1" or
	// "v1alpha1"); empty discovers it (v1beta1 when served).
	SandboxAPIVersion string
	// BootstrapAuth enables the IssueSandboxToken ServiceAccount
	// authenticator (default true).
	BootstrapAuth bool
}

// WorkspacePVC asks for a persistent /sandbox volume per sandbox (a
// volumeClaimTemplate of the Sandbox CR).
type WorkspacePVC struct {
	Size         string
	StorageClass string
}

func invalid(format string, a ...any) error {
	return fmt.Errorf("kubernetes driver: "+format+": %w", append(a, errdefs.ErrInvalidArgument)...)
}

func asString(k string, v any) (string, error) {
	s, ok := v.(string)
	if !ok {
		return "", invalid("%s must be a string", k)
	}
	return strings.TrimSpace(s), nil
}

func asBool(k string, v any) (bool, error) {
	b, ok := v.(bool)
	if !ok {
		return false, invalid("%s must be a boolean", k)
	}
	return b, nil
}

func asInt(k string, v any) (int64, error) {
	switch n := v.(type) {
	case int:
		return int64(n), nil
	case int64:
		return n, nil
	case float64:
		if n != math.Trunc(n) {
			return 0, invalid("%s must be an integer", k)
		}
		return int64(n), nil
	}
	return 0, invalid("%s must be an integer", k)
}

func asStrings(k string, v any) ([]string, error) {
	var out []string
	switch l := v.(type) {
	case []string:
		out = slices.Clone(l)
	case []any:
		for _, e := range l {
			s, ok := e.(string)
			if !ok {
				return nil, invalid("%s entries must be strings", k)
			}
			out = append(out, s)
		}
	default:
		return nil, invalid("%s must be a list of strings", k)
	}
	for i := range out {
		out[i] = strings.TrimSpace(out[i])
	}
	return out, nil
}

// ParseConfig parses and validates the driver table. Unknown keys and bad
// values are errdefs.ErrInvalidArgument.
func ParseConfig(cfg map[string]any) (Config, error) {
	c := Config{
		SandboxNamespace:   DefaultNamespace,
		WorkspaceMode:      ModeShared,
		ServiceAccountName: DefaultServiceAccountName,
		SATokenTTLSecs:     DefaultSATokenTTLSecs,
		SupervisorImage:    "openshell-sandbox:" + version.Version,
		BootstrapAuth:      true,
	}
	var err error
	for k, v := range cfg {
		switch k {
		case "kubeconfig":
			c.Kubeconfig, err = asString(k, v)
		case "sandbox_namespace":
			c.SandboxNamespace, err = asString(k, v)
		case "workspace_mode":
			c.WorkspaceMode, err = asString(k, v)
		case "allowed_namespaces":
			c.AllowedNamespaces, err = asStrings(k, v)
		case "gateway_id":
			c.GatewayID, err = asString(k, v)
		case "default_image":
			c.DefaultImage, err = asString(k, v)
		case "supervisor_image":
			c.SupervisorImage, err = asString(k, v)
		case "image_pull_policy":
			c.ImagePullPolicy, err = asString(k, v)
		case "service_account_name":
			c.ServiceAccountName, err = asString(k, v)
		case "additional_bootstrap_service_account_names":
			c.AdditionalBootstrapServiceAccountNames, err = asStrings(k, v)
		case "selectable_service_account_names":
			c.SelectableServiceAccountNames, err = asStrings(k, v)
		case "runtime_class_name":
			c.RuntimeClassName, err = asString(k, v)
		case "client_tls_secret_name":
			c.ClientTLSSecretName, err = asString(k, v)
		case "sa_token_ttl_secs":
			c.SATokenTTLSecs, err = asInt(k, v)
		case "gateway_endpoint":
			c.GatewayEndpoint, err = asString(k, v)
		case "enable_user_namespaces":
			c.EnableUserNamespaces, err = asBool(k, v)
		case "allow_adoption":
			c.AllowAdoption, err = asBool(k, v)
		case "sandbox_api_version":
			c.SandboxAPIVersion, err = asString(k, v)
		case "bootstrap_auth":
			c.BootstrapAuth, err = asBool(k, v)
		case "workspace_pvc":
			c.WorkspacePVC, err = parsePVC(v)
		default:
			err = invalid("unknown config key %q", k)
		}
		if err != nil {
			return c, err
		}
	}
	return c, c.validate()
}

func parsePVC(v any) (*WorkspacePVC, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return nil, invalid("workspace_pvc must be a table with size and storage_class")
	}
	p := &WorkspacePVC{}
	for k, e := range m {
		var err error
		switch k {
		case "size":
			p.Size, err = asString("workspace_pvc.size", e)
		case "storage_class":
			p.StorageClass, err = asString("workspace_pvc.storage_class", e)
		default:
			err = invalid("unknown config key %q in workspace_pvc", k)
		}
		if err != nil {
			return nil, err
		}
	}
	if p.Size == "" {
		return nil, invalid("workspace_pvc.size is required")
	}
	if _, err := resource.ParseQuantity(p.Size); err != nil {
		return nil, invalid("workspace_pvc.size %q is not a quantity", p.Size)
	}
	return p, nil
}

var pullPolicies = []string{"", "Always", "IfNotPresent", "Never"}

func (c *Config) validate() error {
	bad := func(key, val string, errs []string) error {
		return invalid("%s %q is not valid: %s", key, val, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Label(c.SandboxNamespace); len(errs) > 0 {
		return bad("sandbox_namespace", c.SandboxNamespace, errs)
	}
	if !compute.ValidServiceAccountName(c.ServiceAccountName) {
		return invalid("service_account_name '%s' is not a valid Kubernetes ServiceAccount name", c.ServiceAccountName)
	}
	if err := CheckServiceAccountNames("additional_bootstrap_service_account_names", c.AdditionalBootstrapServiceAccountNames); err != nil {
		return err
	}
	if err := CheckServiceAccountNames("selectable_service_account_names", c.SelectableServiceAccountNames); err != nil {
		return err
	}
	if c.RuntimeClassName != "" {
		if errs := validation.IsDNS1123Subdomain(c.RuntimeClassName); len(errs) > 0 {
			return bad("runtime_class_name", c.RuntimeClassName, errs)
		}
	}
	if c.ClientTLSSecretName != "" {
		if errs := validation.IsDNS1123Subdomain(c.ClientTLSSecretName); len(errs) > 0 {
			return bad("client_tls_secret_name", c.ClientTLSSecretName, errs)
		}
	}
	if !slices.Contains(pullPolicies, c.ImagePullPolicy) {
		return invalid("image_pull_policy %q is not one of Always, IfNotPresent, Never", c.ImagePullPolicy)
	}
	if c.SATokenTTLSecs < 600 || c.SATokenTTLSecs > 86400*2 {
		return invalid("sa_token_ttl_secs %d out of range [600, 172800]", c.SATokenTTLSecs)
	}
	if c.SupervisorImage == "" {
		return invalid("supervisor_image must not be empty")
	}
	if err := checkImage("supervisor_image", c.SupervisorImage); err != nil {
		return invalid("%v", err)
	}
	if c.DefaultImage != "" {
		if err := checkImage("default_image", c.DefaultImage); err != nil {
			return invalid("%v", err)
		}
	}
	if !slices.Contains([]string{"", "v1beta1", "v1alpha1"}, c.SandboxAPIVersion) {
		return invalid("sandbox_api_version %q is not one of v1beta1, v1alpha1", c.SandboxAPIVersion)
	}
	if c.GatewayEndpoint == "" {
		return invalid("gateway_endpoint is required (the gateway URL sandbox pods dial)")
	}
	if u, err := url.Parse(c.GatewayEndpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return invalid("gateway_endpoint %q must be an http:// or https:// URL", c.GatewayEndpoint)
	}
	if c.GatewayID != "" {
		if errs := validation.IsDNS1123Label(c.GatewayID); len(errs) > 0 {
			return bad("gateway_id", c.GatewayID, errs)
		}
	}
	switch c.WorkspaceMode {
	case ModeShared:
	case ModeManaged:
		if c.GatewayID == "" {
			return invalid("workspace_mode managed needs gateway_id")
		}
	case ModeOperator:
		if len(c.AllowedNamespaces) == 0 {
			return invalid("workspace_mode operator needs allowed_namespaces")
		}
		for _, ns := range c.AllowedNamespaces {
			if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
				return bad("allowed_namespaces entry", ns, errs)
			}
		}
	default:
		return invalid("workspace_mode %q is not one of shared, managed, operator", c.WorkspaceMode)
	}
	return nil
}

// NamespaceValidator returns the validator of c's workspace mode.
func (c Config) NamespaceValidator() NamespaceValidator {
	switch c.WorkspaceMode {
	case ModeManaged:
		return PrefixNamespace(c.managedPrefix())
	case ModeOperator:
		return AllowlistNamespaces(c.AllowedNamespaces...)
	default:
		return ExactNamespace(c.SandboxNamespace)
	}
}

// ServiceAccountValidator returns the ServiceAccounts accepted for
// bootstrap: the pod default ∪ additional_bootstrap_service_account_names ∪
// selectable_service_account_names. The driver and the bootstrap
// authenticator both use it.
func (c Config) ServiceAccountValidator() ServiceAccountValidator {
	return c.SelectableServiceAccounts().Union(NewServiceAccountValidator(c.AdditionalBootstrapServiceAccountNames...))
}

// SelectableServiceAccounts returns the ServiceAccounts a sandbox may ask
// for: the pod default ∪ selectable_service_account_names.
func (c Config) SelectableServiceAccounts() ServiceAccountValidator {
	return NewServiceAccountValidator(append([]string{c.ServiceAccountName}, c.SelectableServiceAccountNames...)...)
}

func (c Config) managedPrefix() string { return "openshell-" + c.GatewayID + "-" }

// managedBy is the value of the managed-by label.
const managedByValue = "openshell"

// checkImage applies the image reference rules: non-empty, at most 1024
// characters, no whitespace or control characters, no leading '-' or '/'.
func checkImage(what, image string) error {
	switch {
	case image == "":
		return fmt.Errorf("%s is empty", what)
	case len(image) > 1024:
		return fmt.Errorf("%s exceeds 1024 characters", what)
	case strings.HasPrefix(image, "-") || strings.HasPrefix(image, "/"):
		return fmt.Errorf("%s %q must not start with '-' or '/'", what, image)
	}
	for _, r := range image {
		if r <= ' ' || r == 0x7f {
			return fmt.Errorf("%s %q contains whitespace or control characters", what, image)
		}
	}
	return nil
}
