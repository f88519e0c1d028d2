package lifecycle

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"

	"google.golang.org/protobuf/proto"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/compute"
	"github.com/openshell-go/openshell/internal/errdefs"
	"github.com/openshell-go/openshell/internal/policy"
)

// Request limits, as OpenShell applies them.
const (
	MaxSandboxNameLen      = 19 // routable as a DNS label inside service hostnames
	MaxProviders           = 32
	MaxEnvironmentEntries  = 128
	MaxMapKeyLen           = 256
	MaxMapValueLen         = 8 << 10
	MaxPolicySize          = 256 << 10
	MaxTemplateStructSize  = 64 << 10
	MaxTemplateStringLen   = 1024
	MaxTemplateMapEntries  = 128
	MaxAnnotationEntries   = 128
	MaxLabelEntries        = 64
	MaxLogLevelLen         = 32
	MaxMainProcessArgs     = 256
	MaxMainProcessArgvSize = 256 << 10
	MaxArgLen              = 32 << 10
)

var envKeyRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func invalid(format string, args ...any) error {
	return errdefs.InvalidArgument(fmt.Sprintf(format, args...))
}

// ValidateSandboxName checks a DNS-1123 label of at most 19 characters.
// Empty is allowed: the gateway then generates a name.
func ValidateSandboxName(name string) error {
	if name == "" {
		return nil
	}
	if len(name) > MaxSandboxNameLen {
		return invalid("name exceeds maximum length (%d > %d)", len(name), MaxSandboxNameLen)
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return invalid("name must contain only lowercase alphanumeric characters or hyphens")
		}
	}
	if strings.HasPrefix(name, "-") || strings.HasSuffix(name, "-") {
		return invalid("name must not start or end with a hyphen")
	}
	if strings.Contains(name, "--") {
		return invalid("name must not contain consecutive hyphens")
	}
	return nil
}

// ValidateCreateRequest checks sizes and shapes of a CreateSandboxRequest in
// OpenShell's order. It does not touch the store or the driver.
func ValidateCreateRequest(req *openshellv1.CreateSandboxRequest) error {
	if err := ValidateSandboxName(req.GetName()); err != nil {
		return err
	}
	spec := req.GetSpec()
	if n := len(spec.GetProviders()); n > MaxProviders {
		return invalid("providers list exceeds maximum (%d > %d)", n, MaxProviders)
	}
	if n := len(spec.GetLogLevel()); n > MaxLogLevelLen {
		return invalid("log_level exceeds maximum length (%d > %d)", n, MaxLogLevelLen)
	}
	if err := ValidateLogLevel(spec.GetLogLevel()); err != nil {
		return err
	}
	if err := validateStringMap(spec.GetEnvironment(), MaxEnvironmentEntries, "spec.environment"); err != nil {
		return err
	}
	if err := validateEnvKeys(spec.GetEnvironment(), "spec.environment"); err != nil {
		return err
	}
	if t := spec.GetTemplate(); t != nil {
		if err := validateTemplate(t); err != nil {
			return err
		}
	}
	if g := spec.GetResourceRequirements().GetGpu(); g != nil && g.Count != nil && *g.Count == 0 {
		return invalid("gpu count must be greater than 0")
	}
	if len(spec.GetCommand()) > 0 {
		if err := validateCommand(spec.GetCommand()); err != nil {
			return err
		}
	}
	if p := spec.GetPolicy(); p != nil {
		if size := proto.Size(p); size > MaxPolicySize {
			return invalid("policy serialized size exceeds maximum (%d > %d)", size, MaxPolicySize)
		}
		if err := policy.Validate(p); err != nil {
			return err
		}
	}
	if err := ValidateLabels(req.GetLabels(), "labels"); err != nil {
		return err
	}
	return ValidateAnnotations(req.GetAnnotations(), "annotations")
}

// LogLevels are the values spec.log_level accepts, as OpenShell's
// supervisor does; empty leaves the supervisor's default.
var LogLevels = []string{"trace", "debug", "info", "warn", "error"}

// ValidateLogLevel checks spec.log_level: empty or one of LogLevels
// (any case).
func ValidateLogLevel(level string) error {
	if level == "" || slices.Contains(LogLevels, strings.ToLower(level)) {
		return nil
	}
	return invalid("spec.log_level %q is not valid: want one of %s, or empty for the default", level, strings.Join(LogLevels, ", "))
}

func validateTemplate(t *openshellv1.SandboxTemplate) error {
	for _, f := range []struct{ field, value string }{
		{"spec.template.image", t.GetImage()},
		{"spec.template.runtime_class_name", t.GetRuntimeClassName()},
		{"spec.template.agent_socket", t.GetAgentSocket()},
		{"template.service_account_name", t.GetServiceAccountName()},
	} {
		if len(f.value) > MaxTemplateStringLen {
			return invalid("%s exceeds maximum length (%d > %d)", f.field, len(f.value), MaxTemplateStringLen)
		}
	}
	if sa := t.GetServiceAccountName(); sa != "" && !compute.ValidServiceAccountName(strings.TrimSpace(sa)) {
		return invalid("template.service_account_name must be a valid Kubernetes ServiceAccount name (DNS-1123 subdomain, at most 253 characters)")
	}
	for _, m := range []struct {
		field string
		m     map[string]string
	}{
		{"spec.template.labels", t.GetLabels()},
		{"spec.template.annotations", t.GetAnnotations()},
		{"spec.template.environment", t.GetEnvironment()},
	} {
		if err := validateStringMap(m.m, MaxTemplateMapEntries, m.field); err != nil {
			return err
		}
	}
	if err := validateEnvKeys(t.GetEnvironment(), "spec.template.environment"); err != nil {
		return err
	}
	if s := t.GetResources(); s != nil {
		if size := proto.Size(s); size > MaxTemplateStructSize {
			return invalid("template.resources serialized size exceeds maximum (%d > %d)", size, MaxTemplateStructSize)
		}
	}
	if s := t.GetDriverConfig(); s != nil {
		if size := proto.Size(s); size > MaxTemplateStructSize {
			return invalid("template.driver_config serialized size exceeds maximum (%d > %d)", size, MaxTemplateStructSize)
		}
	}
	return nil
}

