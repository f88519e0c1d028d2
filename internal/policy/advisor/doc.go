// Package advisor is the gateway side of the policy advisor: it turns the
// denials a sandbox's supervisor observed (SubmitPolicyAnalysis) into
// draft policy chunks, one narrow network rule each, and turns a
// reviewer's decisions on them (approve, reject, edit, undo, clear) into
// policy revisions of that sandbox through policy.History, the one write
// path of sandbox policies; the running supervisor picks a revision up
// with its policy poll.
//
// Chunks proposed from observed denials (analysis_mode "mechanistic") are
// deduplicated by (host, port, binary): a repeat adds its count to the
// chunk's hit_count. Each chunk carries the prover's verdict on what the
// rule would add (validation_result, with OpenShell's categories
// link_local_reach, l7_bypass_credentialed, credential_reach_expansion and
// capability_expansion), advisory security notes, and a review token that
// binds an approval to the policy the reviewer saw. A chunk with findings
// or notes is never approved without a reviewer, whatever
// proposal_approval_mode says.
//
// See docs/policy.md ("Policy advisor") for what is and is not done.
package advisor
