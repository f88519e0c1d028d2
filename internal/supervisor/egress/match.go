package egress

import "strings"

// globMatch reports whether name matches pattern, where '*' matches any run
// of characters other than sep (possibly empty) and "**" matches any run of
// characters including sep. Every other character matches itself. With
// sep '.' this is the host selector semantics of OpenShell's policy (a
// DNS-label wildcard, "**" across labels); with sep '/' it is the binary
// path semantics ("/usr/bin/*" one directory level, "/**" everything).
// Both pattern and name are compared as given: callers lower-case hosts.
func globMatch(pattern, name string, sep byte) bool {
	// Iterative matcher with backtracking to the last star, in the style
	// of path.Match; "**" and "*" each remember their own restart point.
	for len(pattern) > 0 {
		if pattern[0] != '*' {
			if len(name) == 0 || name[0] != pattern[0] {
				return false
			}
			pattern, name = pattern[1:], name[1:]
			continue
		}
		deep := strings.HasPrefix(pattern, "**")
		if deep {
			pattern = pattern[2:]
		} else {
			pattern = pattern[1:]
		}
		// Try every split point the star may cover; a '*' stops at sep.
		for i := 0; i <= len(name); i++ {
			if globMatch(pattern, name[i:], sep) {
				return true
			}
			if i < len(name) && !deep && name[i] == sep {
				return false
			}
		}
		return false
	}
	return len(name) == 0
}

// hostMatches reports whether the request host matches an endpoint's host
// selector: case-insensitive, exact without '*', else globMatch with '.'
// as separator ("*" and "**" alone match every host).
func hostMatches(selector, host string) bool {
	selector, host = strings.ToLower(selector), strings.ToLower(strings.TrimSuffix(host, "."))
	switch {
	case selector == "*" || selector == "**":
		return true
	case !strings.Contains(selector, "*"):
		return selector == host
	}
	return globMatch(selector, host, '.')
}

// binaryMatches reports whether an entry of a rule's binaries list names
// path: exactly, or as a glob with '/' as separator.
func binaryMatches(entry, path string) bool {
	if !strings.Contains(entry, "*") {
		return entry == path
	}
	return globMatch(entry, path, '/')
}
