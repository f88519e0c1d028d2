// Package placeholder resolves provider credential placeholders in the
// requests the sandbox's egress proxy forwards.
//
// The gateway hands the supervisor (and only it, through
// GetSandboxProviderEnvironment with supports_static_credential_bindings)
// each attached provider's credential values, their expiry times and the
// endpoints (host, port, path) of the provider's profile. Agent processes
// see only the placeholder "openshell:resolve:env:<KEY>" (For). When the
// proxy has admitted a request (destination, binary and L7 rules), Resolver
// replaces each placeholder with the value, as OpenShell does, in:
//
//   - header values: the whole value, or a placeholder inside it
//     ("Bearer <placeholder>"); Authorization "Basic <base64>" is decoded,
//     resolved and re-encoded;
//   - query parameter values (percent-decoded, resolved, re-encoded);
//   - URL path segments, also concatenated with other text
//     ("/bot<placeholder>/sendMessage"); a value holding "/", "\", "..",
//     "?", "#" or a control character is refused there;
//   - request bodies of endpoints that opt in (ResolveBody): UTF-8 JSON,
//     form or text bodies of at most MaxBody bytes.
//
// Cookies, response content and other bodies are never rewritten.
//
// Every request is refused (fail closed) when a placeholder in it cannot be
// resolved: a key the sandbox has no credential for, a malformed
// placeholder, an expired credential, a value unfit for its location, a
// placeholder in a cookie, a header name or a query parameter name (500,
// "credential_injection_failed"), or a credential whose provider's
// endpoints do not include the request's host, port and path (403,
// "credential_endpoint_mismatch"). Refusals never name the placeholder, the
// key or the value.
//
// Values live in memory only; a Set never formats its values (String and
// GoString print only the number of credentials). Resolver is safe for
// concurrent use: Install swaps the credential set atomically and every
// request is resolved against one set.
package placeholder
