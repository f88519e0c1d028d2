package cli

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/policy/policyfile"
)

// The rule commands are OpenShell's (hidden there too, alias rl): the policy
// advisor's draft network rules of a sandbox, over GetDraftPolicy,
// ApproveDraftChunk, RejectDraftChunk, ApproveAllDraftChunks,
// ClearDraftChunks and GetDraftHistory. 'rule edit' and 'rule undo' (over
// EditDraftChunk and UndoDraftChunk) are this CLI's additions; OpenShell's
// CLI does not offer them.

func (a *app) newRuleCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "rule",
		Aliases: []string{"rl"},
		Hidden:  true,
		Short:   "Manage network rules for a sandbox",
		Long: `Review the network rules the policy advisor drafted for a sandbox from the
connections its egress proxy denied: approve one (it becomes part of the
sandbox's policy as a new revision, loaded without a restart), reject it,
edit it, undo an approval, or clear the pending ones.`,
		Example: `  openshell rule get my-sandbox --status pending
  openshell rule approve my-sandbox --chunk-id CHUNK
  openshell rule reject my-sandbox --chunk-id CHUNK --reason "too broad"
  openshell rule approve-all my-sandbox
  openshell rule history my-sandbox`,
		RunE: groupRunE,
	}
	cmd.AddCommand(a.newRuleGetCmd(), a.newRuleApproveCmd(), a.newRuleRejectCmd(), a.newRuleApproveAllCmd(),
		a.newRuleEditCmd(), a.newRuleUndoCmd(), a.newRuleClearCmd(), a.newRuleHistoryCmd())
	return cmd
}

// ruleCmd builds a rule subcommand taking the sandbox NAME.
func (a *app) ruleCmd(use, short, long string, run func(cmd *cobra.Command, c openshellv1.OpenShellClient, name string) error) *cobra.Command {
	return &cobra.Command{
		Use:               use,
		Short:             short,
		Long:              long,
		Args:              argsUsage(cobra.ExactArgs(1)),
		ValidArgsFunction: a.completeSandboxes,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.gateway()
			if err != nil {
				return err
			}
			return run(cmd, c, args[0])
		},
	}
}

// chunkIDFlag adds the required --chunk-id flag, completed with the
// sandbox's chunks.
func (a *app) chunkIDFlag(cmd *cobra.Command, dst *string, usage string) {
	cmd.Flags().StringVar(dst, "chunk-id", "", usage)
	_ = cmd.RegisterFlagCompletionFunc("chunk-id", func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) != 1 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return a.completeNames(cmd, toComplete, func(c openshellv1.OpenShellClient) ([]string, error) {
			resp, err := c.GetDraftPolicy(cmd.Context(), &openshellv1.GetDraftPolicyRequest{Name: args[0], Workspace: a.ws()})
			var out []string
			for _, ch := range resp.GetChunks() {
				out = append(out, ch.GetId())
			}
			return out, err
		})
	})
}

func chunkWhat(id string) string { return fmt.Sprintf("draft chunk '%s'", id) }

func needChunkID(id string) error {
	if id == "" {
		return usagef("--chunk-id is required ('openshell rule get NAME' lists the chunks)")
	}
	return nil
}

func (a *app) drafts(ctx context.Context, c openshellv1.OpenShellClient, name, status string) (*openshellv1.GetDraftPolicyResponse, error) {
	resp, err := c.GetDraftPolicy(ctx, &openshellv1.GetDraftPolicyRequest{Name: name, StatusFilter: status, Workspace: a.ws()})
	if err != nil {
		return nil, a.rpcError(err, sandboxWhat(name))
	}
	return resp, nil
}

