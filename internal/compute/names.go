package compute

import "k8s.io/apimachinery/pkg/util/validation"

// ValidServiceAccountName reports whether name is a name Kubernetes
// accepts for a ServiceAccount: a DNS-1123 subdomain (lowercase
// alphanumerics, '-' and '.', starting and ending alphanumeric) of at most
// 253 characters. Kubernetes applies no 63-character limit to the parts
// between dots. The gateway's request validation and the kubernetes
// driver's configuration both use it, so a name accepted in one is
// accepted in the other.
func ValidServiceAccountName(name string) bool {
	return len(validation.IsDNS1123Subdomain(name)) == 0
}
