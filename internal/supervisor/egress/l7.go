package egress

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
)

// l7Endpoint is the compiled REST inspection of one endpoint with
// protocol: rest: its allow rules (access presets expanded), deny rules and
// enforcement mode.
type l7Endpoint struct {
	allow   []restRule
	deny    []restRule
	enforce bool // false: audit (OpenShell's default when enforcement is unset)
	// allowEncodedSlash keeps %2F inside a segment instead of refusing it.
	allowEncodedSlash bool
	// bodyRewrite: request_body_credential_rewrite (see Credentials).
	bodyRewrite bool
	// tlsSkip (tls: skip): CONNECT tunnels to the endpoint are relayed
	// as they are, never peeked at or terminated, so the rules apply to
	// plain http:// requests only (OpenShell's semantics).
	tlsSkip bool
}

// restRule is one REST allow or deny rule: method ("*" any), path glob
// ("**" any) and query matchers by decoded parameter name.
type restRule struct {
	method string
	path   string
	query  map[string][]string // each key: value globs, one must match
}

// accessPresets are OpenShell's REST expansions of access.
var accessPresets = map[string][]string{
	"read-only":  {"GET", "HEAD", "OPTIONS"},
	"read-write": {"GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH"},
	"full":       {"*"},
}

// compileL7 compiles the REST part of ep (protocol rest). It returns the
// reasons the endpoint cannot be enforced as written, if any.
func compileL7(ep *sandboxv1.NetworkEndpoint) (*l7Endpoint, []string) {
	var problems []string
	l := &l7Endpoint{allowEncodedSlash: ep.GetAllowEncodedSlash(), bodyRewrite: ep.GetRequestBodyCredentialRewrite()}
	switch ep.GetEnforcement() {
	case "", "audit":
	case "enforce":
		l.enforce = true
	default:
		problems = append(problems, fmt.Sprintf("enforcement %q (want enforce or audit)", ep.GetEnforcement()))
	}
	if a := ep.GetAccess(); a != "" {
		methods, ok := accessPresets[a]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("access %q (want read-only, read-write or full)", a))
		case len(ep.GetRules()) > 0:
			problems = append(problems, "both access and rules")
		}
		for _, m := range methods {
			l.allow = append(l.allow, restRule{method: m, path: "**"})
		}
	}
	for i, r := range ep.GetRules() {
		a := r.GetAllow()
		if a == nil || a.GetMethod() == "" {
			problems = append(problems, fmt.Sprintf("rules[%d] without allow.method", i))
			continue
		}
		if a.GetCommand() != "" || a.GetOperationType() != "" || a.GetOperationName() != "" || len(a.GetFields()) > 0 || len(a.GetParams()) > 0 {
			problems = append(problems, fmt.Sprintf("rules[%d] with non-REST matchers", i))
			continue
		}
		l.allow = append(l.allow, restRule{method: a.GetMethod(), path: a.GetPath(), query: queryMatchers(a.GetQuery())})
	}
	for i, d := range ep.GetDenyRules() {
		if d.GetMethod() == "" {
			problems = append(problems, fmt.Sprintf("deny_rules[%d] without method", i))
			continue
		}
		if d.GetCommand() != "" || d.GetOperationType() != "" || d.GetOperationName() != "" || len(d.GetFields()) > 0 || len(d.GetParams()) > 0 {
			problems = append(problems, fmt.Sprintf("deny_rules[%d] with non-REST matchers", i))
			continue
		}
		l.deny = append(l.deny, restRule{method: d.GetMethod(), path: d.GetPath(), query: queryMatchers(d.GetQuery())})
	}
	if ep.GetAccess() == "" && len(ep.GetRules()) == 0 {
		problems = append(problems, "protocol rest without access or rules")
	}
	return l, problems
}

func queryMatchers(q map[string]*sandboxv1.L7QueryMatcher) map[string][]string {
	if len(q) == 0 {
		return nil
	}
	out := make(map[string][]string, len(q))
	for k, m := range q {
		var globs []string
		if m.GetGlob() != "" {
			globs = append(globs, m.GetGlob())
		}
		globs = append(globs, m.GetAny()...)
		out[k] = globs // empty: matches no value (as OpenShell's)
	}
	return out
}

// l7Request is one inspected HTTP request: method, canonical path and
// decoded query parameters.
type l7Request struct {
	method string
	path   string
	query  url.Values
}

// methodMatches is OpenShell's method_matches: "*" any, else
// case-insensitive equality, and a GET rule also matches HEAD.
func methodMatches(actual, rule string) bool {
	return rule == "*" || strings.EqualFold(actual, rule) ||
		(strings.EqualFold(actual, "HEAD") && strings.EqualFold(rule, "GET"))
}