func validateCommand(cmd []string) error {
	if len(cmd) > MaxMainProcessArgs {
		return invalid("spec.command exceeds %d argument limit", MaxMainProcessArgs)
	}
	if cmd[0] == "" {
		return invalid("spec.command[0] must not be empty")
	}
	total := 0
	for i, a := range cmd {
		total += len(a)
		if len(a) > MaxArgLen {
			return invalid("spec.command[%d] exceeds %d byte limit", i, MaxArgLen)
		}
		if strings.IndexByte(a, 0) >= 0 {
			return invalid("spec.command[%d] contains null bytes", i)
		}
	}
	if total > MaxMainProcessArgvSize {
		return invalid("spec.command total size exceeds %d byte limit", MaxMainProcessArgvSize)
	}
	return nil
}

func validateStringMap(m map[string]string, maxEntries int, field string) error {
	if len(m) > maxEntries {
		return invalid("%s exceeds maximum entries (%d > %d)", field, len(m), maxEntries)
	}
	for _, k := range sortedKeys(m) {
		if len(k) > MaxMapKeyLen {
			return invalid("%s key exceeds maximum length (%d > %d)", field, len(k), MaxMapKeyLen)
		}
		if len(m[k]) > MaxMapValueLen {
			return invalid("%s value exceeds maximum length (%d > %d)", field, len(m[k]), MaxMapValueLen)
		}
	}
	return nil
}

func validateEnvKeys(m map[string]string, field string) error {
	for _, k := range sortedKeys(m) {
		if !envKeyRE.MatchString(k) {
			return invalid("%s key %q must match ^[A-Za-z_][A-Za-z0-9_]*$", field, k)
		}
		if strings.ContainsAny(m[k], "\x00") {
			return invalid("%s value for %q contains null bytes", field, k)
		}
	}
	return nil
}

// ValidateLabels applies Kubernetes label rules to object labels.
func ValidateLabels(labels map[string]string, field string) error {
	if len(labels) > MaxLabelEntries {
		return invalid("%s exceeds maximum entries (%d > %d)", field, len(labels), MaxLabelEntries)
	}
	for _, k := range sortedKeys(labels) {
		if err := ValidateLabelKey(k); err != nil {
			return err
		}
		if err := ValidateLabelValue(k, labels[k]); err != nil {
			return err
		}
	}
	return nil
}

// ValidateAnnotations checks annotation keys as label keys and sizes.
func ValidateAnnotations(ann map[string]string, field string) error {
	if err := validateStringMap(ann, MaxAnnotationEntries, field); err != nil {
		return err
	}
	for _, k := range sortedKeys(ann) {
		if err := ValidateLabelKey(k); err != nil {
			return err
		}
	}
	return nil
}

var labelNameRE = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)

// ValidateLabelKey checks `[prefix/]name`: prefix a DNS-1123 subdomain
// (≤ 253), name ≤ 63 characters of [A-Za-z0-9-_.], alphanumeric at both ends.
func ValidateLabelKey(key string) error {
	if key == "" {
		return invalid("label key must not be empty")
	}
	if len(key) > 253+1+63 {
		return invalid("label key %q is too long", key)
	}
	prefix, name, hasPrefix := strings.Cut(key, "/")
	if !hasPrefix {
		name = prefix
	} else if prefix == "" || len(prefix) > 253 || !isDNS1123Subdomain(prefix) {
		return invalid("label key %q has an invalid prefix (must be a DNS subdomain of at most 253 characters)", key)
	}
	if name == "" || len(name) > 63 {
		return invalid("label key %q: name must be 1-63 characters", key)
	}
	if !labelNameRE.MatchString(name) {
		return invalid("label key %q: name must consist of alphanumeric characters, '-', '_' or '.', and start and end with an alphanumeric character", key)
	}
	return nil
}

// ValidateLabelValue checks a label value: ≤ 63 characters of
// [A-Za-z0-9-_.], alphanumeric at both ends, or empty.
func ValidateLabelValue(key, value string) error {
	if value == "" {
		return nil
	}
	if len(value) > 63 {
		return invalid("label %q value exceeds 63 characters", key)
	}
	if !labelNameRE.MatchString(value) {
		return invalid("label %q value must consist of alphanumeric characters, '-', '_' or '.', and start and end with an alphanumeric character", key)
	}
	return nil
}

var dns1123LabelRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

func isDNS1123Subdomain(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, part := range strings.Split(s, ".") {
		if len(part) > 63 || !dns1123LabelRE.MatchString(part) {
			return false
		}
	}
	return true
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
