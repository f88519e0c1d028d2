package inference

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"

	inferencev1 "github.com/openshell-go/openshell/api/openshell/inference/v1"
)

var (
	openaiRoute = &inferencev1.ResolvedRoute{Name: RouteLocal, BaseUrl: "https://api.openai.com/v1", Protocols: []string{ProtocolChatCompletions, ProtocolModelDiscovery}, ApiKey: "sk-real", ModelId: "gpt-x", ProviderType: "openai"}
	anthRoute   = &inferencev1.ResolvedRoute{Name: RouteLocal, BaseUrl: "http://127.0.0.1:1/v1", Protocols: []string{ProtocolMessages}, ApiKey: "ak-real", ModelId: "claude-x", ProviderType: "anthropic", TimeoutSecs: 5}
	vxClaude    = &inferencev1.ResolvedRoute{BaseUrl: "https://h/v1/projects/p/locations/l/publishers/anthropic/models/", Protocols: []string{ProtocolMessages}, ApiKey: "ya29", ModelId: "claude-x@1", ProviderType: "google-vertex-ai", ModelInPath: true, RequestPathOverride: proto.String(":rawPredict")}
	vxGemini    = &inferencev1.ResolvedRoute{BaseUrl: "https://h/v1beta1/projects/p/locations/l/endpoints/openapi", Protocols: []string{ProtocolChatCompletions}, ApiKey: "ya29", ModelId: "google/gemini-x", ProviderType: "google-vertex-ai", RequestPathOverride: proto.String("/chat/completions")}
)

func TestMatch(t *testing.T) {
	for _, tc := range []struct{ method, path, want string }{
		{"POST", "/v1/chat/completions", ProtocolChatCompletions},
		{"post", "/v1/chat/completions?x=1", ProtocolChatCompletions},
		{"POST", "/v1/completions", ProtocolCompletions},
		{"POST", "/v1/responses", ProtocolResponses},
		{"POST", "/v1/embeddings", ProtocolEmbeddings},
		{"POST", "/v1/messages", ProtocolMessages},
		{"GET", "/v1/models", ProtocolModelDiscovery},
		{"GET", "/v1/models/gpt-4o", ProtocolModelDiscovery},
		{"GET", "/v1/models/", ""},
		{"GET", "/v1/chat/completions", ""},
		{"POST", "/v1/chat/completions/x", ""},
		{"POST", "/v2/messages", ""},
		{"DELETE", "/v1/models/x", ""},
	} {
		got, ok := Match(tc.method, tc.path)
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("Match(%s %s) = %q, %v, want %q", tc.method, tc.path, got, ok, tc.want)
		}
	}
}

