package placeholder

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
)

// MaxBody is the largest request body ResolveBody rewrites, as OpenShell's.
const MaxBody = 256 << 10

// Resolve replaces the placeholders of req, a request the proxy admitted
// for host:port, in its header values (Basic credentials included), query
// parameter values and path segments. status is 0 when req may be
// forwarded (rewritten in place when it held placeholders); otherwise
// nothing of req was changed and status, code and detail are the answer to
// give (see the package documentation), naming no placeholder, key or
// value. The path is req.URL.Opaque when set (the proxy's canonical path),
// else its escaped path; a rewritten path is set as req.URL.Opaque.
func (r *Resolver) Resolve(req *http.Request, host string, port uint32) (status int, code, detail string) {
	escPath := req.URL.Opaque
	if escPath == "" {
		escPath = req.URL.EscapedPath()
	}
	if !requestHasMarker(req, escPath) {
		return 0, "", ""
	}
	t := &target{set: r.set.Load(), nowMs: r.now().UnixMilli(), host: strings.ToLower(strings.TrimSuffix(host, ".")), port: port, path: requestPath(escPath)}
	why := t.rewrite(req, escPath)
	if why != nil {
		return why.status, why.code, why.detail
	}
	return 0, "", ""
}

// requestHasMarker is the fast path: whether anything of req resolve looks
// at holds a placeholder, as written, percent-encoded or Basic-encoded.
func requestHasMarker(req *http.Request, escPath string) bool {
	if containsMarker(escPath) || containsMarker(req.URL.RawQuery) {
		return true
	}
	for name, vs := range req.Header {
		if nameHasMarker(name) {
			return true
		}
		for _, v := range vs {
			if containsMarker(v) {
				return true
			}
			if enc, ok := basicToken(v); ok {
				if dec, err := base64.StdEncoding.DecodeString(enc); err == nil && bytes.Contains(dec, []byte(Prefix)) {
					return true
				}
			}
		}
	}
	return false
}

// rewrite resolves everything into copies and changes req only when all
// of it resolved.
func (t *target) rewrite(req *http.Request, escPath string) *refusal {
	newPath, pathChanged, why := t.rewritePath(escPath)
	if why != nil {
		return why
	}
	newQuery, queryChanged, why := t.rewriteQuery(req.URL.RawQuery)
	if why != nil {
		return why
	}
	headers := map[string][]string{}
	for name, vs := range req.Header {
		if nameHasMarker(name) {
			return errUnresolved
		}
		var out []string
		for i, v := range vs {
			nv, changed, why := t.rewriteHeader(name, v)
			if why != nil {
				return why
			}
			if changed && out == nil {
				out = append([]string(nil), vs...)
			}
			if out != nil {
				out[i] = nv
			}
		}
		if out != nil {
			headers[name] = out
		}
	}
	for name, vs := range headers {
		req.Header[name] = vs
	}
	if pathChanged {
		req.URL.Opaque = newPath
	}
	if queryChanged {
		req.URL.RawQuery = newQuery
	}
	return nil
}

// rewriteHeader resolves one header value: a placeholder anywhere in it,
// or inside "Basic <base64>". Cookies are never rewritten: a placeholder
// there is refused, as is one left percent-encoded.
func (t *target) rewriteHeader(name, v string) (string, bool, *refusal) {
	if enc, ok := basicToken(v); ok {
		if dec, err := base64.StdEncoding.DecodeString(enc); err == nil && bytes.Contains(dec, []byte(Prefix)) {
			out, n, why := t.rewriteText(string(dec))
			if why != nil {
				return "", false, why
			}
			if n > 0 {
				return v[:len(v)-len(enc)] + base64.StdEncoding.EncodeToString([]byte(out)), true, nil
			}
		}
	}
	if !containsMarker(v) {
		return v, false, nil
	}
	if http.CanonicalHeaderKey(name) == "Cookie" {
		return "", false, errUnresolved
	}
	out, n, why := t.rewriteText(v)
	if why != nil {
		return "", false, why
	}
	if n == 0 || containsMarker(out) {
		return "", false, errUnresolved
	}
	return out, true, nil
}

// nameHasMarker reports whether a (canonicalized) header name holds a
// placeholder prefix, in any case.
func nameHasMarker(name string) bool {
	return containsMarker(strings.ToLower(name))
}

// basicToken returns the base64 part of a "Basic <token>" value.
func basicToken(v string) (string, bool) {
	v = strings.TrimSpace(v)
	if len(v) < 6 || !strings.EqualFold(v[:6], "basic ") {
		return "", false
	}
	return strings.TrimSpace(v[6:]), true
}

