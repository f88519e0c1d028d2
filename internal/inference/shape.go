package inference

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"time"

	inferencev1 "github.com/openshell-go/openshell/api/openshell/inference/v1"
)

// DefaultTimeout applies to routes whose timeout_secs is 0.
const DefaultTimeout = 60 * time.Second

// Timeout is r's per-request timeout.
func Timeout(r *inferencev1.ResolvedRoute) time.Duration {
	if r.GetTimeoutSecs() == 0 {
		return DefaultTimeout
	}
	return time.Duration(r.GetTimeoutSecs()) * time.Second
}

// pattern is one request shape inference.local serves.
type pattern struct {
	method, path, protocol string
	prefix                 bool // path and anything below it
}

var patterns = []pattern{
	{"POST", "/v1/chat/completions", ProtocolChatCompletions, false},
	{"POST", "/v1/completions", ProtocolCompletions, false},
	{"POST", "/v1/responses", ProtocolResponses, false},
	{"POST", "/v1/embeddings", ProtocolEmbeddings, false},
	{"POST", "/v1/messages", ProtocolMessages, false},
	{"GET", "/v1/models", ProtocolModelDiscovery, false},
	{"GET", "/v1/models", ProtocolModelDiscovery, true},
}

// Match returns the protocol of a request to inference.local by method
// and path (the query is ignored), or false when no pattern fits.
func Match(method, path string) (string, bool) {
	path, _, _ = strings.Cut(path, "?")
	for _, p := range patterns {
		if !strings.EqualFold(method, p.method) {
			continue
		}
		if path == p.path || (p.prefix && strings.HasPrefix(path, p.path+"/") && len(path) > len(p.path)+1) {
			return p.protocol, true
		}
	}
	return "", false
}

// Select returns the first route serving protocol.
func Select(routes []*inferencev1.ResolvedRoute, protocol string) *inferencev1.ResolvedRoute {
	for _, r := range routes {
		if slices.Contains(r.GetProtocols(), protocol) {
			return r
		}
	}
	return nil
}

// headerPolicy is how a route presents itself upstream: auth style,
// default headers and the client headers it forwards (route_headers_for_route).
func headerPolicy(r *inferencev1.ResolvedRoute) (*Profile, []string) {
	prof, ok := ProfileFor(r.GetProviderType())
	if !ok {
		// Unknown types authenticate with a bearer token and forward
		// nothing but the common headers.
		return &Profile{Auth: AuthBearer}, nil
	}
	pass := slices.Clone(prof.Passthrough)
	if prof.Type == TypeVertex && slices.Contains(r.GetProtocols(), ProtocolMessages) && !slices.Contains(pass, "anthropic-beta") {
		pass = append(pass, "anthropic-beta")
	}
	return prof, pass
}

// vertexRawPredict reports whether r is a Vertex Anthropic rawPredict
// route (a structural test, as OpenShell's).
func vertexRawPredict(r *inferencev1.ResolvedRoute) bool {
	return r.GetModelInPath() && slices.Contains(r.GetProtocols(), ProtocolMessages) && r.GetRequestPathOverride() == RawPredict
}

// commonHeaders are forwarded on every route.
var commonHeaders = []string{"content-type", "accept", "accept-encoding", "user-agent"}

// URL returns the upstream URL of a request with path (the client's path,
// e.g. /v1/chat/completions, query included) on route r; stream selects
// :streamRawPredict on Vertex Anthropic routes.
func URL(r *inferencev1.ResolvedRoute, path string, stream bool) string {
	base := strings.TrimRight(r.GetBaseUrl(), "/")
	switch {
	case r.RequestPathOverride != nil && r.GetModelInPath():
		suffix := r.GetRequestPathOverride()
		if stream && suffix == RawPredict && vertexRawPredict(r) {
			suffix = StreamRawPredict
		}
		return base + "/" + r.GetModelId() + suffix
	case r.RequestPathOverride != nil:
		o := r.GetRequestPathOverride()
		if o != "" && !strings.HasPrefix(o, "/") {
			o = "/" + o
		}
		return base + o
	case r.GetModelInPath():
		return base + "/" + r.GetModelId() + "/" + strings.TrimLeft(path, "/")
	}
	return joinV1(base, path)
}

// joinV1 appends path to base, dropping path's /v1 when base's path starts
// or ends with a /v1 segment (https://api.openai.com/v1 + /v1/models).
func joinV1(base, path string) string {
	rest, ok := strings.CutPrefix(path, "/v1")
	if !ok || (rest != "" && rest[0] != '/' && rest[0] != '?') {
		return base + path
	}
	bp := base
	if i := strings.Index(bp, "://"); i >= 0 {
		bp = bp[i+3:]
	}
	if j := strings.IndexByte(bp, '/'); j >= 0 {
		bp = bp[j:]
	} else {
		bp = ""
	}
	if strings.HasPrefix(bp, "/v1/") || strings.HasSuffix(bp, "/v1") {
		return base + rest
	}
	return base + path
}

// Headers returns the upstream request headers for a client request with
// headers in on route r: the allowlist (common, passthrough and default
// headers; never Authorization, x-api-key, Host, Content-Length or hop by
// hop fields), the route's default headers unless sent, and the credential
// in the route's auth style.
func Headers(r *inferencev1.ResolvedRoute, in http.Header) http.Header {
	prof, pass := headerPolicy(r)
	allowed := map[string]bool{}
	for _, h := range commonHeaders {
		allowed[h] = true
	}
	for _, h := range pass {
		allowed[strings.ToLower(h)] = true
	}
	for _, d := range prof.DefaultHeaders {
		allowed[d[0]] = true
	}
	stripBeta := vertexRawPredict(r)
	out := http.Header{}
	for k, vs := range in {
		lk := strings.ToLower(k)
		if !allowed[lk] || (stripBeta && lk == "anthropic-beta") {
			continue
		}
		out[http.CanonicalHeaderKey(lk)] = slices.Clone(vs)
	}
	for _, d := range prof.DefaultHeaders {
		if out.Get(d[0]) == "" {
			out.Set(d[0], d[1])
		}
	}
	switch prof.Auth {
	case AuthHeader:
		out.Set(prof.AuthHeader, r.GetApiKey())
	default:
		out.Set("Authorization", "Bearer "+r.GetApiKey())
	}
	return out
}

// Body rewrites a JSON request body for route r: the model becomes the
// route's; Vertex rawPredict bodies lose "model" (it is in the URL) and
// "context_management" (rejected there) and gain anthropic_version unless
// set. Non-JSON bodies and bodies that are
// not objects pass unchanged. stream reports the body's "stream": true.
func Body(r *inferencev1.ResolvedRoute, body []byte) (out []byte, stream bool) {
	var obj map[string]json.RawMessage
	if len(body) == 0 || json.Unmarshal(body, &obj) != nil || obj == nil {
		return body, false
	}
	if s, ok := obj["stream"]; ok {
		_ = json.Unmarshal(s, &stream)
	}
	if vertexRawPredict(r) {
		delete(obj, "model")
		// An Anthropic SDK field Vertex's rawPredict rejects.
		delete(obj, "context_management")
		if _, ok := obj["anthropic_version"]; !ok {
			obj["anthropic_version"], _ = json.Marshal(VertexAnthropicVersion)
		}
	} else {
		obj["model"], _ = json.Marshal(r.GetModelId())
	}
	b, err := json.Marshal(obj)
	if err != nil {
		return body, stream
	}
	return b, stream
}