func TestURL(t *testing.T) {
	for _, tc := range []struct {
		name   string
		r      *inferencev1.ResolvedRoute
		path   string
		stream bool
		want   string
	}{
		{"openai /v1 dedup", openaiRoute, "/v1/chat/completions", false, "https://api.openai.com/v1/chat/completions"},
		{"openai query kept", openaiRoute, "/v1/models?limit=1", false, "https://api.openai.com/v1/models?limit=1"},
		{"deepinfra base starting with /v1", &inferencev1.ResolvedRoute{BaseUrl: "https://api.deepinfra.com/v1/openai"}, "/v1/chat/completions", false, "https://api.deepinfra.com/v1/openai/chat/completions"},
		{"base ending with /v1", &inferencev1.ResolvedRoute{BaseUrl: "https://g/openai/v1/"}, "/v1/chat/completions", false, "https://g/openai/v1/chat/completions"},
		{"base without v1", &inferencev1.ResolvedRoute{BaseUrl: "http://127.0.0.1:8000"}, "/v1/chat/completions", false, "http://127.0.0.1:8000/v1/chat/completions"},
		{"v1 buried in base path", &inferencev1.ResolvedRoute{BaseUrl: "https://p/api/v1/openai"}, "/v1/chat/completions", false, "https://p/api/v1/openai/v1/chat/completions"},
		{"vertex claude buffered", vxClaude, "/v1/messages", false, "https://h/v1/projects/p/locations/l/publishers/anthropic/models/claude-x@1:rawPredict"},
		{"vertex claude streaming", vxClaude, "/v1/messages", true, "https://h/v1/projects/p/locations/l/publishers/anthropic/models/claude-x@1:streamRawPredict"},
		{"vertex openai-compatible override", vxGemini, "/v1/chat/completions", true, "https://h/v1beta1/projects/p/locations/l/endpoints/openapi/chat/completions"},
		{"override without slash", &inferencev1.ResolvedRoute{BaseUrl: "https://h/b", RequestPathOverride: proto.String("x")}, "/v1/y", false, "https://h/b/x"},
		{"model in path, no override", &inferencev1.ResolvedRoute{BaseUrl: "https://h/m", ModelId: "mod", ModelInPath: true}, "/v1/y", false, "https://h/m/mod/v1/y"},
	} {
		if got := URL(tc.r, tc.path, tc.stream); got != tc.want {
			t.Errorf("%s: URL() = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestHeaders(t *testing.T) {
	in := http.Header{
		"Authorization": {"Bearer sandbox-fake"}, "X-Api-Key": {"sandbox-fake"}, "Content-Type": {"application/json"},
		"Accept": {"text/event-stream"}, "User-Agent": {"curl"}, "Openai-Organization": {"org"}, "X-Model-Id": {"m"},
		"Anthropic-Version": {"2024-01-01"}, "Anthropic-Beta": {"tools"}, "Cookie": {"c"}, "Connection": {"keep-alive"},
		"Proxy-Authorization": {"p"}, "Content-Length": {"3"}, "X-Custom": {"z"},
	}
	for _, tc := range []struct {
		name string
		r    *inferencev1.ResolvedRoute
		want http.Header
	}{
		{"openai: bearer, openai passthrough", openaiRoute, http.Header{
			"Authorization": {"Bearer sk-real"}, "Content-Type": {"application/json"}, "Accept": {"text/event-stream"}, "User-Agent": {"curl"},
			"Openai-Organization": {"org"}, "X-Model-Id": {"m"},
		}},
		{"anthropic: x-api-key, version and beta pass", anthRoute, http.Header{
			"X-Api-Key": {"ak-real"}, "Content-Type": {"application/json"}, "Accept": {"text/event-stream"}, "User-Agent": {"curl"},
			"Anthropic-Version": {"2024-01-01"}, "Anthropic-Beta": {"tools"},
		}},
		{"nvidia: x-model-id only", &inferencev1.ResolvedRoute{ProviderType: "nvidia", ApiKey: "nv"}, http.Header{
			"Authorization": {"Bearer nv"}, "Content-Type": {"application/json"}, "Accept": {"text/event-stream"}, "User-Agent": {"curl"}, "X-Model-Id": {"m"},
		}},
		{"vertex claude: bearer, beta and version stripped", vxClaude, http.Header{
			"Authorization": {"Bearer ya29"}, "Content-Type": {"application/json"}, "Accept": {"text/event-stream"}, "User-Agent": {"curl"},
		}},
		{"vertex gemini: no anthropic headers", vxGemini, http.Header{
			"Authorization": {"Bearer ya29"}, "Content-Type": {"application/json"}, "Accept": {"text/event-stream"}, "User-Agent": {"curl"},
		}},
	} {
		if diff := cmp.Diff(tc.want, Headers(tc.r, in)); diff != "" {
			t.Errorf("%s: Headers() (-want +got):\n%s", tc.name, diff)
		}
	}
	// The anthropic default version is added when the client sent none.
	if got := Headers(anthRoute, http.Header{}).Get("Anthropic-Version"); got != "2023-06-01" {
		t.Errorf("anthropic default version = %q, want 2023-06-01", got)
	}
}

func TestBody(t *testing.T) {
	for _, tc := range []struct {
		name, in   string
		r          *inferencev1.ResolvedRoute
		want       map[string]any
		wantStream bool
	}{
		{"model rewritten", `{"model":"anything","messages":[],"stream":true}`, openaiRoute, map[string]any{"model": "gpt-x", "messages": []any{}, "stream": true}, true},
		{"model added", `{"messages":[]}`, anthRoute, map[string]any{"model": "claude-x", "messages": []any{}}, false},
		{"vertex gemini gets publisher model", `{"model":"x"}`, vxGemini, map[string]any{"model": "google/gemini-x"}, false},
		{"vertex rawPredict: model removed, version injected", `{"model":"x","stream":false,"context_management":{}}`, vxClaude, map[string]any{"anthropic_version": VertexAnthropicVersion, "stream": false}, false},
		{"vertex rawPredict: client version kept", `{"anthropic_version":"v9"}`, vxClaude, map[string]any{"anthropic_version": "v9"}, false},
	} {
		out, stream := Body(tc.r, []byte(tc.in))
		var got map[string]any
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if diff := cmp.Diff(tc.want, got); diff != "" || stream != tc.wantStream {
			t.Errorf("%s: Body() stream %v (want %v) (-want +got):\n%s", tc.name, stream, tc.wantStream, diff)
		}
	}
	for _, in := range []string{"", "not json", "[1,2]", "null"} {
		if out, stream := Body(openaiRoute, []byte(in)); string(out) != in || stream {
			t.Errorf("Body(%q) = %q, %v, want unchanged", in, out, stream)
		}
	}
}

func TestTimeoutAndSelect(t *testing.T) {
	if got := Timeout(openaiRoute); got != DefaultTimeout {
		t.Errorf("Timeout(0) = %v", got)
	}
	if got := Timeout(anthRoute); got != 5*time.Second {
		t.Errorf("Timeout(5) = %v", got)
	}
	routes := []*inferencev1.ResolvedRoute{openaiRoute, anthRoute}
	if Select(routes, ProtocolMessages) != anthRoute || Select(routes, ProtocolChatCompletions) != openaiRoute || Select(routes, ProtocolEmbeddings) != nil {
		t.Error("Select picked the wrong route")
	}
}
