// Package providers is the gateway's provider domain: validation of
// provider records with OpenShell's rules and texts, and the provider
// store, which keeps credential values only in sealed form (see
// internal/credentials) and hands out redacted copies.
//
// A stored provider row (object type "provider") never holds a plaintext
// credential: Provider.credentials is empty and every value lives in
// Provider.credential_handles[key] as {driver "gateway-aes256gcm", handle
// = ciphertext, metadata = {kek_id, wrapped_data_key}}, sealed with the
// associated data "<provider id>/<key>". Values leave the store only
// through Resolve, which refuses expired credentials.
//
// User provider profiles (userprofiles.go) are stored as object type
// "provider_profile" in their scope: workspace "" for platform profiles, a
// workspace's name for its own; a provider's type resolves to a built-in,
// then its workspace's, then a platform profile.
//
// The profile source set (sources.go, provider_profile_sources) is nil by
// default: built-in, then user. Otherwise every profile lookup uses one
// catalog captured from the selected sources in order (CaptureProfiles puts
// it in a request's ctx; each source fetched once), duplicate normalized
// ids across or within sources failing with FailedPrecondition.
//
// Credential refresh (refresh.go) keeps its material in a separate
// "provider_refresh" object, secret material sealed, and mints with
// golang.org/x/oauth2; a rotation swaps value and expiry in one CAS write
// of the provider, a failed one removes the value.
//
// Store is safe for concurrent use; every write is conditional on the
// resource version read (CAS), conflicts are *store.ConflictError
// (Aborted).
package providers
