// Package pki generates and loads the gateway's key material: a private CA,
// a server certificate, a client certificate for mTLS user authentication,
// and the Ed25519 key pair that signs sandbox JWTs.
//
// Generation is idempotent through Ensure: a Sink that already holds the
// whole bundle is left untouched, a partial bundle is an error naming what is
// missing, and an empty Sink receives a freshly generated bundle. Dir is the
// filesystem Sink (the generate-certs --output-dir layout); other sinks, such
// as Kubernetes Secrets, implement the same interface.
//
// All functions are safe for concurrent use; a Sink is not (callers serialize
// Ensure on one destination).
package pki
