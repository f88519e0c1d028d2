// Package interceptor runs the gateway interceptors: external services
// (openshell.gateway_interceptor.v1.GatewayInterceptor) that may rewrite,
// veto or observe unary openshell.v1.OpenShell calls.
//
// ParseConfigs checks the [[openshell.gateway.interceptors]] tables. Start
// calls Describe on each interceptor (in order, then name), checks every
// declared binding against the compiled descriptors, the interceptable
// allowlist and the operator's binding policy (dynamic, allowlist, exact:
// strict policies compare RPC and phase, never binding ids), and builds an
// immutable plan. Any fault is an error naming the interceptor.
//
// Runtime.UnaryServerInterceptor runs the plan. It must be chained after
// authentication and authorization. For a bound method it shows the request
// as ProtoJSON, secret fields (the openshell.options.v1.secret option)
// omitted at any depth, to the modify_operation bindings, applies each
// binding's JSON Patch list atomically (the candidate is decoded into the
// request type, secrets restored, re-encoded and decoded again; a patch
// that selects a secret field or an object holding one is invalid), then
// to the validate bindings (current_state is always absent), calls the
// handler with the resulting request and, after a success, shows the
// response (secrets omitted) to the post_commit bindings, whose failures
// never change the response. A failed evaluation follows the binding's
// failure policy: fail_open goes on with the pre-binding request,
// fail_closed refuses the call with Unavailable (InvalidArgument for an
// invalid modification) before the handler runs. A denial carries the
// interceptor's status code (default PermissionDenied) and reason.
//
// A manifest that declares provider_profiles makes the interceptor a
// provider profile source (Runtime.ProfileSource); ParseProfileSources and
// ProfileSources turn provider_profile_sources into the providers
// package's ordered source set, refusing unknown or non-capable sources.
//
// A Runtime is safe for concurrent use; Close closes its connections.
package interceptor
