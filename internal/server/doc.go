// Package server is the gateway's network front: one TCP port carrying
// gRPC and HTTP (TLS sniffed on the first bytes, gRPC told from HTTP by the
// content-type of the first request), the interceptors every RPC passes
// (request id, panic recovery, authentication and authorization, rate
// limit, metrics, error conversion, access log, the OpenTelemetry server
// span when Options.TracerProvider is set, the security event when
// Options.SecurityEvents is set), the gRPC services and the
// HTTP routes (/healthz, /readyz, /metrics, /.well-known/jwks.json,
// /.well-known/openid-configuration).
//
// Handlers of the OpenShell service live in this package as methods of
// OpenShellService, one file per area (openshell.go, sandbox.go, ...);
// their dependencies travel in Deps. Handlers return errdefs errors; the
// interceptor converts them to gRPC status once.
package server