// pathMatches is OpenShell's path_matches: "**" any path, else a glob with
// '/' as separator ('*' within a segment, "**" across, '?' one character,
// [classes]).
func pathMatches(actual, pattern string) bool {
	return pattern == "**" || l7Glob(pattern, actual, '/')
}

// allowQueryMatches: every configured key must be present and every one
// of its values must match one of the key's globs.
func allowQueryMatches(q url.Values, rules map[string][]string) bool {
	for k, globs := range rules {
		vals := q[k]
		if len(vals) == 0 {
			return false
		}
		for _, v := range vals {
			if !anyGlob(globs, v) {
				return false
			}
		}
	}
	return true
}

// denyQueryMatches: every configured key must be present and, for each,
// at least one of its values must match (one matching value is enough to
// deny). No configured keys: matches.
func denyQueryMatches(q url.Values, rules map[string][]string) bool {
	for k, globs := range rules {
		hit := false
		for _, v := range q[k] {
			if anyGlob(globs, v) {
				hit = true
				break
			}
		}
		if !hit {
			return false
		}
	}
	return true
}

func anyGlob(globs []string, v string) bool {
	for _, g := range globs {
		if l7Glob(g, v, 0) {
			return true
		}
	}
	return false
}

func (r *restRule) allows(req *l7Request) bool {
	return methodMatches(req.method, r.method) && pathMatches(req.path, r.path) && allowQueryMatches(req.query, r.query)
}

func (r *restRule) denies(req *l7Request) bool {
	return methodMatches(req.method, r.method) && pathMatches(req.path, r.path) && denyQueryMatches(req.query, r.query)
}

// l7Verdict is the outcome of inspecting one request.
type l7Verdict struct {
	allowed bool   // the rules allow it
	enforce bool   // a denial blocks (else audit: logged and forwarded)
	reason  string // why it is not allowed ("" when allowed)
}

// decideL7 evaluates req against the REST endpoints that matched the
// connection (across every matching rule): allowed when one endpoint's
// allow rules match and no endpoint's deny rules match (deny wins). A
// denial is enforced when any of the endpoints says enforce.
func decideL7(eps []*l7Endpoint, req *l7Request) l7Verdict {
	v := l7Verdict{}
	denied := false
	for _, ep := range eps {
		v.enforce = v.enforce || ep.enforce
		for i := range ep.allow {
			if ep.allow[i].allows(req) {
				v.allowed = true
				break
			}
		}
		for i := range ep.deny {
			if ep.deny[i].denies(req) {
				denied = true
				break
			}
		}
	}
	switch {
	case denied:
		v.allowed, v.reason = false, fmt.Sprintf("%s %s blocked by deny rule", req.method, req.path)
	case !v.allowed:
		v.reason = fmt.Sprintf("%s %s not permitted by policy", req.method, req.path)
	}
	return v
}

// l7Glob matches name against pattern: '*' any run of characters other
// than sep, "**" any run including sep, '?' one character other than sep,
// "[...]" a class ("[!...]" or "[^...]" negated, ranges a-z), '\' escapes
// the next character. sep 0 means no separator ('*' matches anything).
// A malformed class matches nothing (fail closed).
func l7Glob(pattern, name string, sep byte) bool {
	for len(pattern) > 0 {
		switch pattern[0] {
		case '*':
			deep := strings.HasPrefix(pattern, "**")
			if deep {
				pattern = pattern[2:]
			} else {
				pattern = pattern[1:]
			}
			for i := 0; i <= len(name); i++ {
				if l7Glob(pattern, name[i:], sep) {
					return true
				}
				if i < len(name) && !deep && sep != 0 && name[i] == sep {
					return false
				}
			}
			return false
		case '?':
			if len(name) == 0 || (sep != 0 && name[0] == sep) {
				return false
			}
			pattern, name = pattern[1:], name[1:]
		case '[':
			end := strings.IndexByte(pattern[1:], ']')
			if end < 0 || len(name) == 0 {
				return false
			}
			class := pattern[1 : 1+end]
			if end == 0 { // "[]...]": ']' first is literal
				e2 := strings.IndexByte(pattern[2:], ']')
				if e2 < 0 {
					return false
				}
				class, end = pattern[1:2+e2], 1+e2
			}
			if !classMatches(class, name[0]) {
				return false
			}
			pattern, name = pattern[2+end:], name[1:]
		case '\\':
			if len(pattern) < 2 || len(name) == 0 || name[0] != pattern[1] {
				return false
			}
			pattern, name = pattern[2:], name[1:]
		default:
			if len(name) == 0 || name[0] != pattern[0] {
				return false
			}
			pattern, name = pattern[1:], name[1:]
		}
	}
	return len(name) == 0
}

