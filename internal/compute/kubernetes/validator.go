package kubernetes

import (
	"slices"
	"strings"
)

// NamespaceValidator decides which namespaces may hold this gateway's
// sandboxes. The driver uses it before creating anything and the bootstrap
// authenticator uses it on the namespace of a presented ServiceAccount
// token, so the two cannot drift. The zero value accepts nothing.
type NamespaceValidator struct {
	exact    string
	prefix   string
	allowed  []string
	accepted bool // set by the constructors
}

// ExactNamespace accepts only ns (shared workspace mode).
func ExactNamespace(ns string) NamespaceValidator {
	return NamespaceValidator{exact: ns, accepted: true}
}

// PrefixNamespace accepts every namespace starting with prefix (managed
// workspace mode: "openshell-<gateway_id>-").
func PrefixNamespace(prefix string) NamespaceValidator {
	return NamespaceValidator{prefix: prefix, accepted: true}
}

// AllowlistNamespaces accepts exactly the listed namespaces (operator
// workspace mode).
func AllowlistNamespaces(ns ...string) NamespaceValidator {
	l := slices.Clone(ns)
	slices.Sort(l)
	return NamespaceValidator{allowed: slices.Compact(l), accepted: true}
}

// Accepts reports whether ns is an accepted sandbox namespace.
func (v NamespaceValidator) Accepts(ns string) bool {
	switch {
	case !v.accepted || ns == "":
		return false
	case v.exact != "":
		return ns == v.exact
	case v.prefix != "":
		return strings.HasPrefix(ns, v.prefix) && len(ns) > len(v.prefix)
	default:
		_, ok := slices.BinarySearch(v.allowed, ns)
		return ok
	}
}

// String describes the validator for logs.
func (v NamespaceValidator) String() string {
	switch {
	case !v.accepted:
		return "none"
	case v.exact != "":
		return "exact:" + v.exact
	case v.prefix != "":
		return "prefix:" + v.prefix
	default:
		return "allowlist:" + strings.Join(v.allowed, ",")
	}
}

// ServiceAccountValidator is the closed set of ServiceAccount names whose
// pod-bound tokens may bootstrap a sandbox identity. Matching is exact on the
// bare name; the namespace is checked separately by [NamespaceValidator].
type ServiceAccountValidator struct {
	names []string // sorted, unique
}

// NewServiceAccountValidator returns a validator accepting names (trimmed;
// blank entries dropped; duplicates collapse).
func NewServiceAccountValidator(names ...string) ServiceAccountValidator {
	var l []string
	for _, n := range names {
		if n = strings.TrimSpace(n); n != "" {
			l = append(l, n)
		}
	}
	slices.Sort(l)
	return ServiceAccountValidator{names: slices.Compact(l)}
}

// Accepts reports whether name is an accepted sandbox ServiceAccount.
func (v ServiceAccountValidator) Accepts(name string) bool {
	_, ok := slices.BinarySearch(v.names, name)
	return ok
}

// Names returns the accepted names, sorted.
func (v ServiceAccountValidator) Names() []string { return slices.Clone(v.names) }
