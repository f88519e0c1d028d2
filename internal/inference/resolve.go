package inference

import (
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"

	inferencev1 "github.com/openshell-go/openshell/api/openshell/inference/v1"
	"github.com/openshell-go/openshell/internal/errdefs"
)

// Route names a gateway accepts (OpenShell's): the user-facing route and
// the sandbox system route. An empty name means RouteLocal.
const (
	RouteLocal  = "inference.local"
	RouteSystem = "sandbox-system"
)

// RouteName maps a request's route_name to its stored name.
func RouteName(name string) (string, error) {
	switch n := strings.TrimSpace(name); n {
	case "", RouteLocal:
		return RouteLocal, nil
	case RouteSystem:
		return RouteSystem, nil
	default:
		return "", errdefs.InvalidArgument(fmt.Sprintf("unknown route_name '%s'; expected 'inference.local' or 'sandbox-system'", n))
	}
}

// Route is a stored inference route: only what the user set.
type Route struct {
	Name         string // RouteLocal or RouteSystem
	ProviderName string
	ModelID      string
	TimeoutSecs  uint64 // 0: the router's default (DefaultTimeout)
}

// Provider is what resolution needs of a provider record. Credentials
// hold plaintext values (the gateway opens them just before Resolve and
// leaves out expired ones).
type Provider struct {
	Name        string
	Type        string
	Config      map[string]string
	Credentials map[string]string
}

// Resolve returns the route a supervisor receives for r served by p.
// Unsupported provider types, a provider without a usable credential, an
// empty base URL and bad Vertex configuration are InvalidArgument; a
// missing required Vertex config key is FailedPrecondition.
func Resolve(r Route, p Provider) (*inferencev1.ResolvedRoute, error) {
	prof, ok := ProfileFor(p.Type)
	if !ok {
		return nil, errdefs.InvalidArgument(fmt.Sprintf("provider '%s' has unsupported type '%s' for cluster inference (supported: %s)", p.Name, strings.TrimSpace(p.Type), SupportedTypes))
	}
	key, ok := apiKey(p, prof)
	if !ok {
		return nil, errdefs.InvalidArgument(fmt.Sprintf("provider '%s' has no usable API key credential", p.Name))
	}
	out := &inferencev1.ResolvedRoute{
		Name: r.Name, ApiKey: key, ModelId: r.ModelID, ProviderType: prof.Type, TimeoutSecs: r.TimeoutSecs,
	}
	if prof.Type == TypeVertex {
		if err := resolveVertex(out, p.Config, prof); err != nil {
			return nil, err
		}
		return out, nil
	}
	base := strings.TrimSpace(configValue(p.Config, prof.BaseURLConfigKeys))
	if base == "" {
		base = prof.DefaultBaseURL
	}
	out.BaseUrl = base
	out.Protocols = slices.Clone(prof.Protocols)
	return out, nil
}

// apiKey is the first non-blank preferred credential; other types than
// Vertex fall back to any non-blank credential, in key order (Vertex
// never does: its other keys hold refresh material, not bearer tokens).
func apiKey(p Provider, prof *Profile) (string, bool) {
	for _, k := range prof.CredentialKeys {
		if v := p.Credentials[k]; strings.TrimSpace(v) != "" {
			return v, true
		}
	}
	if prof.Type == TypeVertex {
		return "", false
	}
	keys := make([]string, 0, len(p.Credentials))
	for k := range p.Credentials {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if v := p.Credentials[k]; strings.TrimSpace(v) != "" {
			return v, true
		}
	}
	return "", false
}

// configValue is the first non-blank value of keys in cfg.
func configValue(cfg map[string]string, keys []string) string {
	for _, k := range keys {
		if v := cfg[k]; strings.TrimSpace(v) != "" {
			return v
		}
	}
	return ""
}

