package advisor

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
)

// Finding categories, OpenShell's names. Any finding keeps a proposal
// from being approved without a reviewer.
const (
	LinkLocalReach           = "link_local_reach"
	L7BypassCredentialed     = "l7_bypass_credentialed"
	CredentialReachExpansion = "credential_reach_expansion"
	CapabilityExpansion      = "capability_expansion"
)

// NoNewFindings is the validation result of a proposal the prover has
// nothing to say about (OpenShell's text).
const NoNewFindings = "prover: no new findings"

// metadataHosts are cloud metadata hostnames treated like link-local reach.
var metadataHosts = []string{"metadata.google.internal", "metadata", "metadata.azure.internal", "instance-data", "instance-data.ec2.internal"}

// IsLinkLocalOrMetadata reports whether host is a link-local address
// (169.254.0.0/16, fe80::/10) or a known cloud metadata hostname.
func IsLinkLocalOrMetadata(host string) bool {
	h := strings.TrimSuffix(strings.ToLower(strings.TrimSpace(host)), ".")
	if a, err := netip.ParseAddr(strings.Trim(h, "[]")); err == nil {
		return a.Unmap().IsLinkLocalUnicast()
	}
	return slices.Contains(metadataHosts, h)
}

// bypassBinaries speak wire protocols the L7 proxy cannot inspect
// (OpenShell's prover registry).
var bypassBinaries = []string{"git-remote-https", "git-remote-http", "ssh", "nc", "ncat", "netcat", "socat", "telnet"}

func bypassesL7(binary string) bool {
	base := binary[strings.LastIndex(binary, "/")+1:]
	return slices.Contains(bypassBinaries, base)
}

// credentialInScope reports whether a credential of the sandbox is meant
// for host: one of hosts names it exactly or by a first-label wildcard
// ("*.github.com" covers "api.github.com").
func credentialInScope(hosts []string, host string) bool {
	host = strings.ToLower(host)
	for _, h := range hosts {
		h = strings.ToLower(h)
		if h == host {
			return true
		}
		if rest, ok := strings.CutPrefix(h, "*."); ok {
			if i := strings.IndexByte(host, '.'); i > 0 && host[i+1:] == rest {
				return true
			}
		}
	}
	return false
}

// path is one way a binary reaches an endpoint that the prover reports.
type path struct {
	category, binary, host, method string
	port                           uint32
}

func (p path) String() string {
	ep := fmt.Sprintf("%s:%d", p.host, p.port)
	if p.category == CapabilityExpansion {
		return fmt.Sprintf("%s: %s on %s via %s", p.category, p.method, ep, p.binary)
	}
	return fmt.Sprintf("%s: %s via %s", p.category, ep, p.binary)
}

// paths lists what the prover reports of p given the hosts the sandbox
// holds credentials for.
func paths(p *sandboxv1.SandboxPolicy, credHosts []string) []path {
	var out []path
	for _, rule := range p.GetNetworkPolicies() {
		bins := []string{"*"}
		if len(rule.GetBinaries()) > 0 {
			bins = bins[:0]
			for _, b := range rule.GetBinaries() {
				bins = append(bins, b.GetPath())
			}
		}
		for _, ep := range rule.GetEndpoints() {
			host := strings.ToLower(ep.GetHost())
			ports := ep.GetPorts()
			if len(ports) == 0 {
				ports = []uint32{ep.GetPort()}
			}
			for _, port := range ports {
				for _, bin := range bins {
					switch {
					case IsLinkLocalOrMetadata(host):
						out = append(out, path{category: LinkLocalReach, binary: bin, host: host, port: port})
					case !credentialInScope(credHosts, host):
					case bypassesL7(bin):
						out = append(out, path{category: L7BypassCredentialed, binary: bin, host: host, port: port})
					default:
						out = append(out, path{category: CredentialReachExpansion, binary: bin, host: host, port: port})
						for _, m := range allowedMethods(ep) {
							out = append(out, path{category: CapabilityExpansion, binary: bin, host: host, port: port, method: m})
						}
					}
				}
			}
		}
	}
	return out
}

// allowedMethods is what an endpoint lets a binary do over HTTP: "*" for
// an uninspected endpoint or full access.
func allowedMethods(ep *sandboxv1.NetworkEndpoint) []string {
	if ep.GetProtocol() == "" {
		return []string{"*"}
	}
	var ms []string
	switch ep.GetAccess() {
	case "full":
		ms = append(ms, "*")
	case "read-only":
		ms = append(ms, "GET", "HEAD", "OPTIONS")
	case "read-write":
		ms = append(ms, "GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH")
	}
	for _, r := range ep.GetRules() {
		if m := strings.ToUpper(r.GetAllow().GetMethod()); m != "" {
			ms = append(ms, m)
		}
	}
	slices.Sort(ms)
	return slices.Compact(ms)
}

