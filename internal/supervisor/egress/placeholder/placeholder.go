package placeholder

import (
	"fmt"
	"net/url"
	"path"
	"strings"
	"sync/atomic"
	"time"
)

// Prefix starts every credential placeholder, as OpenShell's.
const Prefix = "openshell:resolve:env:"

// For is the placeholder an agent process sees in place of credential key.
func For(key string) string { return Prefix + key }

// ValidKey reports whether key is an environment variable name
// ([A-Za-z_][A-Za-z0-9_]*), the only keys a placeholder can name.
func ValidKey(key string) bool {
	if key == "" || isDigit(key[0]) {
		return false
	}
	for i := 0; i < len(key); i++ {
		if !isKeyChar(key[i]) {
			return false
		}
	}
	return true
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func isKeyChar(c byte) bool {
	return c == '_' || isDigit(c) || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z')
}

// Endpoint is one place a credential may be sent: a host (exact, or with
// '*' standing for part of one DNS label), a port and a path pattern (""
// or "/**": any path; "/p/**": /p and below; else exact, '*' within one
// segment).
type Endpoint struct {
	Host string
	Port uint32
	Path string
}

// Credential is one provider credential the sandbox may use: its key (the
// environment variable name), value, expiry (0: none) and the endpoints
// of its provider's profile.
type Credential struct {
	Key         string
	Value       string
	ExpiresAtMs int64
	Endpoints   []Endpoint
}

// Set is an immutable set of credentials by key. It never prints a value.
type Set struct {
	creds map[string]*Credential
}

// NewSet checks creds and returns them as a Set. A credential with an
// invalid key, no endpoint or an endpoint without host or port is an
// error naming the key, never the value; so is a key given twice.
func NewSet(creds []Credential) (*Set, error) {
	s := &Set{creds: make(map[string]*Credential, len(creds))}
	for i := range creds {
		c := creds[i]
		if !ValidKey(c.Key) {
			return nil, fmt.Errorf("credential key %q is not an environment variable name", c.Key)
		}
		if _, dup := s.creds[c.Key]; dup {
			return nil, fmt.Errorf("credential %q is given twice", c.Key)
		}
		if len(c.Endpoints) == 0 {
			return nil, fmt.Errorf("credential %q has no endpoint to be sent to", c.Key)
		}
		for j, e := range c.Endpoints {
			if e.Host == "" || e.Port == 0 || e.Port > 65535 {
				return nil, fmt.Errorf("credential %q: endpoint %d needs a host and a port in 1-65535", c.Key, j)
			}
			c.Endpoints[j].Host = strings.ToLower(strings.TrimSuffix(e.Host, "."))
		}
		s.creds[c.Key] = &c
	}
	return s, nil
}

// Len is the number of credentials.
func (s *Set) Len() int {
	if s == nil {
		return 0
	}
	return len(s.creds)
}

// String prints only the number of credentials.
func (s *Set) String() string { return fmt.Sprintf("placeholder.Set(%d credentials)", s.Len()) }

// GoString prints only the number of credentials.
func (s *Set) GoString() string { return s.String() }

// Resolver resolves placeholders against the last installed Set. The zero
// value has an empty set: every placeholder is refused.
type Resolver struct {
	set atomic.Pointer[Set]
	// Now is the clock expiry is checked against (nil: time.Now).
	Now func() time.Time
}

// Install makes s the credentials of every request resolved from now on.
func (r *Resolver) Install(s *Set) { r.set.Store(s) }

// Len is the number of credentials installed.
func (r *Resolver) Len() int { return r.set.Load().Len() }

func (r *Resolver) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// refusal is why a request is not forwarded: the HTTP status, the JSON
// error code and its detail, as OpenShell answers. It never names a
// placeholder, key or value.
type refusal struct {
	status       int
	code, detail string
}

var (
	errUnresolved = &refusal{500, "credential_injection_failed", "unresolved credential placeholder in request"}
	errMismatch   = &refusal{403, "credential_endpoint_mismatch", "credential is not authorized for this request endpoint"}
)

// target is one request's destination, against which credentials are
// checked.
type target struct {
	set        *Set
	nowMs      int64
	host, path string
	port       uint32
}

// value returns the value of credential key for t, or why it cannot be
// used there.
func (t *target) value(key string) (string, *refusal) {
	if t.set == nil {
		return "", errUnresolved
	}
	c := t.set.creds[key]
	if c == nil {
		return "", errUnresolved
	}
	if c.ExpiresAtMs > 0 && c.ExpiresAtMs <= t.nowMs {
		return "", errUnresolved
	}
	if !t.bound(c) {
		return "", errMismatch
	}
	if strings.ContainsAny(c.Value, "\r\n\x00") {
		return "", errUnresolved
	}
	return c.Value, nil
}

func (t *target) bound(c *Credential) bool {
	for _, e := range c.Endpoints {
		if e.Port == t.port && hostMatches(e.Host, t.host) && pathMatches(e.Path, t.path) {
			return true
		}
	}
	return false
}

// hostMatches matches a lower-cased host pattern: '*' stands for part of
// one DNS label.
func hostMatches(pattern, host string) bool {
	if !strings.Contains(pattern, "*") {
		return pattern == host
	}
	ok, err := path.Match(strings.ReplaceAll(pattern, ".", "/"), strings.ReplaceAll(host, ".", "/"))
	return ok && err == nil
}

// pathMatches matches a request path against an endpoint path pattern.
func pathMatches(pattern, p string) bool {
	switch {
	case pattern == "" || pattern == "/**" || pattern == "**":
		return true
	case strings.HasSuffix(pattern, "/**"):
		base := strings.TrimSuffix(pattern, "/**")
		return p == base || strings.HasPrefix(p, base+"/")
	case !strings.Contains(pattern, "*"):
		return p == pattern
	}
	ok, err := path.Match(pattern, p)
	return ok && err == nil
}

// rewriteText replaces every placeholder in s with its value.
func (t *target) rewriteText(s string) (string, int, *refusal) { return t.replace(s, nil) }

// replace replaces every placeholder in s with use(value) (nil: the value
// itself; use reports false for a value unfit for the location). It
// reports how many it replaced; a placeholder it cannot resolve (unknown,
// malformed, expired, not bound to t, unfit) refuses the whole text.
func (t *target) replace(s string, use func(string) (string, bool)) (string, int, *refusal) {
	if !strings.Contains(s, Prefix) {
		return s, 0, nil
	}
	var b strings.Builder
	b.Grow(len(s) + 32)
	n := 0
	for {
		i := strings.Index(s, Prefix)
		if i < 0 {
			b.WriteString(s)
			return b.String(), n, nil
		}
		b.WriteString(s[:i])
		s = s[i+len(Prefix):]
		end := keyLen(s)
		key := s[:end]
		if !ValidKey(key) {
			return "", 0, errUnresolved
		}
		v, why := t.value(key)
		if why != nil {
			return "", 0, why
		}
		if use != nil {
			var ok bool
			if v, ok = use(v); !ok {
				return "", 0, errUnresolved
			}
		}
		b.WriteString(v)
		n++
		s = s[end:]
	}
}

// keyLen is the length of the key at the start of s, just after a
// placeholder prefix: the run of key characters, cut where another
// placeholder follows ("KEYopenshell:resolve:env:OTHER").
func keyLen(s string) int {
	end := 0
	for end < len(s) && isKeyChar(s[end]) {
		end++
	}
	if j := strings.Index(s[:end], "openshell"); j > 0 && strings.HasPrefix(s[j:], Prefix) {
		return j
	}
	return end
}

// containsMarker reports whether s holds a placeholder prefix, as written
// or percent-encoded.
func containsMarker(s string) bool {
	if strings.Contains(s, Prefix) {
		return true
	}
	return strings.IndexByte(s, '%') >= 0 && strings.Contains(percentDecode(s), Prefix)
}

// percentDecode decodes %XX sequences once, keeping malformed ones and
// '+' as they are.
func percentDecode(s string) string {
	if strings.IndexByte(s, '%') < 0 {
		return s
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) {
			if h, l := unhex(s[i+1]), unhex(s[i+2]); h >= 0 && l >= 0 {
				b = append(b, byte(h<<4|l))
				i += 2
				continue
			}
		}
		b = append(b, s[i])
	}
	return string(b)
}

func unhex(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

// escape percent-encodes every byte but RFC 3986's unreserved ones and
// those in keep.
func escape(s, keep string) string {
	const hexDigits = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(s) * 3 / 2)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if isKeyChar(c) || c == '-' || c == '.' || c == '~' || strings.IndexByte(keep, c) >= 0 {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hexDigits[c>>4])
		b.WriteByte(hexDigits[c&15])
	}
	return b.String()
}

// pathSubDelims are the characters a path segment keeps besides the
// unreserved ones (RFC 3986 pchar).
const pathSubDelims = "!$&'()*+,;=:@"

// pathUnsafe reports whether a value must not go into a path segment.
func pathUnsafe(v string) bool {
	return v == ".." || strings.Contains(v, "../") || strings.Contains(v, `..\`) || strings.ContainsAny(v, "/\\?#\r\n\x00")
}

// requestPath is the decoded path of an escaped request path, as the
// endpoint patterns are matched against.
func requestPath(escaped string) string {
	if p, err := url.PathUnescape(escaped); err == nil {
		return p
	}
	return escaped
}
