// Package policy holds the gateway's knowledge of sandbox policies: the
// safety rules a policy must pass before it is stored (OpenShell's rules
// and error texts), the rules for changing the policy of a live sandbox,
// the encoding of policy revisions in the store, and the revision
// workflows over the store: History (a sandbox's own revisions) and Global
// (the gateway-wide policy that overrides them while it is set).
//
// Validation is pure: Validate and ValidateUpdate read their arguments and
// nothing else, and report every violation they find in one
// errdefs.InvalidArgument error. The record helpers (NewRecord,
// DecodeRecord, …) build and decode store records without touching the
// store; History and Global read and write it. History.Apply is the one
// write path of a sandbox's own policy: a compare-and-swap on the newest
// revision that re-applies the change after a concurrent write.
//
// Merge applies UpdateConfig merge operations to a policy, Covers tells
// whether a policy already grants a rule; both are pure. Subpackage
// advisor is the policy advisor (draft chunks from observed denials).
//
// Enforcement is not decided here. The supervisor decides which sections it
// enforces and reports LOADED or FAILED per revision (see
// internal/supervisor).
package policy
