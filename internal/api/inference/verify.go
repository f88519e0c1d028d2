package inference

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"

	inferencev1 "github.com/openshell-go/openshell/api/openshell/inference/v1"
	"github.com/openshell-go/openshell/internal/errdefs"
	domain "github.com/openshell-go/openshell/internal/inference"
)

// probe is one verification request (OpenShell's validation probes).
type probe struct {
	path, protocol, body, fallback string
}

var probes = []probe{
	{"/v1/chat/completions", domain.ProtocolChatCompletions,
		`{"messages":[{"role":"user","content":"ping"}],"max_completion_tokens":32}`,
		`{"messages":[{"role":"user","content":"ping"}],"max_tokens":32}`},
	{"/v1/messages", domain.ProtocolMessages, `{"messages":[{"role":"user","content":"ping"}],"max_tokens":32}`, ""},
	{"/v1/responses", domain.ProtocolResponses, `{"input":"ping","max_output_tokens":32}`, ""},
	{"/v1/completions", domain.ProtocolCompletions, `{"prompt":"ping","max_tokens":32}`, ""},
	{"/v1/embeddings", domain.ProtocolEmbeddings, `{"input":"ping"}`, ""},
}

// failure is a classified probe failure.
type failure struct {
	shape   bool // the upstream rejected the request's shape: try the next protocol
	details string
	next    string
}

// verify probes the resolved endpoint with a minimal request per protocol
// the route serves, in preference order: the first success is the
// validated endpoint; a request-shape rejection tries the next protocol;
// any other failure (credentials, rate limit, connectivity, server error)
// ends verification with FailedPrecondition.
func verify(ctx context.Context, c *http.Client, provider, model string, r *inferencev1.ResolvedRoute) (*inferencev1.ValidatedEndpoint, error) {
	var first *failure
	for _, p := range probes {
		if !slices.Contains(r.GetProtocols(), p.protocol) {
			continue
		}
		f := send(ctx, c, r, p.path, p.body)
		if f != nil && f.shape && p.fallback != "" && strings.Contains(f.details, "max_completion_tokens") {
			f = send(ctx, c, r, p.path, p.fallback)
		}
		if f == nil {
			return &inferencev1.ValidatedEndpoint{Url: domain.URL(r, p.path, false), Protocol: p.protocol}, nil
		}
		if !f.shape {
			return nil, verifyError(provider, model, r, f)
		}
		if first == nil {
			first = f
		}
	}
	if first == nil {
		first = &failure{details: fmt.Sprintf("route '%s' does not expose a writable inference protocol for validation", r.GetName()), next: "confirm the provider type, base URL, and model identifier"}
	}
	return nil, verifyError(provider, model, r, first)
}

func verifyError(provider, model string, r *inferencev1.ResolvedRoute, f *failure) error {
	return errdefs.FailedPrecondition(fmt.Sprintf("failed to verify inference endpoint for provider '%s' and model '%s' at '%s': %s. Next steps: %s, or retry with '--no-verify' if you want to skip verification",
		provider, model, r.GetBaseUrl(), f.details, f.next))
}

// send posts one probe; nil on a 2xx answer.
func send(ctx context.Context, c *http.Client, r *inferencev1.ResolvedRoute, path, body string) *failure {
	b, _ := domain.Body(r, []byte(body))
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, domain.URL(r, path, false), bytes.NewReader(b))
	if err != nil {
		return &failure{details: "invalid endpoint URL", next: "confirm the endpoint URL, protocol, credentials, and model identifier"}
	}
	req.Header = domain.Headers(r, http.Header{"Content-Type": {"application/json"}})
	resp, err := c.Do(req)
	if err != nil {
		// The transport's error names the URL, never a header.
		return &failure{details: fmt.Sprintf("request failed: %v", err), next: "check that the service is running, confirm the base URL and protocol, and verify credentials"}
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 == 2 {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return nil
	}
	text, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	excerpt := strings.TrimSpace(string(text))
	if k := r.GetApiKey(); k != "" {
		excerpt = strings.ReplaceAll(excerpt, k, "[REDACTED]")
	}
	if len(excerpt) > 200 {
		excerpt = excerpt[:200]
	}
	details := fmt.Sprintf("upstream returned HTTP %d", resp.StatusCode)
	if excerpt != "" {
		details += ". Response body: " + excerpt
	}
	lower := strings.ToLower(excerpt)
	authBody := false
	for _, n := range []string{"invalid_api_key", "invalid api key", "incorrect api key", "invalid_authentication", "authentication_error", "authentication failed", "unauthorized", "permission_denied", "permission denied", "missing api key"} {
		authBody = authBody || strings.Contains(lower, n)
	}
	switch s := resp.StatusCode; {
	case s == 401 || s == 403 || ((s == 400 || s == 404 || s == 422) && authBody):
		return &failure{details: "upstream rejected credentials with " + details, next: "verify the provider API key and any required auth headers"}
	case s == 400 || s == 404 || s == 405 || s == 422:
		return &failure{shape: true, details: "upstream rejected the validation request with " + details, next: "confirm the provider type, base URL, and model identifier"}
	case s == 429:
		return &failure{details: "upstream rate-limited the validation request with " + details, next: "retry later or verify quota/limits on the upstream provider"}
	case s >= 500:
		return &failure{details: "upstream returned a server error with " + details, next: "check whether the endpoint is healthy and serving requests"}
	}
	return &failure{details: "upstream returned an unexpected response with " + details, next: "confirm the endpoint URL, protocol, credentials, and model identifier"}
}
