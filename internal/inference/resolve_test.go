package inference

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	inferencev1 "github.com/openshell-go/openshell/api/openshell/inference/v1"
	"github.com/openshell-go/openshell/internal/errdefs"
)

func vertex(cfg map[string]string) Provider {
	return Provider{Name: "vx", Type: "google-vertex-ai", Config: cfg, Credentials: map[string]string{"GOOGLE_VERTEX_AI_TOKEN": "ya29.tok"}}
}

func TestResolve(t *testing.T) {
	route := Route{Name: RouteLocal, ProviderName: "p", ModelID: "m-1", TimeoutSecs: 30}
	openAIProtocols := []string{"openai_chat_completions", "openai_completions", "openai_responses", "openai_embeddings", "model_discovery"}
	tests := []struct {
		name  string
		model string // "" = route.ModelID
		p     Provider
		want  *inferencev1.ResolvedRoute
	}{
		{
			name: "openai default base url",
			p:    Provider{Name: "p", Type: "openai", Credentials: map[string]string{"OPENAI_API_KEY": "sk-1"}},
			want: &inferencev1.ResolvedRoute{Name: RouteLocal, BaseUrl: "https://api.openai.com/v1", Protocols: openAIProtocols, ApiKey: "sk-1", ModelId: "m-1", ProviderType: "openai", TimeoutSecs: 30},
		},
		{
			name: "openai base url from config, type case-insensitive",
			p:    Provider{Name: "p", Type: "OpenAI", Config: map[string]string{"OPENAI_BASE_URL": " http://127.0.0.1:9/v1 "}, Credentials: map[string]string{"OPENAI_API_KEY": "sk-1"}},
			want: &inferencev1.ResolvedRoute{Name: RouteLocal, BaseUrl: "http://127.0.0.1:9/v1", Protocols: openAIProtocols, ApiKey: "sk-1", ModelId: "m-1", ProviderType: "openai", TimeoutSecs: 30},
		},
		{
			name: "openai falls back to any credential in key order",
			p:    Provider{Name: "p", Type: "openai", Credentials: map[string]string{"Z_KEY": "z", "B_KEY": "b", "A_KEY": " "}},
			want: &inferencev1.ResolvedRoute{Name: RouteLocal, BaseUrl: "https://api.openai.com/v1", Protocols: openAIProtocols, ApiKey: "b", ModelId: "m-1", ProviderType: "openai", TimeoutSecs: 30},
		},
		{
			name: "anthropic",
			p:    Provider{Name: "p", Type: "anthropic", Credentials: map[string]string{"ANTHROPIC_API_KEY": "ak"}},
			want: &inferencev1.ResolvedRoute{Name: RouteLocal, BaseUrl: "https://api.anthropic.com/v1", Protocols: []string{"anthropic_messages", "model_discovery"}, ApiKey: "ak", ModelId: "m-1", ProviderType: "anthropic", TimeoutSecs: 30},
		},
		{
			name: "anthropic base url override",
			p:    Provider{Name: "p", Type: "anthropic", Config: map[string]string{"ANTHROPIC_BASE_URL": "http://fake/v1"}, Credentials: map[string]string{"ANTHROPIC_API_KEY": "ak"}},
			want: &inferencev1.ResolvedRoute{Name: RouteLocal, BaseUrl: "http://fake/v1", Protocols: []string{"anthropic_messages", "model_discovery"}, ApiKey: "ak", ModelId: "m-1", ProviderType: "anthropic", TimeoutSecs: 30},
		},
		{
			name: "nvidia",
			p:    Provider{Name: "p", Type: "nvidia", Credentials: map[string]string{"NVIDIA_API_KEY": "nv"}},
			want: &inferencev1.ResolvedRoute{Name: RouteLocal, BaseUrl: "https://integrate.api.nvidia.com/v1", Protocols: openAIProtocols, ApiKey: "nv", ModelId: "m-1", ProviderType: "nvidia", TimeoutSecs: 30},
		},
		{
			name: "deepinfra",
			p:    Provider{Name: "p", Type: "deepinfra", Config: map[string]string{"DEEPINFRA_BASE_URL": ""}, Credentials: map[string]string{"DEEPINFRA_API_KEY": "di"}},
			want: &inferencev1.ResolvedRoute{Name: RouteLocal, BaseUrl: "https://api.deepinfra.com/v1/openai", Protocols: openAIProtocols, ApiKey: "di", ModelId: "m-1", ProviderType: "deepinfra", TimeoutSecs: 30},
		},
		{
			name:  "vertex claude: rawPredict, model in path, region host",
			model: "claude-sonnet-4@20250514",
			p:     vertex(map[string]string{"VERTEX_AI_PROJECT_ID": "my-project", "VERTEX_AI_REGION": "europe-west4"}),
			want: &inferencev1.ResolvedRoute{Name: RouteLocal, BaseUrl: "https://europe-west4-aiplatform.googleapis.com/v1/projects/my-project/locations/europe-west4/publishers/anthropic/models",
				Protocols: []string{"anthropic_messages"}, ApiKey: "ya29.tok", ModelId: "claude-sonnet-4@20250514", ProviderType: "google-vertex-ai", TimeoutSecs: 30,
				ModelInPath: true, RequestPathOverride: proto.String(":rawPredict")},
		},
		{
			name:  "vertex default region us-central1",
			model: "claude-x",
			p:     vertex(map[string]string{"VERTEX_AI_PROJECT_ID": "my-project"}),
			want: &inferencev1.ResolvedRoute{Name: RouteLocal, BaseUrl: "https://us-central1-aiplatform.googleapis.com/v1/projects/my-project/locations/us-central1/publishers/anthropic/models",
				Protocols: []string{"anthropic_messages"}, ApiKey: "ya29.tok", ModelId: "claude-x", ProviderType: "google-vertex-ai", TimeoutSecs: 30,
				ModelInPath: true, RequestPathOverride: proto.String(":rawPredict")},
		},
		{
			name:  "vertex global region",
			model: "gemini-2.5-flash",
			p:     vertex(map[string]string{"VERTEX_AI_PROJECT_ID": "my-project", "VERTEX_AI_REGION": "global"}),
			want: &inferencev1.ResolvedRoute{Name: RouteLocal, BaseUrl: "https://aiplatform.googleapis.com/v1beta1/projects/my-project/locations/global/endpoints/openapi",
				Protocols: []string{"openai_chat_completions"}, ApiKey: "ya29.tok", ModelId: "google/gemini-2.5-flash", ProviderType: "google-vertex-ai", TimeoutSecs: 30,
				RequestPathOverride: proto.String("/chat/completions")},
		},
		{
			name:  "vertex us multi-region",
			model: "llama-4",
			p:     vertex(map[string]string{"VERTEX_AI_PROJECT_ID": "my-project", "VERTEX_AI_REGION": "US"}),
			want: &inferencev1.ResolvedRoute{Name: RouteLocal, BaseUrl: "https://aiplatform.us.rep.googleapis.com/v1beta1/projects/my-project/locations/us/endpoints/openapi",
				Protocols: []string{"openai_chat_completions"}, ApiKey: "ya29.tok", ModelId: "meta/llama-4", ProviderType: "google-vertex-ai", TimeoutSecs: 30,
				RequestPathOverride: proto.String("/chat/completions")},
		},
		{
			name:  "vertex eu multi-region, alias type",
			model: "claude-opus",
			p:     Provider{Name: "vx", Type: "vertex", Config: map[string]string{"VERTEX_AI_PROJECT_ID": "my-project", "VERTEX_AI_REGION": "eu"}, Credentials: map[string]string{"VERTEX_AI_TOKEN": "ya29.b"}},
			want: &inferencev1.ResolvedRoute{Name: RouteLocal, BaseUrl: "https://aiplatform.eu.rep.googleapis.com/v1/projects/my-project/locations/eu/publishers/anthropic/models",
				Protocols: []string{"anthropic_messages"}, ApiKey: "ya29.b", ModelId: "claude-opus", ProviderType: "google-vertex-ai", TimeoutSecs: 30,
				ModelInPath: true, RequestPathOverride: proto.String(":rawPredict")},
		},
		{
			name:  "vertex unknown model: bare id on openai-compatible surface",
			model: "my-tuned-model",
			p:     vertex(map[string]string{"VERTEX_AI_PROJECT_ID": "my-project"}),
			want: &inferencev1.ResolvedRoute{Name: RouteLocal, BaseUrl: "https://us-central1-aiplatform.googleapis.com/v1beta1/projects/my-project/locations/us-central1/endpoints/openapi",
				Protocols: []string{"openai_chat_completions"}, ApiKey: "ya29.tok", ModelId: "my-tuned-model", ProviderType: "google-vertex-ai", TimeoutSecs: 30,
				RequestPathOverride: proto.String("/chat/completions")},
		},
		{
			name:  "vertex explicit publisher anthropic forces rawPredict",
			model: "my-claude",
			p:     vertex(map[string]string{"VERTEX_AI_PROJECT_ID": "my-project", "VERTEX_AI_PUBLISHER": "Anthropic"}),
			want: &inferencev1.ResolvedRoute{Name: RouteLocal, BaseUrl: "https://us-central1-aiplatform.googleapis.com/v1/projects/my-project/locations/us-central1/publishers/anthropic/models",
				Protocols: []string{"anthropic_messages"}, ApiKey: "ya29.tok", ModelId: "my-claude", ProviderType: "google-vertex-ai", TimeoutSecs: 30,
				ModelInPath: true, RequestPathOverride: proto.String(":rawPredict")},
		},
		{
			name:  "vertex explicit non-anthropic publisher overrides inference",
			model: "claude-lookalike",
			p:     vertex(map[string]string{"VERTEX_AI_PROJECT_ID": "my-project", "VERTEX_AI_PUBLISHER": "google"}),
			want: &inferencev1.ResolvedRoute{Name: RouteLocal, BaseUrl: "https://us-central1-aiplatform.googleapis.com/v1beta1/projects/my-project/locations/us-central1/endpoints/openapi",
				Protocols: []string{"openai_chat_completions"}, ApiKey: "ya29.tok", ModelId: "google/claude-lookalike", ProviderType: "google-vertex-ai", TimeoutSecs: 30,
				RequestPathOverride: proto.String("/chat/completions")},
		},
		{
			name:  "vertex base url override (google key wins), no project needed",
			model: "gemini-pro",
			p: vertex(map[string]string{
				"GOOGLE_VERTEX_AI_BASE_URL": "https://aiplatform.googleapis.com/v1beta1/projects/x/locations/global/endpoints/openapi",
				"VERTEX_AI_BASE_URL":        "https://us-east1-aiplatform.googleapis.com/other",
			}),
			want: &inferencev1.ResolvedRoute{Name: RouteLocal, BaseUrl: "https://aiplatform.googleapis.com/v1beta1/projects/x/locations/global/endpoints/openapi",
				Protocols: []string{"openai_chat_completions"}, ApiKey: "ya29.tok", ModelId: "google/gemini-pro", ProviderType: "google-vertex-ai", TimeoutSecs: 30,
				RequestPathOverride: proto.String("/chat/completions")},
		},
		{
			name:  "vertex legacy base url key, regional host with port 443",
			model: "mistral-large",
			p:     vertex(map[string]string{"VERTEX_AI_BASE_URL": "https://us-east1-aiplatform.googleapis.com:443/v1beta1/x"}),
			want: &inferencev1.ResolvedRoute{Name: RouteLocal, BaseUrl: "https://us-east1-aiplatform.googleapis.com:443/v1beta1/x",
				Protocols: []string{"openai_chat_completions"}, ApiKey: "ya29.tok", ModelId: "mistralai/mistral-large", ProviderType: "google-vertex-ai", TimeoutSecs: 30,
				RequestPathOverride: proto.String("/chat/completions")},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := route
			if tc.model != "" {
				r.ModelID = tc.model
			}
			got, err := Resolve(r, tc.p)
			if err != nil {
				t.Fatalf("Resolve() error = %v", err)
			}
			if diff := cmp.Diff(tc.want, got, protocmp.Transform()); diff != "" {
				t.Errorf("Resolve() (-want +got):\n%s", diff)
			}
		})
	}
}

