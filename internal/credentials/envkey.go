package credentials

import "strings"

// PlaceholderPrefix starts every credential placeholder, as OpenShell's.
const PlaceholderPrefix = "openshell:resolve:env:"

// Placeholder is the opaque value a sandbox sees in place of credential
// key: "openshell:resolve:env:<key>". It carries no part of the secret;
// credential keys are unique among a sandbox's attached providers, so the
// key alone names the credential.
func Placeholder(key string) string { return PlaceholderPrefix + key }

// ParsePlaceholder returns the credential key a placeholder names.
func ParsePlaceholder(s string) (key string, ok bool) {
	key, ok = strings.CutPrefix(s, PlaceholderPrefix)
	return key, ok && ValidKey(key)
}

// ValidKey reports whether key is a valid environment variable name:
// [A-Za-z_][A-Za-z0-9_]*.
func ValidKey(key string) bool {
	if key == "" {
		return false
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		switch {
		case c == '_', c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}
