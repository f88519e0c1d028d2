// Package inference is the pure part of inference routing, shared by the
// gateway and the sandbox supervisor: no I/O, no clock, no store.
//
// Gateway side: Resolve turns a cluster inference route (provider name,
// model id, timeout) and the provider it names (type, config, plaintext
// credentials) into the openshell.inference.v1.ResolvedRoute a supervisor
// receives from GetInferenceBundle, with OpenShell's rules: the provider
// profiles of the supported types (openai, anthropic, nvidia, deepinfra,
// google-vertex-ai), base-URL config keys, credential key preference, and
// the Google Vertex AI shaping (host by region, publisher inference,
// Anthropic rawPredict with the model in the path, OpenAI-compatible
// endpoints/openapi otherwise, override rules).
//
// Sandbox side: Match classifies an agent's request to inference.local by
// method and path into a protocol; Upstream builds the upstream request
// (URL, credential injection in the route's auth style, header allowlist,
// model rewrite and Vertex body adaptation) from a ResolvedRoute.
//
// Errors wrap internal/errdefs kinds and never carry credential values.
package inference