func TestResolveErrors(t *testing.T) {
	proj := map[string]string{"VERTEX_AI_PROJECT_ID": "my-project"}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	tests := []struct {
		name  string
		model string
		p     Provider
		code  codes.Code
		msg   string
	}{
		{"unsupported type", "m", Provider{Name: "gh", Type: "github", Credentials: map[string]string{"T": "secret-value-1"}}, codes.InvalidArgument, "provider 'gh' has unsupported type 'github' for cluster inference (supported: openai, anthropic, nvidia, deepinfra, google-vertex-ai)"},
		{"aws-bedrock unsupported", "m", Provider{Name: "b", Type: "aws-bedrock", Credentials: map[string]string{"T": "secret-value-1"}}, codes.InvalidArgument, "unsupported type 'aws-bedrock'"},
		{"no credential", "m", Provider{Name: "p", Type: "openai", Credentials: map[string]string{"OPENAI_API_KEY": " "}}, codes.InvalidArgument, "provider 'p' has no usable API key credential"},
		{"vertex ignores refresh material", "claude-x", Provider{Name: "vx", Type: "google-vertex-ai", Config: proj, Credentials: map[string]string{"GOOGLE_SERVICE_ACCOUNT_KEY": "{json}"}}, codes.InvalidArgument, "provider 'vx' has no usable API key credential"},
		{"vertex missing project", "claude-x", vertex(nil), codes.FailedPrecondition, "Vertex AI provider requires VERTEX_AI_PROJECT_ID config"},
		{"vertex blank project", "claude-x", vertex(with("VERTEX_AI_PROJECT_ID", "  ")), codes.FailedPrecondition, "requires VERTEX_AI_PROJECT_ID"},
		{"vertex bad project", "claude-x", vertex(with("VERTEX_AI_PROJECT_ID", "Bad_Project")), codes.InvalidArgument, "VERTEX_AI_PROJECT_ID has invalid format"},
		{"vertex bad region", "claude-x", vertex(with("VERTEX_AI_PROJECT_ID", "my-project", "VERTEX_AI_REGION", "moon")), codes.InvalidArgument, "VERTEX_AI_REGION has invalid format"},
		{"vertex model with slash", "a/b", vertex(proj), codes.InvalidArgument, "must not contain path separators"},
		{"vertex model traversal", "a..b", vertex(proj), codes.InvalidArgument, "traversal segments"},
		{"vertex model query", "a?b", vertex(proj), codes.InvalidArgument, "URL delimiters"},
		{"vertex model whitespace", " claude", vertex(proj), codes.InvalidArgument, "leading or trailing whitespace"},
		{"vertex model control", "cl\x01aude", vertex(proj), codes.InvalidArgument, "control characters"},
		{"vertex override for anthropic", "claude-x", vertex(with("VERTEX_AI_BASE_URL", "https://aiplatform.googleapis.com/x")), codes.InvalidArgument, "not supported for Anthropic models"},
		{"vertex override http", "gemini-x", vertex(with("VERTEX_AI_BASE_URL", "http://aiplatform.googleapis.com/x")), codes.InvalidArgument, "must use https"},
		{"vertex override foreign host", "gemini-x", vertex(with("VERTEX_AI_BASE_URL", "https://evil.example.com/x")), codes.InvalidArgument, "official Vertex AI hostname"},
		{"vertex override lookalike host", "gemini-x", vertex(with("VERTEX_AI_BASE_URL", "https://aiplatform.googleapis.com.evil.example/x")), codes.InvalidArgument, "official Vertex AI hostname"},
		{"vertex override ip", "gemini-x", vertex(with("VERTEX_AI_BASE_URL", "https://10.0.0.1/x")), codes.InvalidArgument, "IP literal"},
		{"vertex override userinfo", "gemini-x", vertex(with("VERTEX_AI_BASE_URL", "https://u:p@aiplatform.googleapis.com/x")), codes.InvalidArgument, "userinfo"},
		{"vertex override port", "gemini-x", vertex(with("VERTEX_AI_BASE_URL", "https://aiplatform.googleapis.com:8443/x")), codes.InvalidArgument, "port 443"},
		{"vertex override query", "gemini-x", vertex(with("VERTEX_AI_BASE_URL", "https://aiplatform.googleapis.com/x?a=b")), codes.InvalidArgument, "query or fragment"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Resolve(Route{Name: RouteLocal, ModelID: tc.model}, tc.p)
			if got := errdefs.Code(err); got != tc.code || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("Resolve() error = %v (%v), want %v containing %q", err, got, tc.code, tc.msg)
			}
			for _, v := range tc.p.Credentials {
				if strings.TrimSpace(v) != "" && strings.Contains(err.Error(), v) {
					t.Errorf("error %q names a credential value", err)
				}
			}
		})
	}
}