func (a *app) newRuleGetCmd() *cobra.Command {
	var status string
	cmd := a.ruleCmd("get NAME", "Show network rules for a sandbox",
		`Show the draft network rules of sandbox NAME: each chunk's id, status
(pending, approved, rejected), rule, binary, rationale, security notes, the
prover's findings, an application error if the rule cannot be merged, its
endpoints and binaries, and how often the denial was seen. -o json|yaml
prints the GetDraftPolicy response (with review tokens and the candidate
policies).`,
		func(cmd *cobra.Command, c openshellv1.OpenShellClient, name string) error {
			resp, err := a.drafts(cmd.Context(), c, name, status)
			if err != nil {
				return err
			}
			if a.structured() {
				return a.printProto(resp)
			}
			return a.printChunks(name, resp)
		})
	cmd.Aliases = []string{"list"}
	cmd.Flags().StringVar(&status, "status", "", "show only chunks of this status: pending, approved or rejected")
	_ = cmd.RegisterFlagCompletionFunc("status", cobra.FixedCompletions([]string{"pending", "approved", "rejected"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

func (a *app) printChunks(name string, resp *openshellv1.GetDraftPolicyResponse) error {
	w := a.stdout
	chunks := resp.GetChunks()
	if len(chunks) == 0 {
		_, _ = fmt.Fprintf(w, "No network rules for sandbox '%s'\n", name)
		return nil
	}
	plural := "s"
	if len(chunks) == 1 {
		plural = ""
	}
	_, _ = fmt.Fprintf(w, "Network Rules:  (version %d, %d chunk%s)\n\n", resp.GetDraftVersion(), len(chunks), plural)
	for _, ch := range chunks {
		line := func(k, v string) { _, _ = fmt.Fprintf(w, "  %s %s\n", k, v) }
		line("Chunk:", ch.GetId())
		line("Status:", ch.GetStatus())
		line("Rule:", ch.GetRuleName())
		if ch.GetBinary() != "" {
			line("Binary:", ch.GetBinary())
		}
		line("Confidence:", fmt.Sprintf("%.0f%%", ch.GetConfidence()*100))
		line("Rationale:", ch.GetRationale())
		if ch.GetSecurityNotes() != "" {
			line("Security:", ch.GetSecurityNotes())
		}
		if ch.GetValidationResult() != "" {
			line("Prover:", ch.GetValidationResult())
		}
		if ch.GetApplicationError() != "" {
			line("Application:", ch.GetApplicationError())
		}
		if ch.GetRejectionReason() != "" {
			line("Reason:", ch.GetRejectionReason())
		}
		if h := ch.GetCandidateEffectivePolicyHash(); h != "" {
			line("Candidate:", shortHash(h))
		}
		if r := ch.GetProposedRule(); r != nil {
			line("Endpoints:", formatEndpoints(r))
			if len(r.GetBinaries()) > 0 {
				var bins []string
				for _, b := range r.GetBinaries() {
					bins = append(bins, b.GetPath())
				}
				line("Binaries:", strings.Join(bins, ", "))
			}
		}
		if ch.GetHitCount() > 1 {
			line("Hits:", fmt.Sprintf("%d (first seen %s, last seen %s)", ch.GetHitCount(), formatMs(ch.GetFirstSeenMs()), formatMs(ch.GetLastSeenMs())))
		}
		_, _ = fmt.Fprintln(w)
	}
	return nil
}

// formatEndpoints renders a rule's endpoints as "host:port [layer, access,
// allow M P, deny M P]", so L4 reach reads apart from an L7 grant.
func formatEndpoints(r *sandboxv1.NetworkPolicyRule) string {
	var out []string
	for _, e := range r.GetEndpoints() {
		hostPort := e.GetHost()
		if e.GetPort() > 0 {
			hostPort = fmt.Sprintf("%s:%d", e.GetHost(), e.GetPort())
		}
		layer := e.GetProtocol()
		switch {
		case strings.EqualFold(layer, "rest"):
			layer = "L7 rest"
		case layer == "":
			layer = "L4"
		}
		tags := []string{layer}
		if e.GetAccess() != "" {
			tags = append(tags, "access="+e.GetAccess())
		}
		for _, rule := range e.GetRules() {
			tags = append(tags, fmt.Sprintf("allow %s %s", orStar(rule.GetAllow().GetMethod()), orStar(rule.GetAllow().GetPath())))
		}
		for _, d := range e.GetDenyRules() {
			tags = append(tags, fmt.Sprintf("deny %s %s", orStar(d.GetMethod()), orStar(d.GetPath())))
		}
		out = append(out, fmt.Sprintf("%s [%s]", hostPort, strings.Join(tags, ", ")))
	}
	return strings.Join(out, ", ")
}

func orStar(s string) string {
	if s == "" {
		return "*"
	}
	return s
}

func (a *app) newRuleApproveCmd() *cobra.Command {
	var id string
	cmd := a.ruleCmd("approve NAME --chunk-id ID", "Approve a network rule",
		`Approve chunk ID: its rule is added to the sandbox's policy as a new
revision, which the running sandbox loads. The approval carries the chunk's
current review token, fetched first; if the policy changed since the chunk was
evaluated the gateway refreshes it and asks for a new review ('rule get' again).`,
		func(cmd *cobra.Command, c openshellv1.OpenShellClient, name string) error {
			if err := needChunkID(id); err != nil {
				return err
			}
			resp, err := a.drafts(cmd.Context(), c, name, "")
			if err != nil {
				return err
			}
			var token string
			found := false
			for _, ch := range resp.GetChunks() {
				if ch.GetId() == id {
					token, found = ch.GetReviewToken(), true
				}
			}
			if !found {
				return &userError{msg: fmt.Sprintf("%s not found in sandbox %q", chunkWhat(id), name)}
			}
			out, err := c.ApproveDraftChunk(cmd.Context(), &openshellv1.ApproveDraftChunkRequest{Name: name, ChunkId: id, ReviewToken: token, Workspace: a.ws()})
			if err != nil {
				return a.objectError(err, name, chunkWhat(id))
			}
			_, _ = fmt.Fprintf(a.stdout, "Chunk approved. Policy version: %d, hash: %s\n", out.GetPolicyVersion(), shortHash(out.GetPolicyHash()))
			return nil
		})
	a.chunkIDFlag(cmd, &id, "chunk to approve (required)")
	return cmd
}

func (a *app) newRuleRejectCmd() *cobra.Command {
	var id, reason string
	cmd := a.ruleCmd("reject NAME --chunk-id ID", "Reject a network rule",
		`Reject chunk ID, with an optional reason kept on the chunk. Rejecting an
approved chunk takes its binary out of the rule again (a new revision).`,
		func(cmd *cobra.Command, c openshellv1.OpenShellClient, name string) error {
			if err := needChunkID(id); err != nil {
				return err
			}
			if _, err := c.RejectDraftChunk(cmd.Context(), &openshellv1.RejectDraftChunkRequest{Name: name, ChunkId: id, Reason: reason, Workspace: a.ws()}); err != nil {
				return a.objectError(err, name, chunkWhat(id))
			}
			_, _ = fmt.Fprintln(a.stdout, "Chunk rejected.")
			return nil
		})
	a.chunkIDFlag(cmd, &id, "chunk to reject (required)")
	cmd.Flags().StringVar(&reason, "reason", "", "reason for the rejection")
	return cmd
}

func (a *app) newRuleApproveAllCmd() *cobra.Command {
	var flagged bool
	cmd := a.ruleCmd("approve-all NAME", "Approve all pending network rules",
		`Approve every pending chunk in one new policy revision, each with the review
token just fetched. Chunks with security notes are skipped unless
--include-security-flagged; chunks whose token went stale are skipped too.`,
		func(cmd *cobra.Command, c openshellv1.OpenShellClient, name string) error {
			resp, err := a.drafts(cmd.Context(), c, name, "pending")
			if err != nil {
				return err
			}
			var approvals []*openshellv1.DraftChunkApproval
			for _, ch := range resp.GetChunks() {
				approvals = append(approvals, &openshellv1.DraftChunkApproval{ChunkId: ch.GetId(), ReviewToken: ch.GetReviewToken()})
			}
			out, err := c.ApproveAllDraftChunks(cmd.Context(), &openshellv1.ApproveAllDraftChunksRequest{Name: name, IncludeSecurityFlagged: flagged, Approvals: approvals, Workspace: a.ws()})
			if err != nil {
				return a.rpcError(err, sandboxWhat(name))
			}
			_, _ = fmt.Fprintf(a.stdout, "%d chunk(s) approved, %d skipped. Policy version: %d\n", out.GetChunksApproved(), out.GetChunksSkipped(), out.GetPolicyVersion())
			return nil
		})
	cmd.Flags().BoolVar(&flagged, "include-security-flagged", false, "also approve chunks with security notes")
	return cmd
}

func (a *app) newRuleEditCmd() *cobra.Command {
	var id, file string
	cmd := a.ruleCmd("edit NAME --chunk-id ID --rule FILE", "Replace the rule of a pending chunk",
		`Replace the proposed rule of pending chunk ID with the rule in FILE: one
network_policies entry in the policy file format (name, endpoints,
binaries). The gateway evaluates it afresh (security notes, prover, a new
review token). Not in OpenShell's CLI.`,
		func(cmd *cobra.Command, c openshellv1.OpenShellClient, name string) error {
			if err := needChunkID(id); err != nil {
				return err
			}
			if file == "" {
				return usagef("--rule is required")
			}
			data, err := os.ReadFile(file)
			if err != nil {
				return &userError{msg: fmt.Sprintf("read rule file: %v", err), cause: err}
			}
			rule, err := policyfile.ParseRule(data, "")
			if err != nil {
				return &userError{msg: fmt.Sprintf("invalid rule file %s: %v", file, err), cause: err}
			}
			if _, err := c.EditDraftChunk(cmd.Context(), &openshellv1.EditDraftChunkRequest{Name: name, ChunkId: id, ProposedRule: rule, Workspace: a.ws()}); err != nil {
				return a.objectError(err, name, chunkWhat(id))
			}
			_, _ = fmt.Fprintln(a.stdout, "Chunk updated.")
			return nil
		})
	a.chunkIDFlag(cmd, &id, "chunk to edit (required)")
	cmd.Flags().StringVar(&file, "rule", "", "YAML file with the new rule (required)")
	_ = cmd.MarkFlagFilename("rule", "yaml", "yml")
	return cmd
}

func (a *app) newRuleUndoCmd() *cobra.Command {
	var id string
	cmd := a.ruleCmd("undo NAME --chunk-id ID", "Undo the approval of a network rule",
		`Undo the approval of chunk ID: its binary leaves the rule (a new policy
revision) and the chunk is pending again. Not in OpenShell's CLI.`,
		func(cmd *cobra.Command, c openshellv1.OpenShellClient, name string) error {
			if err := needChunkID(id); err != nil {
				return err
			}
			out, err := c.UndoDraftChunk(cmd.Context(), &openshellv1.UndoDraftChunkRequest{Name: name, ChunkId: id, Workspace: a.ws()})
			if err != nil {
				return a.objectError(err, name, chunkWhat(id))
			}
			_, _ = fmt.Fprintf(a.stdout, "Chunk approval undone. Policy version: %d, hash: %s\n", out.GetPolicyVersion(), shortHash(out.GetPolicyHash()))
			return nil
		})
	a.chunkIDFlag(cmd, &id, "approved chunk to undo (required)")
	return cmd
}

func (a *app) newRuleClearCmd() *cobra.Command {
	return a.ruleCmd("clear NAME", "Clear all pending network rules",
		`Delete the pending chunks of sandbox NAME; approved and rejected ones stay.`,
		func(cmd *cobra.Command, c openshellv1.OpenShellClient, name string) error {
			out, err := c.ClearDraftChunks(cmd.Context(), &openshellv1.ClearDraftChunksRequest{Name: name, Workspace: a.ws()})
			if err != nil {
				return a.rpcError(err, sandboxWhat(name))
			}
			_, _ = fmt.Fprintf(a.stdout, "%d pending chunk(s) cleared.\n", out.GetChunksCleared())
			return nil
		})
}

func (a *app) newRuleHistoryCmd() *cobra.Command {
	return a.ruleCmd("history NAME", "Show network rule history",
		`Show the draft events of sandbox NAME, oldest first: each chunk proposed and
each decision (approved, rejected, …). -o json|yaml prints the
GetDraftHistory response.`,
		func(cmd *cobra.Command, c openshellv1.OpenShellClient, name string) error {
			resp, err := c.GetDraftHistory(cmd.Context(), &openshellv1.GetDraftHistoryRequest{Name: name, Workspace: a.ws()})
			if err != nil {
				return a.rpcError(err, sandboxWhat(name))
			}
			if a.structured() {
				return a.printProto(resp)
			}
			if len(resp.GetEntries()) == 0 {
				_, _ = fmt.Fprintf(a.stdout, "No rule history for sandbox '%s'\n", name)
				return nil
			}
			_, _ = fmt.Fprintf(a.stdout, "Rule History:\n\n")
			for _, e := range resp.GetEntries() {
				id := e.GetChunkId()
				if len(id) > 8 {
					id = id[:8]
				}
				_, _ = fmt.Fprintf(a.stdout, "  %s %s [%s] %s\n", formatMs(e.GetTimestampMs()), e.GetEventType(), id, e.GetDescription())
			}
			return nil
		})
}