// ValidationResult runs the prover on the change from current to
// candidate and renders its new findings as OpenShell does: NoNewFindings,
// or "prover: N new finding(s)" followed by one line per path. A
// capability_expansion is not reported for a (binary, host, port) whose
// credentialed reach is itself new.
func ValidationResult(current, candidate *sandboxv1.SandboxPolicy, credHosts []string) string {
	seen := map[path]bool{}
	for _, p := range paths(current, credHosts) {
		seen[p] = true
	}
	newReach := map[[3]string]bool{}
	var fresh []path
	for _, p := range paths(candidate, credHosts) {
		if seen[p] {
			continue
		}
		seen[p] = true
		fresh = append(fresh, p)
		if p.category == CredentialReachExpansion {
			newReach[[3]string{p.binary, p.host, fmt.Sprint(p.port)}] = true
		}
	}
	byCategory := map[string][]string{}
	for _, p := range fresh {
		if p.category == CapabilityExpansion && newReach[[3]string{p.binary, p.host, fmt.Sprint(p.port)}] {
			continue
		}
		byCategory[p.category] = append(byCategory[p.category], p.String())
	}
	if len(byCategory) == 0 {
		return NoNewFindings
	}
	out := fmt.Sprintf("prover: %d new finding", len(byCategory))
	if len(byCategory) > 1 {
		out += "s"
	}
	for _, c := range []string{LinkLocalReach, L7BypassCredentialed, CredentialReachExpansion, CapabilityExpansion} {
		lines := byCategory[c]
		sort.Strings(lines)
		for _, l := range lines {
			out += "\n  " + l
		}
	}
	return out
}

// dbPorts are well-known database and service ports (OpenShell's list).
var dbPorts = []uint32{5432, 3306, 6379, 27017, 9200, 11211, 5672}

// SecurityNotes are OpenShell's advisory notes on a proposed rule:
// internal destinations, wildcard hosts, internal allowed_ips, hostless
// allowed_ips, ephemeral and database ports. Non-empty notes keep a chunk
// from auto-approval and from ApproveAllDraftChunks unless
// include_security_flagged.
func SecurityNotes(rule *sandboxv1.NetworkPolicyRule) string {
	var notes []string
	for _, ep := range rule.GetEndpoints() {
		host := strings.ToLower(ep.GetHost())
		if ep.GetAllowUninspectedCredentials() {
			notes = append(notes, fmt.Sprintf("Endpoint '%s' explicitly allows credentials on traffic OpenShell cannot inspect or rewrite.", host))
		}
		if a, err := netip.ParseAddr(host); err == nil && internal(a) && !alwaysBlocked(a) {
			notes = append(notes, fmt.Sprintf("Destination '%s' appears to be an internal/private address.", host))
		}
		if strings.Contains(host, "*") {
			notes = append(notes, fmt.Sprintf("Host '%s' contains a wildcard — this may match unintended destinations.", host))
		}
		for _, ip := range ep.GetAllowedIps() {
			if allowedIPInternal(ip) {
				notes = append(notes, fmt.Sprintf("allowed_ips includes private/internal range '%s'.", ip))
			}
		}
		if strings.TrimSpace(host) == "" && len(ep.GetAllowedIps()) > 0 {
			notes = append(notes, "allowed_ips allowlist is hostless and may match any hostname resolving within the configured range.")
		}
		ports := ep.GetPorts()
		if len(ports) == 0 {
			ports = []uint32{ep.GetPort()}
		}
		for _, port := range ports {
			if port > 49152 && port <= 65535 {
				notes = append(notes, fmt.Sprintf("Port %d is in the ephemeral range — this may be a temporary service.", port))
			}
			if slices.Contains(dbPorts, port) {
				notes = append(notes, fmt.Sprintf("Port %d is a well-known database/service port.", port))
			}
		}
	}
	return strings.Join(notes, " ")
}

// internalPrefixes are the special-use ranges a proposal reaching them is
// flagged for (RFC 1918, CGNAT, ULA, and the always-blocked ones).
var internalPrefixes = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("172.16.0.0/12"), netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("100.64.0.0/10"), netip.MustParsePrefix("fc00::/7"), netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("192.0.0.0/24"),
}

func internal(a netip.Addr) bool {
	a = a.Unmap()
	if alwaysBlocked(a) {
		return true
	}
	for _, p := range internalPrefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// alwaysBlocked: loopback, link-local and unspecified addresses, which the
// proxy never dials whatever the policy says.
func alwaysBlocked(a netip.Addr) bool {
	a = a.Unmap()
	return a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsUnspecified() || a.IsLinkLocalMulticast()
}

func allowedIPInternal(s string) bool {
	if p, err := netip.ParsePrefix(s); err == nil {
		for _, q := range internalPrefixes {
			if q.Overlaps(p) {
				return !alwaysBlocked(p.Addr())
			}
		}
		return false
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return internal(a) && !alwaysBlocked(a)
	}
	return false
}

func parseAddr(host string) (netip.Addr, error) { return netip.ParseAddr(strings.Trim(host, "[]")) }
