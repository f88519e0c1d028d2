package store

import (
	"fmt"
	"strings"

	"github.com/openshell-go/openshell/internal/errdefs"
)

// Label limits, as in Kubernetes.
const (
	MaxLabelKeyLength    = 253 // whole key, prefix included
	MaxLabelPrefixLength = 253 // DNS subdomain before '/'
	MaxLabelNameLength   = 63  // segment after '/'
	MaxLabelValueLength  = 63
	MaxSelectorPairs     = 64
)

// ParseLabelSelector parses "k=v,k2=v2" (equality only; every pair must
// match) into a map. Whitespace around keys and values is ignored; an empty
// selector is an empty map. A malformed, invalid or repeated pair is an
// errdefs.ErrInvalidArgument error naming it.
func ParseLabelSelector(sel string) (map[string]string, error) {
	out := map[string]string{}
	if strings.TrimSpace(sel) == "" {
		return out, nil
	}
	pairs := strings.Split(sel, ",")
	if len(pairs) > MaxSelectorPairs {
		return nil, errdefs.InvalidArgument(fmt.Sprintf("label selector has %d pairs, at most %d allowed", len(pairs), MaxSelectorPairs))
	}
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || k == "" || strings.HasPrefix(v, "=") || strings.HasSuffix(k, "!") {
			return nil, errdefs.InvalidArgument(fmt.Sprintf("invalid label selector pair %q: want key=value", strings.TrimSpace(p)))
		}
		if err := ValidateLabelKey(k); err != nil {
			return nil, errdefs.InvalidArgument(fmt.Sprintf("invalid label selector pair %q: %s", strings.TrimSpace(p), err.Error()))
		}
		if err := ValidateLabelValue(v); err != nil {
			return nil, errdefs.InvalidArgument(fmt.Sprintf("invalid label selector pair %q: %s", strings.TrimSpace(p), err.Error()))
		}
		if old, dup := out[k]; dup && old != v {
			return nil, errdefs.InvalidArgument(fmt.Sprintf("invalid label selector pair %q: key %q already selected", strings.TrimSpace(p), k))
		}
		out[k] = v
	}
	return out, nil
}

// ValidateLabels checks every key and value of labels.
func ValidateLabels(labels map[string]string) error {
	for k, v := range labels {
		if err := ValidateLabelKey(k); err != nil {
			return err
		}
		if err := ValidateLabelValue(v); err != nil {
			return errdefs.InvalidArgument(fmt.Sprintf("label %q: %s", k, err.Error()))
		}
	}
	return nil
}

// ValidateLabelKey checks a Kubernetes label key: an optional DNS subdomain
// prefix and '/', then a name of at most 63 characters of [A-Za-z0-9-_.]
// beginning and ending with an alphanumeric. Errors wrap
// errdefs.ErrInvalidArgument.
func ValidateLabelKey(k string) error {
	if len(k) > MaxLabelKeyLength {
		return errdefs.InvalidArgument(fmt.Sprintf("label key %.20q... is longer than %d characters", k, MaxLabelKeyLength))
	}
	name := k
	if prefix, rest, ok := strings.Cut(k, "/"); ok {
		if err := validateDNSSubdomain(prefix); err != nil {
			return errdefs.InvalidArgument(fmt.Sprintf("label key %q: prefix %s", k, err))
		}
		name = rest
	}
	if name == "" {
		return errdefs.InvalidArgument(fmt.Sprintf("label key %q: name is empty", k))
	}
	if len(name) > MaxLabelNameLength {
		return errdefs.InvalidArgument(fmt.Sprintf("label key %q: name is longer than %d characters", k, MaxLabelNameLength))
	}
	if !isQualifiedName(name) {
		return errdefs.InvalidArgument(fmt.Sprintf("label key %q: name must consist of alphanumerics, '-', '_' or '.', and begin and end with an alphanumeric", k))
	}
	return nil
}

// ValidateLabelValue checks a Kubernetes label value: empty, or at most 63
// characters of [A-Za-z0-9-_.] beginning and ending with an alphanumeric.
func ValidateLabelValue(v string) error {
	if v == "" {
		return nil
	}
	if len(v) > MaxLabelValueLength {
		return errdefs.InvalidArgument(fmt.Sprintf("label value is longer than %d characters", MaxLabelValueLength))
	}
	if !isQualifiedName(v) {
		return errdefs.InvalidArgument(fmt.Sprintf("label value %q must consist of alphanumerics, '-', '_' or '.', and begin and end with an alphanumeric", v))
	}
	return nil
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

func isQualifiedName(s string) bool {
	if s == "" || !isAlnum(s[0]) || !isAlnum(s[len(s)-1]) {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !isAlnum(c) && c != '-' && c != '_' && c != '.' {
			return false
		}
	}
	return true
}

func validateDNSSubdomain(s string) error {
	if s == "" {
		return fmt.Errorf("is empty")
	}
	if len(s) > MaxLabelPrefixLength {
		return fmt.Errorf("is longer than %d characters", MaxLabelPrefixLength)
	}
	for _, part := range strings.Split(s, ".") {
		if part == "" || len(part) > 63 {
			return fmt.Errorf("%q is not a DNS subdomain", s)
		}
		for i := 0; i < len(part); i++ {
			c := part[i]
			lower := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
			if !lower && c != '-' {
				return fmt.Errorf("%q is not a DNS subdomain", s)
			}
		}
		if part[0] == '-' || part[len(part)-1] == '-' {
			return fmt.Errorf("%q is not a DNS subdomain", s)
		}
	}
	return nil
}