func TestVertexHost(t *testing.T) {
	for _, tc := range []struct{ region, loc, host string }{
		{"global", "global", "aiplatform.googleapis.com"},
		{"us", "us", "aiplatform.us.rep.googleapis.com"},
		{"eu", "eu", "aiplatform.eu.rep.googleapis.com"},
		{"us-central1", "us-central1", "us-central1-aiplatform.googleapis.com"},
		{" Europe-West4 ", "europe-west4", "europe-west4-aiplatform.googleapis.com"},
	} {
		loc, host := VertexHost(tc.region)
		if loc != tc.loc || host != tc.host {
			t.Errorf("VertexHost(%q) = %q, %q, want %q, %q", tc.region, loc, host, tc.loc, tc.host)
		}
	}
}

func TestVertexPublisher(t *testing.T) {
	for model, want := range map[string]string{
		"claude-3-5-sonnet@20241022": "anthropic", "gemini-2.5-pro": "google", "text-bison-001": "google", "chat-bison-1": "google",
		"llama-3": "meta", "mistral-large": "mistralai", "codestral-1": "mistralai", "jamba-1.5": "ai21", "deepseek-r1": "deepseek",
		"gpt-4o": "", "claude": "",
	} {
		if got := VertexPublisher(model); got != want {
			t.Errorf("VertexPublisher(%q) = %q, want %q", model, got, want)
		}
	}
}

func TestNormalizeType(t *testing.T) {
	for in, want := range map[string]string{
		"openai": "openai", " Anthropic ": "anthropic", "NVIDIA": "nvidia", "deepinfra": "deepinfra",
		"google-vertex-ai": "google-vertex-ai", "vertex": "google-vertex-ai", "vertex-ai": "google-vertex-ai",
		"google-vertex": "google-vertex-ai", "gcp-vertex": "google-vertex-ai", "github": "", "aws-bedrock": "",
	} {
		got, ok := NormalizeType(in)
		if got != want || ok != (want != "") {
			t.Errorf("NormalizeType(%q) = %q, %v, want %q", in, got, ok, want)
		}
	}
}

func TestRouteName(t *testing.T) {
	for in, want := range map[string]string{"": RouteLocal, " inference.local ": RouteLocal, "sandbox-system": RouteSystem} {
		if got, err := RouteName(in); err != nil || got != want {
			t.Errorf("RouteName(%q) = %q, %v, want %q", in, got, err, want)
		}
	}
	if _, err := RouteName("other"); errdefs.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "unknown route_name 'other'") {
		t.Errorf("RouteName(other) error = %v", err)
	}
}
