package inference

import "strings"

// Protocols a route can serve (OpenShell's names).
const (
	ProtocolChatCompletions = "openai_chat_completions"
	ProtocolCompletions     = "openai_completions"
	ProtocolResponses       = "openai_responses"
	ProtocolEmbeddings      = "openai_embeddings"
	ProtocolModelDiscovery  = "model_discovery"
	ProtocolMessages        = "anthropic_messages"
)

// Canonical provider types supported for inference routes.
const (
	TypeOpenAI    = "openai"
	TypeAnthropic = "anthropic"
	TypeNVIDIA    = "nvidia"
	TypeDeepInfra = "deepinfra"
	TypeVertex    = "google-vertex-ai"
)

// SupportedTypes lists the canonical types, as error texts name them.
const SupportedTypes = "openai, anthropic, nvidia, deepinfra, google-vertex-ai"

// AuthStyle is how the router presents a route's credential upstream.
type AuthStyle int

const (
	// AuthBearer sends "Authorization: Bearer <key>".
	AuthBearer AuthStyle = iota
	// AuthHeader sends the key in the profile's AuthHeader field.
	AuthHeader
)

// Profile is the inference profile of one provider type.
type Profile struct {
	Type              string
	DefaultBaseURL    string // "" when the type has none (Vertex)
	Protocols         []string
	CredentialKeys    []string // preferred credential keys, in order
	BaseURLConfigKeys []string // config keys overriding the base URL, in order
	Auth              AuthStyle
	AuthHeader        string      // with AuthHeader
	DefaultHeaders    [][2]string // sent unless the client sent the header
	Passthrough       []string    // client headers forwarded (lowercase)
}

var openAIProtocols = []string{ProtocolChatCompletions, ProtocolCompletions, ProtocolResponses, ProtocolEmbeddings, ProtocolModelDiscovery}

// Vertex credential keys: minted access tokens only, never the service
// account JSON kept for refresh.
var vertexCredentialKeys = []string{
	"GOOGLE_VERTEX_AI_SERVICE_ACCOUNT_TOKEN", "VERTEX_AI_SERVICE_ACCOUNT_TOKEN", "GOOGLE_VERTEX_AI_TOKEN", "VERTEX_AI_TOKEN",
}

// Vertex config keys.
const (
	VertexProjectKey    = "VERTEX_AI_PROJECT_ID"
	VertexRegionKey     = "VERTEX_AI_REGION"
	VertexPublisherKey  = "VERTEX_AI_PUBLISHER"
	vertexDefaultRegion = "us-central1"
	// VertexAnthropicVersion is injected into rawPredict bodies.
	VertexAnthropicVersion = "vertex-2023-10-16"
)

var profiles = map[string]*Profile{
	TypeOpenAI: {
		Type: TypeOpenAI, DefaultBaseURL: "https://api.openai.com/v1", Protocols: openAIProtocols,
		CredentialKeys: []string{"OPENAI_API_KEY"}, BaseURLConfigKeys: []string{"OPENAI_BASE_URL"},
		Auth: AuthBearer, Passthrough: []string{"openai-organization", "x-model-id"},
	},
	TypeAnthropic: {
		Type: TypeAnthropic, DefaultBaseURL: "https://api.anthropic.com/v1", Protocols: []string{ProtocolMessages, ProtocolModelDiscovery},
		CredentialKeys: []string{"ANTHROPIC_API_KEY"}, BaseURLConfigKeys: []string{"ANTHROPIC_BASE_URL"},
		Auth: AuthHeader, AuthHeader: "x-api-key", DefaultHeaders: [][2]string{{"anthropic-version", "2023-06-01"}},
		Passthrough: []string{"anthropic-version", "anthropic-beta"},
	},
	TypeNVIDIA: {
		Type: TypeNVIDIA, DefaultBaseURL: "https://integrate.api.nvidia.com/v1", Protocols: openAIProtocols,
		CredentialKeys: []string{"NVIDIA_API_KEY"}, BaseURLConfigKeys: []string{"NVIDIA_BASE_URL"},
		Auth: AuthBearer, Passthrough: []string{"x-model-id"},
	},
	TypeDeepInfra: {
		Type: TypeDeepInfra, DefaultBaseURL: "https://api.deepinfra.com/v1/openai", Protocols: openAIProtocols,
		CredentialKeys: []string{"DEEPINFRA_API_KEY"}, BaseURLConfigKeys: []string{"DEEPINFRA_BASE_URL"},
		Auth: AuthBearer, Passthrough: []string{"x-model-id"},
	},
	TypeVertex: {
		Type: TypeVertex, Protocols: []string{ProtocolMessages, ProtocolModelDiscovery},
		CredentialKeys: vertexCredentialKeys, BaseURLConfigKeys: []string{"GOOGLE_VERTEX_AI_BASE_URL", "VERTEX_AI_BASE_URL"},
		Auth: AuthBearer,
	},
}

// NormalizeType returns the canonical inference provider type of s
// (case-insensitive; the Vertex aliases vertex, vertex-ai, google-vertex
// and gcp-vertex included), or false when s is not supported.
func NormalizeType(s string) (string, bool) {
	switch t := strings.ToLower(strings.TrimSpace(s)); t {
	case TypeOpenAI, TypeAnthropic, TypeNVIDIA, TypeDeepInfra:
		return t, true
	case TypeVertex, "vertex", "vertex-ai", "google-vertex", "gcp-vertex":
		return TypeVertex, true
	}
	return "", false
}

// ProfileFor returns the profile of provider type t (any accepted
// spelling).
func ProfileFor(t string) (*Profile, bool) {
	c, ok := NormalizeType(t)
	if !ok {
		return nil, false
	}
	return profiles[c], true
}
