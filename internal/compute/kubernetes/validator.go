package kubernetes

import (
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/openshell-go/openshell/internal/compute"
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

// ServiceAccountValidator is a closed set of ServiceAccounts. Entries are
// bare names, which match in every namespace (the namespace is checked
// separately by [NamespaceValidator]), or "namespace:name", which match only
// in that namespace. Matching is exact. The zero value accepts nothing.
type ServiceAccountValidator struct {
	entries []string // sorted, unique; bare or ns:name
}

// NewServiceAccountValidator returns a validator accepting entries
// (trimmed; blank entries dropped; duplicates collapse). It does not
// validate them: see [CheckServiceAccountNames].
func NewServiceAccountValidator(entries ...string) ServiceAccountValidator {
	var l []string
	for _, n := range entries {
		if n = strings.TrimSpace(n); n != "" {
			l = append(l, n)
		}
	}
	slices.Sort(l)
	return ServiceAccountValidator{entries: slices.Compact(l)}
}

// Union returns a validator accepting what v or o accepts.
func (v ServiceAccountValidator) Union(o ServiceAccountValidator) ServiceAccountValidator {
	return NewServiceAccountValidator(append(slices.Clone(v.entries), o.entries...)...)
}

// Accepts reports whether the bare entry name is in the set.
func (v ServiceAccountValidator) Accepts(name string) bool {
	_, ok := slices.BinarySearch(v.entries, name)
	return ok && !strings.Contains(name, ":")
}

// AcceptsIn reports whether ServiceAccount namespace/name is in the set,
// through a bare entry or a namespace-qualified one.
func (v ServiceAccountValidator) AcceptsIn(namespace, name string) bool {
	if name == "" || strings.Contains(name, ":") {
		return false
	}
	if v.Accepts(name) {
		return true
	}
	_, ok := slices.BinarySearch(v.entries, namespace+":"+name)
	return ok && namespace != ""
}

// Names returns the entries, sorted.
func (v ServiceAccountValidator) Names() []string { return slices.Clone(v.entries) }

// CheckServiceAccountNames validates the entries of config key: each, once
// trimmed, must be a ServiceAccount name (DNS-1123 subdomain) or
// "namespace:name" with a DNS-1123 label namespace
// ([compute.ValidServiceAccountName], as for requests). Blank entries are
// allowed (they are dropped).
func CheckServiceAccountNames(key string, entries []string) error {
	for _, e := range entries {
		t := strings.TrimSpace(e)
		if t == "" {
			continue
		}
		ns, name, qualified := strings.Cut(t, ":")
		if !qualified {
			ns, name = "", t
		}
		if !compute.ValidServiceAccountName(name) || (qualified && len(validation.IsDNS1123Label(ns)) > 0) {
			return invalid("%s entry '%s' is not a valid Kubernetes ServiceAccount name", key, e)
		}
	}
	return nil
}
