// Package credentials keeps provider credential values encrypted at rest.
//
// Encryption is an AES-256-GCM envelope: every sealed value gets its own
// random 256-bit data key; the value is encrypted under the data key and
// the data key is wrapped (AES-256-GCM again) under the gateway's
// key-encryption key (KEK). The sealed form records the KEK's id, so a
// later rotation can tell which records still need re-wrapping. Both
// encryptions bind associated data naming the record (provider id and
// credential key), so a sealed value copied onto another record does not
// open.
//
// Rotation: a keyring built WithPrevious keys seals under the new KEK and
// still opens values wrapped under the old ones; Rewrap moves a value's
// data key to the new KEK without touching its ciphertext.
//
// The KEK comes from an environment variable (base64 of 32 bytes), from a
// 0600 file that LoadOrCreateKEK generates on first start, or from a
// Kubernetes Secret (package credentials/k8s). A Keyring is safe for
// concurrent use.
package credentials