// rewritePath resolves placeholders in the segments of an escaped path,
// each percent-decoded first and encoded again after; a value unfit for a
// path segment is refused.
func (t *target) rewritePath(esc string) (string, bool, *refusal) {
	if !containsMarker(esc) {
		return esc, false, nil
	}
	segs := strings.Split(esc, "/")
	for i, seg := range segs {
		dec := percentDecode(seg)
		if !strings.Contains(dec, Prefix) {
			continue
		}
		out, _, why := t.replace(dec, func(v string) (string, bool) { return v, !pathUnsafe(v) })
		if why != nil {
			return "", false, why
		}
		segs[i] = escape(out, pathSubDelims)
	}
	return strings.Join(segs, "/"), true, nil
}

// rewriteQuery resolves placeholders in the values of a query string (or
// a form body), each percent-decoded first and encoded again after; one in
// a parameter name is refused.
func (t *target) rewriteQuery(raw string) (string, bool, *refusal) {
	if !containsMarker(raw) {
		return raw, false, nil
	}
	params := strings.Split(raw, "&")
	for i, p := range params {
		k, v, _ := strings.Cut(p, "=")
		if containsMarker(k) {
			return "", false, errUnresolved
		}
		dec := percentDecode(v)
		if !strings.Contains(dec, Prefix) {
			continue
		}
		out, _, why := t.rewriteText(dec)
		if why != nil {
			return "", false, why
		}
		params[i] = k + "=" + escape(out, "")
	}
	return strings.Join(params, "&"), true, nil
}

// ResolveBody replaces the placeholders of req's body, for an endpoint
// that opted in (request_body_credential_rewrite): UTF-8 JSON (values
// inserted JSON-escaped), application/x-www-form-urlencoded (values
// percent-encoded) and text/* bodies of at most MaxBody bytes. Other
// bodies are left alone. Call it after Resolve; the results read the same.
func (r *Resolver) ResolveBody(req *http.Request, host string, port uint32) (status int, code, detail string) {
	if req.Body == nil || req.Body == http.NoBody {
		return 0, "", ""
	}
	mt, params, err := mime.ParseMediaType(req.Header.Get("Content-Type"))
	if err != nil {
		return 0, "", ""
	}
	if cs := params["charset"]; cs != "" && !strings.EqualFold(cs, "utf-8") {
		return 0, "", ""
	}
	var kind string
	switch {
	case mt == "application/json" || strings.HasSuffix(mt, "+json"):
		kind = "json"
	case mt == "application/x-www-form-urlencoded":
		kind = "form"
	case strings.HasPrefix(mt, "text/"):
		kind = "text"
	default:
		return 0, "", ""
	}
	body, err := io.ReadAll(io.LimitReader(req.Body, MaxBody+1))
	_ = req.Body.Close()
	if err != nil {
		return http.StatusBadRequest, "credential_injection_failed", "request body could not be read"
	}
	if len(body) > MaxBody {
		return http.StatusRequestEntityTooLarge, "credential_injection_failed", "request body exceeds " + strconv.Itoa(MaxBody) + " bytes for credential rewrite"
	}
	if containsMarker(string(body)) {
		escPath := req.URL.Opaque
		if escPath == "" {
			escPath = req.URL.EscapedPath()
		}
		t := &target{set: r.set.Load(), nowMs: r.now().UnixMilli(), host: strings.ToLower(strings.TrimSuffix(host, ".")), port: port, path: requestPath(escPath)}
		var out string
		var why *refusal
		switch kind {
		case "json":
			out, _, why = t.replace(string(body), func(v string) (string, bool) {
				b, err := json.Marshal(v)
				return string(b[1 : len(b)-1]), err == nil
			})
		case "form":
			out, _, why = t.rewriteQuery(string(body))
		default:
			out, _, why = t.rewriteText(string(body))
		}
		if why != nil {
			return why.status, why.code, why.detail
		}
		if containsMarker(out) {
			return errUnresolved.status, errUnresolved.code, errUnresolved.detail
		}
		body = []byte(out)
	}
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.ContentLength = int64(len(body))
	req.TransferEncoding = nil
	req.Header.Del("Content-Length")
	return 0, "", ""
}

// Redact replaces every placeholder in s with "[CREDENTIAL]", for logs
// and events; a placeholder it cannot cut out (percent-encoded) makes the
// whole of s "[CREDENTIAL]".
func (r *Resolver) Redact(s string) string {
	if !containsMarker(s) {
		return s
	}
	var b strings.Builder
	for {
		i := strings.Index(s, Prefix)
		if i < 0 {
			b.WriteString(s)
			break
		}
		b.WriteString(s[:i])
		b.WriteString("[CREDENTIAL]")
		s = s[i+len(Prefix):]
		s = s[keyLen(s):]
	}
	if out := b.String(); !containsMarker(out) {
		return out
	}
	return "[CREDENTIAL]"
}