// VertexPublisher infers the Vertex AI publisher from a model id ("" when
// unknown). Only "anthropic" changes routing.
func VertexPublisher(model string) string {
	for _, p := range []struct{ prefixes, publisher string }{
		{"claude-", "anthropic"},
		{"gemini- text-bison- chat-bison-", "google"},
		{"llama-", "meta"},
		{"mistral- codestral-", "mistralai"},
		{"jamba-", "ai21"},
		{"deepseek-", "deepseek"},
	} {
		for _, pre := range strings.Fields(p.prefixes) {
			if strings.HasPrefix(model, pre) {
				return p.publisher
			}
		}
	}
	return ""
}

// VertexHost returns the normalized location and the Vertex API host of
// a region: global → aiplatform.googleapis.com, us/eu →
// aiplatform.{region}.rep.googleapis.com, other → {region}-aiplatform.googleapis.com.
func VertexHost(region string) (location, host string) {
	location = strings.ToLower(strings.TrimSpace(region))
	switch location {
	case "global":
		return location, "aiplatform.googleapis.com"
	case "us", "eu":
		return location, "aiplatform." + location + ".rep.googleapis.com"
	}
	return location, location + "-aiplatform.googleapis.com"
}

func resolveVertex(out *inferencev1.ResolvedRoute, cfg map[string]string, prof *Profile) error {
	model := out.ModelId
	if err := validateVertexModel(model); err != nil {
		return err
	}
	explicit := strings.TrimSpace(cfg[VertexPublisherKey])
	anthropic := VertexPublisher(model) == "anthropic"
	if explicit != "" {
		anthropic = strings.EqualFold(explicit, "anthropic")
	}
	// The OpenAI-compatible surface wants "<publisher>/<model>" in the
	// body; unknown publishers pass the bare id.
	if !anthropic {
		pub := explicit
		if pub == "" {
			pub = VertexPublisher(model)
		}
		if pub != "" {
			out.ModelId = pub + "/" + model
		}
	}
	if override := configValue(cfg, prof.BaseURLConfigKeys); override != "" {
		if anthropic {
			return errdefs.InvalidArgument("Vertex AI base URL overrides are not supported for Anthropic models. Remove GOOGLE_VERTEX_AI_BASE_URL / VERTEX_AI_BASE_URL and configure VERTEX_AI_PROJECT_ID + VERTEX_AI_REGION instead.")
		}
		base, err := validateVertexBaseURL(override)
		if err != nil {
			return err
		}
		setOpenAICompat(out, base)
		return nil
	}
	project := strings.TrimSpace(cfg[VertexProjectKey])
	if project == "" {
		return errdefs.FailedPrecondition("Vertex AI provider requires " + VertexProjectKey + " config")
	}
	if err := validateProject(project); err != nil {
		return err
	}
	region := strings.TrimSpace(cfg[VertexRegionKey])
	if region == "" {
		region = vertexDefaultRegion
	}
	if err := validateRegion(region); err != nil {
		return err
	}
	loc, host := VertexHost(region)
	if anthropic {
		out.BaseUrl = fmt.Sprintf("https://%s/v1/projects/%s/locations/%s/publishers/anthropic/models", host, project, loc)
		out.Protocols = []string{ProtocolMessages}
		out.ModelInPath = true
		s := RawPredict
		out.RequestPathOverride = &s
		return nil
	}
	setOpenAICompat(out, fmt.Sprintf("https://%s/v1beta1/projects/%s/locations/%s/endpoints/openapi", host, project, loc))
	return nil
}

// RawPredict is the request_path_override of Vertex Anthropic routes;
// the router upgrades it to StreamRawPredict for streaming requests.
const (
	RawPredict       = ":rawPredict"
	StreamRawPredict = ":streamRawPredict"
	chatCompletions  = "/chat/completions"
)

func setOpenAICompat(out *inferencev1.ResolvedRoute, base string) {
	out.BaseUrl = base
	out.Protocols = []string{ProtocolChatCompletions}
	out.ModelInPath = false
	s := chatCompletions
	out.RequestPathOverride = &s
}

