package policy

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// Limits and identities of OpenShell's policy safety rules.
const (
	// MinSandboxID and MaxSandboxID bound a numeric run_as_user or
	// run_as_group: 0 is root and 2^32-1 is the "no id" sentinel of the
	// Linux id APIs.
	MinSandboxID = 1
	MaxSandboxID = 1<<32 - 2
	// SandboxIdentity is the one named identity a policy may ask for: the
	// unprivileged user the sandbox provides.
	SandboxIdentity = "sandbox"
	// MaxFilesystemPaths bounds read_only and read_write together.
	MaxFilesystemPaths = 256
	// MaxPathLength bounds one filesystem path, in bytes.
	MaxPathLength = 4096
)

// Landlock compatibility modes; empty means best_effort.
const (
	LandlockBestEffort      = "best_effort"
	LandlockHardRequirement = "hard_requirement"
)

// unsafePrefix starts the message of every Validate error, as in OpenShell.
const unsafePrefix = "policy contains unsafe content: "

// Validate checks p against OpenShell's safety rules and returns an
// errdefs.InvalidArgument error listing every violation, or nil. A nil
// policy is valid (the sandbox has none).
func Validate(p *sandboxv1.SandboxPolicy) error {
	if v := Violations(p); len(v) > 0 {
		return errdefs.InvalidArgument(unsafePrefix + strings.Join(v, "; "))
	}
	return nil
}

// Violations returns the safety violations of p in OpenShell's order:
// process identity, filesystem paths, then network endpoints by policy key.
// One rule is this gateway's own: a Landlock compatibility other than
// best_effort and hard_requirement is refused (OpenShell reads any other
// value as best_effort, so a misspelt hard_requirement would silently
// weaken the sandbox).
func Violations(p *sandboxv1.SandboxPolicy) []string {
	var v []string
	v = append(v, processViolations(p.GetProcess())...)
	v = append(v, filesystemViolations(p.GetFilesystem())...)
	if c := p.GetLandlock().GetCompatibility(); c != "" && c != LandlockBestEffort && c != LandlockHardRequirement {
		v = append(v, fmt.Sprintf("landlock compatibility must be '%s' or '%s', got '%s'", LandlockBestEffort, LandlockHardRequirement, c))
	}
	v = append(v, networkViolations(p.GetNetworkPolicies())...)
	return v
}

// ValidIdentity reports whether value is an acceptable run_as_user or
// run_as_group: "sandbox" or a decimal id in [MinSandboxID, MaxSandboxID].
func ValidIdentity(value string) bool {
	if value == SandboxIdentity {
		return true
	}
	if value == "" || strings.TrimLeft(value, "0123456789") != "" {
		return false
	}
	id, err := strconv.ParseUint(value, 10, 32)
	return err == nil && id >= MinSandboxID && id <= MaxSandboxID
}

func processViolations(p *sandboxv1.ProcessPolicy) []string {
	var v []string
	for _, f := range []struct{ field, value string }{
		{"run_as_user", p.GetRunAsUser()},
		{"run_as_group", p.GetRunAsGroup()},
	} {
		// An omitted field is left to the runtime; an explicit one must be safe.
		if f.value != "" && !ValidIdentity(f.value) {
			v = append(v, fmt.Sprintf("%s must be 'sandbox' or a numeric UID/GID in range [%d, %d], got '%s'",
				f.field, MinSandboxID, MaxSandboxID, f.value))
		}
	}
	return v
}

func filesystemViolations(fs *sandboxv1.FilesystemPolicy) []string {
	if fs == nil {
		return nil
	}
	var v []string
	if n := len(fs.GetReadOnly()) + len(fs.GetReadWrite()); n > MaxFilesystemPaths {
		v = append(v, fmt.Sprintf("too many filesystem paths (%d > %d)", n, MaxFilesystemPaths))
	}
	for _, p := range slices.Concat(fs.GetReadOnly(), fs.GetReadWrite()) {
		if len(p) > MaxPathLength {
			v = append(v, fmt.Sprintf("path exceeds maximum length (%d > %d): %s", len(p), MaxPathLength, truncateForDisplay(p)))
			continue
		}
		if !strings.HasPrefix(p, "/") {
			v = append(v, "path must be absolute (start with '/'): "+p)
		}
		if slices.Contains(strings.Split(p, "/"), "..") {
			v = append(v, "path contains '..' traversal component: "+p)
		}
	}
	for _, p := range fs.GetReadWrite() {
		if strings.TrimRight(p, "/") == "" {
			v = append(v, "read-write path is overly broad: "+p)
		}
	}
	return v
}

// truncateForDisplay shortens s to at most 80 bytes for an error message,
// cutting on a UTF-8 boundary.
func truncateForDisplay(s string) string {
	if len(s) <= 80 {
		return s
	}
	end := 77
	for end > 0 && !isRuneStart(s[end]) {
		end--
	}
	return s[:end] + "..."
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }

func networkViolations(rules map[string]*sandboxv1.NetworkPolicyRule) []string {
	var v []string
	for _, key := range slices.Sorted(maps.Keys(rules)) {
		rule := rules[key]
		name := rule.GetName()
		if name == "" {
			name = key
		}
		for i, ep := range rule.GetEndpoints() {
			v = append(v, endpointViolations(name, ep)...)
			for _, reason := range l7Problems(ep) {
				v = append(v, fmt.Sprintf("network policy '%s': endpoint %d has invalid L7 configuration: %s", name, i, reason))
			}
		}
	}
	return v
}

func endpointViolations(name string, ep *sandboxv1.NetworkEndpoint) []string {
	var v []string
	add := func(format string, args ...any) {
		v = append(v, fmt.Sprintf("network policy '%s': ", name)+fmt.Sprintf(format, args...))
	}
	host := ep.GetHost()
	tcp := strings.EqualFold(ep.GetProtocol(), "tcp")
	switch {
	case strings.TrimSpace(host) == "" && tcp:
		add("protocol tcp requires a DNS hostname; hostless allowed_ips endpoints are supported only by the forward proxy")
	case strings.TrimSpace(host) == "" && len(ep.GetAllowedIps()) == 0:
		add("endpoint host must not be empty unless allowed_ips constrains a non-TCP proxy endpoint")
	case tcp:
		if _, err := netip.ParseAddr(host); err == nil {
			add("protocol tcp endpoint '%s' must use a DNS hostname, not an IP literal; direct IP connections bypass policy DNS and are blocked", host)
		} else if reason := tcpHostSelectorProblem(host); reason != "" {
			add("protocol tcp endpoint has invalid DNS host selector '%s': %s", host, reason)
		}
	}
	ports := ep.GetPorts()
	if len(ports) == 0 && ep.GetPort() != 0 {
		ports = []uint32{ep.GetPort()}
	}
	if len(ports) == 0 {
		add("endpoint '%s' must declare at least one port", host)
	}
	for _, port := range ports {
		if port < 1 || port > 65535 {
			add("endpoint '%s' has invalid port %d; expected 1..=65535", host, port)
		}
	}
	if strings.HasPrefix(host, "*.") || strings.HasPrefix(host, "**.") {
		if len(strings.Split(host, ".")) <= 2 {
			add("TLD wildcard '%s' is not allowed; use subdomain wildcards like '*.example.com' instead", host)
		}
	}
	if wildcardShapeInvalid(host) {
		add("invalid host wildcard '%s'; middle DNS label wildcards must be the entire label '*' and recursive '**' is only allowed as the entire first label", host)
	}
	if s := ep.GetCredentialSigning(); s != "" {
		if s != "sigv4" && s != "sigv4:body" && s != "sigv4:no_body" {
			add("endpoint '%s' has unrecognized credential_signing value '%s' (expected sigv4, sigv4:body, or sigv4:no_body)", host, s)
		}
		if ep.GetSigningService() == "" {
			add("endpoint '%s' has credential_signing set but signing_service is empty", host)
		}
		if ep.GetRequestBodyCredentialRewrite() {
			add("endpoint '%s' has both credential_signing and request_body_credential_rewrite set; these options are mutually exclusive", host)
		}
	}
	return v
}

// wildcardShapeInvalid implements the host wildcard table of OpenShell's
// architecture/security-policy.md: "*" and "**" alone match every host; a
// "*" may appear inside the first label or as an entire later label; "**"
// only as the entire first label.
func wildcardShapeInvalid(host string) bool {
	if host == "*" || host == "**" {
		return true
	}
	if !strings.Contains(host, "*") {
		return false
	}
	labels := strings.Split(host, ".")
	if strings.Contains(labels[0], "**") && labels[0] != "**" {
		return true
	}
	for _, l := range labels[1:] {
		if strings.Contains(l, "**") || (strings.Contains(l, "*") && l != "*") {
			return true
		}
	}
	return false
}

// tcpHostSelectorProblem explains why host cannot select DNS names for an
// explicit-TCP endpoint, or returns "". Wildcards stand for one letter.
func tcpHostSelectorProblem(host string) string {
	if strings.TrimSpace(host) != host {
		return "leading or trailing whitespace is not allowed"
	}
	if strings.HasSuffix(host, ".") {
		return "omit the trailing DNS root dot"
	}
	name := strings.ReplaceAll(strings.ReplaceAll(host, "**", "x"), "*", "x")
	if len(name) > 253 {
		return "selector cannot represent a valid DNS name: name exceeds 253 bytes"
	}
	for _, l := range strings.Split(name, ".") {
		if l == "" {
			return "selector cannot represent a valid DNS name: empty label"
		}
		if len(l) > 63 {
			return "selector cannot represent a valid DNS name: label exceeds 63 bytes"
		}
		for _, c := range []byte(l) {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Sprintf("selector cannot represent a valid DNS name: invalid character %q", c)
			}
		}
	}
	return ""
}