func classMatches(class string, c byte) bool {
	neg := false
	if len(class) > 0 && (class[0] == '!' || class[0] == '^') {
		neg, class = true, class[1:]
	}
	hit := false
	for i := 0; i < len(class); i++ {
		if i+2 < len(class) && class[i+1] == '-' {
			if class[i] <= c && c <= class[i+2] {
				hit = true
			}
			i += 2
			continue
		}
		if class[i] == c {
			hit = true
		}
	}
	return hit != neg
}

// encodedSlash stands for a kept %2F while canonicalizing (control bytes
// are refused in the input, so it cannot come from the client).
const encodedSlash = 0x01

var errEncodedSlash = errors.New("request-target contains an encoded '/' (%2F) which is not allowed on this endpoint")

// canonicalPath is OpenShell's request-target canonicalization for policy
// matching: percent-decoded, ";params" stripped from segments, empty and
// "." segments dropped, ".." resolved (above the root is refused), %2F
// refused unless allowEncodedSlash, control and non-ASCII bytes refused.
// The result is re-encoded (unreserved and sub-delims kept) and is what is
// matched and what is sent upstream.
func canonicalPath(raw string, allowEncodedSlash bool) (string, error) {
	if isCanonicalPath(raw) {
		return raw, nil
	}
	return rebuildPath(raw, allowEncodedSlash)
}

// rebuildPath is canonicalPath the long way, for any raw.
func rebuildPath(raw string, allowEncodedSlash bool) (string, error) {
	if raw == "" {
		raw = "/"
	}
	if raw[0] != '/' {
		return "", errors.New("request-target is not a valid origin-form path")
	}
	if len(raw) > 4096 {
		return "", errors.New("request-target exceeds the configured maximum length")
	}
	var segs []string
	var cur strings.Builder
	flush := func(last bool) error {
		s := cur.String()
		cur.Reset()
		if i := strings.IndexByte(s, ';'); i >= 0 {
			s = s[:i]
		}
		switch s {
		case "..":
			if len(segs) == 0 {
				return errors.New("request-target's `..` segment would escape the path root")
			}
			segs = segs[:len(segs)-1]
			if last {
				segs = append(segs, "")
			}
		case ".":
			if last {
				segs = append(segs, "")
			}
		case "":
			if last {
				segs = append(segs, "")
			}
		default:
			segs = append(segs, s)
		}
		return nil
	}
	for i := 1; i < len(raw); i++ {
		b := raw[i]
		if b < 0x20 || b >= 0x7f {
			return "", errors.New("request-target contains a control or non-ASCII byte")
		}
		switch b {
		case '/':
			if err := flush(false); err != nil {
				return "", err
			}
			continue
		case '%':
			if i+2 >= len(raw) || unhex(raw[i+1]) < 0 || unhex(raw[i+2]) < 0 {
				return "", errors.New("request-target contains an invalid percent-encoded sequence")
			}
			d := byte(unhex(raw[i+1])<<4 | unhex(raw[i+2]))
			i += 2
			switch {
			case d == '/':
				if !allowEncodedSlash {
					return "", errEncodedSlash
				}
				cur.WriteByte(encodedSlash)
				continue
			case d < 0x20 || d == 0x7f:
				return "", errors.New("request-target contains a control byte")
			}
			b = d
		}
		cur.WriteByte(b)
	}
	if err := flush(true); err != nil {
		return "", err
	}
	var out strings.Builder
	for _, s := range segs {
		out.WriteByte('/')
		for j := 0; j < len(s); j++ {
			c := s[j]
			switch {
			case c == encodedSlash:
				out.WriteString("%2F")
			case isPchar(c):
				out.WriteByte(c)
			default:
				fmt.Fprintf(&out, "%%%02X", c)
			}
		}
	}
	if out.Len() == 0 {
		return "/", nil
	}
	return out.String(), nil
}

// isCanonicalPath reports whether raw is its own canonical form: '/' and
// pchars only (no '%', ';' or control byte), no empty segment but the
// last, no "." or ".." segment, within the length limit. Most request
// targets are; canonicalPath returns them without rebuilding them.
func isCanonicalPath(raw string) bool {
	if raw == "" || raw[0] != '/' || len(raw) > 4096 {
		return false
	}
	start := 1 // of the current segment
	for i := 1; i <= len(raw); i++ {
		if i < len(raw) && raw[i] != '/' {
			if !isPchar(raw[i]) {
				return false
			}
			continue
		}
		if seg := raw[start:i]; seg == "." || seg == ".." || seg == "" && i < len(raw) {
			return false
		}
		start = i + 1
	}
	return true
}

func unhex(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c-'a') + 10
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

func isPchar(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		strings.IndexByte("-._~!$&'()*+,=:@", c) >= 0
}