func validateVertexModel(v string) error {
	t := strings.TrimSpace(v)
	bad := func(what string) error {
		return errdefs.InvalidArgument(fmt.Sprintf("Vertex AI model_id must not %s: %q", what, v))
	}
	switch {
	case t == "":
		return errdefs.InvalidArgument("model_id is required")
	case v != t:
		return bad("include leading or trailing whitespace")
	case strings.ContainsAny(v, `/\`):
		return bad("contain path separators")
	case strings.ContainsAny(v, "?#%"):
		return bad("contain URL delimiters or percent escapes")
	case strings.Contains(v, ".."):
		return bad("contain traversal segments")
	case strings.IndexFunc(v, func(r rune) bool { return r < 0x21 || r == 0x7f }) >= 0:
		return bad("contain whitespace or control characters")
	}
	return nil
}

func validateProject(v string) error {
	ok := len(v) >= 6 && len(v) <= 30 && v[0] >= 'a' && v[0] <= 'z' && !strings.HasSuffix(v, "-") &&
		strings.IndexFunc(v, func(r rune) bool { return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') }) < 0
	if !ok {
		return errdefs.InvalidArgument(fmt.Sprintf("VERTEX_AI_PROJECT_ID has invalid format: %q. GCP project IDs must be 6-30 characters, start with a lowercase letter, contain only lowercase letters, digits, and hyphens, and not end with a hyphen.", v))
	}
	return nil
}

func validateRegion(v string) error {
	l := strings.ToLower(strings.TrimSpace(v))
	ok := l == "global" || l == "us" || l == "eu" ||
		(strings.Contains(l, "-") && !strings.HasPrefix(l, "-") && !strings.HasSuffix(l, "-") &&
			strings.IndexFunc(l, func(r rune) bool { return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') }) < 0)
	if !ok {
		return errdefs.InvalidArgument(fmt.Sprintf("VERTEX_AI_REGION has invalid format: %q. Expected a GCP region (e.g. us-central1, europe-west4) or one of: global, us, eu.", v))
	}
	return nil
}

// vertexOverrideHost reports whether host is an official Vertex AI API
// host.
func vertexOverrideHost(host string) bool {
	switch host {
	case "aiplatform.googleapis.com", "aiplatform.us.rep.googleapis.com", "aiplatform.eu.rep.googleapis.com":
		return true
	}
	return strings.HasSuffix(host, "-aiplatform.googleapis.com")
}

func validateVertexBaseURL(v string) (string, error) {
	t := strings.TrimSpace(v)
	u, err := url.Parse(t)
	if err != nil {
		return "", errdefs.InvalidArgument(fmt.Sprintf("Vertex AI base URL override is invalid: %v", err))
	}
	host := u.Hostname()
	switch {
	case u.Scheme != "https":
		return "", errdefs.InvalidArgument("Vertex AI base URL override must use https")
	case u.User != nil:
		return "", errdefs.InvalidArgument("Vertex AI base URL override must not include userinfo")
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return "", errdefs.InvalidArgument("Vertex AI base URL override must not include query or fragment components")
	case u.Port() != "" && u.Port() != "443":
		return "", errdefs.InvalidArgument(fmt.Sprintf("Vertex AI base URL override must use port 443 when an explicit port is set, got %s", u.Port()))
	case host == "":
		return "", errdefs.InvalidArgument("Vertex AI base URL override must include a host")
	case net.ParseIP(host) != nil:
		return "", errdefs.InvalidArgument("Vertex AI base URL override must not use IP literal hosts: " + host)
	case !vertexOverrideHost(strings.ToLower(host)):
		return "", errdefs.InvalidArgument(fmt.Sprintf("Vertex AI base URL override must target an official Vertex AI hostname, got %q", host))
	}
	return t, nil
}
