// Package policy holds the gateway's knowledge of sandbox policies: the
// safety rules a policy must pass before it is stored (OpenShell's rules
// and error texts), the rules for changing the policy of a live sandbox,
// and the encoding of policy revisions in the store.
//
// Validation is pure: Validate and ValidateUpdate read their arguments and
// nothing else, and report every violation they find in one
// errdefs.InvalidArgument error. The revision helpers build and decode
// store records; they do not talk to the store themselves.
//
// Enforcement is not decided here. The supervisor decides which sections it
// enforces and reports LOADED or FAILED per revision (see
// internal/supervisor).
package policy
