package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/policy/policyfile"
)

// The policy commands follow OpenShell's CLI: 'policy set|get|list|delete'
// over UpdateConfig, GetSandboxConfig, GetSandboxPolicyStatus and
// ListSandboxPolicies, with policy files in OpenShell's YAML format
// (internal/policy/policyfile); 'policy update' (cmd_policy_update.go) sends
// merge_operations.

// providerRulePrefix names the network rules OpenShell composes from
// attached providers; 'policy get --base' leaves them out.
const providerRulePrefix = "_provider_"

func (a *app) newPolicyCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "policy",
		Aliases: []string{"pol"},
		Short:   "Manage sandbox policy",
		Long: `Manage the policy of a sandbox, or the gateway-wide (global) policy that
overrides every sandbox's own policy while it is set.

Policy files are YAML in OpenShell's policy format (version, filesystem_policy,
landlock, process, network_policies, network_middlewares). 'policy set'
replaces the whole policy and 'policy update' changes network rules in
place: each change is a new revision, which the sandbox's supervisor loads
(or fails to load) without restarting; 'policy list' shows each revision's
status.`,
		Example: `  openshell policy get my-sandbox
  openshell policy get my-sandbox --full > current-policy.yaml
  openshell policy set my-sandbox --policy policy.yaml --wait
  openshell policy update my-sandbox --add-endpoint api.github.com:443:read-only:rest:enforce --binary /usr/bin/gh
  openshell policy list my-sandbox
  openshell policy set --global --policy policy.yaml --yes
  openshell policy delete --global --yes`,
		RunE: groupRunE,
	}
	cmd.AddCommand(a.newPolicySetCmd(), a.newPolicyUpdateCmd(), a.newPolicyGetCmd(), a.newPolicyListCmd(), a.newPolicyDeleteCmd())
	return cmd
}

// readPolicyFile reads and parses a policy file; its errors name the file,
// the line and the field.
func readPolicyFile(path string) (*sandboxv1.SandboxPolicy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &userError{msg: fmt.Sprintf("read policy file: %v", err), cause: err}
	}
	p, err := policyfile.Parse(data)
	if err != nil {
		return nil, &userError{msg: fmt.Sprintf("invalid policy file %s: %v", path, err), cause: err}
	}
	return p, nil
}

// scopeName checks the [NAME] argument of a command that also takes
// --global: a sandbox name without --global, none with it.
func scopeName(cmdPath string, args []string, global bool) (string, error) {
	switch {
	case global && len(args) > 0:
		return "", usagef("%s --global does not accept a sandbox name", cmdPath)
	case global:
		return "", nil
	case len(args) == 0:
		return "", usagef("a sandbox name is required (or --global for the gateway-wide scope)")
	}
	return args[0], nil
}

// scopeWhat names the sandbox for rpcError, or nothing at global scope.
func scopeWhat(name string, global bool) string {
	if global {
		return ""
	}
	return sandboxWhat(name)
}

// objectError converts the error of an RPC about an object inside sandbox
// name (a policy revision, a draft chunk): a NotFound that is not about the
// sandbox itself names that object, not the sandbox.
func (a *app) objectError(err error, name, object string) error {
	if st, ok := status.FromError(err); ok && st.Code() == codes.NotFound && !strings.HasPrefix(st.Message(), "sandbox") {
		return &userError{msg: fmt.Sprintf("%s not found in sandbox %q", object, name), cause: err}
	}
	return a.rpcError(err, sandboxWhat(name))
}

// confirmGlobal asks before a global change unless yes; without a terminal
// it refuses, as OpenShell's CLI does.
func (a *app) confirmGlobal(yes bool, prompt, refusal string) error {
	if yes {
		return nil
	}
	if !a.stdinTerminal() {
		return usagef("%s; pass --yes in non-interactive mode", refusal)
	}
	_, _ = fmt.Fprintf(a.stderr, "%s Continue? [y/N] ", prompt)
	line, _ := bufio.NewReader(a.stdin).ReadString('\n')
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return nil
	}
	return &userError{msg: "aborted by user"}
}

func shortHash(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

func (a *app) newPolicySetCmd() *cobra.Command {
	var (
		file           string
		global, yes    bool
		wait           bool
		timeoutSeconds uint
	)
	cmd := &cobra.Command{
		Use:   "set [NAME] --policy FILE",
		Short: "Replace the policy of a live sandbox, or set the global policy",
		Long: `Replace the policy of sandbox NAME with the policy in FILE; the sandbox's
supervisor picks the new revision up without restarting. Sections that apply
only at sandbox start (filesystem_policy, landlock, process) cannot change on
a live sandbox; the gateway refuses such a change.

With --wait, wait until the supervisor reports the new revision loaded (exit
0), failed (exit 1) or until --timeout (exit 124).

With --global, FILE becomes the gateway-wide policy, which overrides every
sandbox's own policy until 'openshell policy delete --global'. Global changes
ask for confirmation; --yes skips it (required without a terminal).`,
		Args:              argsUsage(cobra.MaximumNArgs(1)),
		ValidArgsFunction: a.completeSandboxes,
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := scopeName("policy set", args, global)
			if err != nil {
				return err
			}
			if file == "" {
				return usagef("--policy is required")
			}
			if global && wait {
				return usagef("--wait is only supported for sandbox-scoped policy updates")
			}
			pol, err := readPolicyFile(file)
			if err != nil {
				return err
			}
			if global {
				if err := a.confirmGlobal(yes, "Setting 'policy' globally will disable sandbox-level management for this key.", "global setting updates require confirmation"); err != nil {
					return err
				}
			}
			c, err := a.gateway()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			if global {
				resp, err := c.UpdateConfig(ctx, &openshellv1.UpdateConfigRequest{Policy: pol, Global: true, Workspace: a.ws()})
				if err != nil {
					return a.rpcError(err, "")
				}
				_, _ = fmt.Fprintf(a.stderr, "Global policy version %d configured (hash: %s)\n", resp.GetVersion(), shortHash(resp.GetPolicyHash()))
				return a.printIfStructured(resp)
			}
			// The current version, to tell an unchanged policy apart.
			var current uint32
			if st, err := c.GetSandboxPolicyStatus(ctx, &openshellv1.GetSandboxPolicyStatusRequest{Name: name, Workspace: a.ws()}); err == nil {
				current = st.GetRevision().GetVersion()
			}
			resp, err := c.UpdateConfig(ctx, &openshellv1.UpdateConfigRequest{Name: name, Policy: pol, Workspace: a.ws()})
			if err != nil {
				return a.rpcError(err, sandboxWhat(name))
			}
			if resp.GetVersion() == current {
				_, _ = fmt.Fprintf(a.stderr, "Policy unchanged (version %d, hash: %s)\n", resp.GetVersion(), shortHash(resp.GetPolicyHash()))
			} else {
				_, _ = fmt.Fprintf(a.stderr, "Policy version %d submitted (hash: %s)\n", resp.GetVersion(), shortHash(resp.GetPolicyHash()))
			}
			if err := a.printIfStructured(resp); err != nil {
				return err
			}
			if !wait {
				return nil
			}
			return a.waitPolicyLoaded(ctx, c, name, resp.GetVersion(), time.Duration(timeoutSeconds)*time.Second)
		},
	}
	f := cmd.Flags()
	f.StringVar(&file, "policy", "", "path to the policy YAML file (required)")
	_ = cmd.MarkFlagFilename("policy", "yaml", "yml")
	f.BoolVar(&global, "global", false, "set the gateway-wide policy, which overrides every sandbox's own policy")
	f.BoolVar(&yes, "yes", false, "skip the confirmation prompt of a global change")
	f.BoolVar(&wait, "wait", false, "wait until the sandbox loads the new revision (exit 1 if it fails, 124 on timeout)")
	f.UintVar(&timeoutSeconds, "timeout", 60, "seconds --wait waits")
	return cmd
}

func (a *app) printIfStructured(m proto.Message) error {
	if !a.structured() {
		return nil
	}
	return a.printProto(m)
}

// waitPolicyLoaded polls the status of version until the supervisor
// reports it loaded, failed or superseded, or timeout passes (exit 124).
func (a *app) waitPolicyLoaded(ctx context.Context, c openshellv1.OpenShellClient, name string, version uint32, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		st, err := c.GetSandboxPolicyStatus(ctx, &openshellv1.GetSandboxPolicyStatusRequest{Name: name, Version: version, Workspace: a.ws()})
		if err != nil {
			return a.rpcError(err, sandboxWhat(name))
		}
		rev := st.GetRevision()
		switch rev.GetStatus() {
		case openshellv1.PolicyStatus_POLICY_STATUS_LOADED:
			_, _ = fmt.Fprintf(a.stderr, "Policy version %d loaded (active version: %d)\n", rev.GetVersion(), st.GetActiveVersion())
			return nil
		case openshellv1.PolicyStatus_POLICY_STATUS_FAILED:
			return &userError{msg: fmt.Sprintf("policy version %d failed to load: %s", rev.GetVersion(), rev.GetLoadError())}
		case openshellv1.PolicyStatus_POLICY_STATUS_SUPERSEDED:
			_, _ = fmt.Fprintf(a.stderr, "Policy version %d was superseded (active version: %d)\n", rev.GetVersion(), st.GetActiveVersion())
			return nil
		}
		if !time.Now().Before(deadline) {
			_, _ = fmt.Fprintf(a.stderr, "Timeout waiting for policy version %d to load\n", version)
			return &ExitError{Code: 124}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// policyStatusName renders POLICY_STATUS_LOADED as "Loaded".
func policyStatusName(s openshellv1.PolicyStatus) string {
	n := strings.TrimPrefix(s.String(), "POLICY_STATUS_")
	return n[:1] + strings.ToLower(n[1:])
}

// revisionView is the JSON and YAML form of a policy revision or of the
// effective policy (OpenShell's field names).
type revisionView struct {
	Scope               string            `json:"scope"`
	Sandbox             string            `json:"sandbox,omitempty"`
	Version             uint32            `json:"version"`
	ActiveVersion       *uint32           `json:"active_version,omitempty"`
	Hash                string            `json:"hash"`
	Status              string            `json:"status"`
	ConfigRevision      *uint64           `json:"config_revision,omitempty"`
	PolicySource        string            `json:"policy_source,omitempty"`
	GlobalPolicyVersion uint32            `json:"global_policy_version,omitempty"`
	CreatedAtMs         int64             `json:"created_at_ms,omitempty"`
	LoadedAtMs          int64             `json:"loaded_at_ms,omitempty"`
	LoadError           string            `json:"load_error,omitempty"`
	Provenance          map[string]string `json:"provenance,omitempty"`
	Policy              any               `json:"policy,omitempty"`
}

// printValue prints v as indented JSON, or as YAML converted from it.
func (a *app) printValue(v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if a.output == "yaml" {
		if b, err = yaml.JSONToYAML(b); err != nil {
			return err
		}
		_, err = a.stdout.Write(b)
		return err
	}
	_, err = fmt.Fprintf(a.stdout, "%s\n", b)
	return err
}

// policyView is the policy --full or --base asks for; nil without them.
func policyView(p *sandboxv1.SandboxPolicy, full, base bool) *sandboxv1.SandboxPolicy {
	if p == nil || (!full && !base) {
		return nil
	}
	if !base {
		return p
	}
	c := proto.Clone(p).(*sandboxv1.SandboxPolicy)
	for name := range c.NetworkPolicies {
		if strings.HasPrefix(name, providerRulePrefix) {
			delete(c.NetworkPolicies, name)
		}
	}
	return c
}

func (a *app) newPolicyGetCmd() *cobra.Command {
	var (
		rev                uint32
		full, base, global bool
	)
	cmd := &cobra.Command{
		Use:   "get [NAME]",
		Short: "Show the effective policy of a sandbox, a stored revision, or the global policy",
		Long: `Show the policy in force for sandbox NAME: its version, hash and source
(sandbox, or global while a gateway-wide policy overrides it). --rev N shows
stored revision N instead, with the status its supervisor reported (Pending,
Loaded, Failed with the reason, Superseded). --global shows the global policy
(the one in force, or revision --rev).

--full adds the policy itself as YAML after a '---' line (in the policy file
format; drop the header to reuse it with 'policy set'). --base leaves out
network rules composed from providers (named _provider_*); this gateway
composes none, so --base shows the same policy as --full. With -o json|yaml
the output is one object with the policy under "policy".`,
		Args:              argsUsage(cobra.MaximumNArgs(1)),
		ValidArgsFunction: a.completeSandboxes,
		RunE: func(cmd *cobra.Command, args []string) error {
			if full && base {
				return usagef("--full and --base are mutually exclusive")
			}
			name, err := scopeName("policy get", args, global)
			if err != nil {
				return err
			}
			c, err := a.gateway()
			if err != nil {
				return err
			}
			if global || rev > 0 {
				return a.policyGetRevision(cmd.Context(), c, name, rev, global, full, base)
			}
			return a.policyGetEffective(cmd.Context(), c, name, full, base)
		},
	}
	f := cmd.Flags()
	f.Uint32Var(&rev, "rev", 0, "show stored revision N (default: the policy in force)")
	f.BoolVar(&full, "full", false, "include the policy (YAML), with provider-composed rules")
	f.BoolVar(&base, "base", false, "include the policy (YAML), without provider-composed rules")
	f.BoolVar(&global, "global", false, "show the global policy")
	return cmd
}

func (a *app) policyGetEffective(ctx context.Context, c openshellv1.OpenShellClient, name string, full, base bool) error {
	sb, err := a.getSandbox(ctx, name)
	if err != nil {
		return err
	}
	cfg, err := c.GetSandboxConfig(ctx, &sandboxv1.GetSandboxConfigRequest{SandboxId: sb.GetMetadata().GetId()})
	if err != nil {
		return a.rpcError(err, sandboxWhat(name))
	}
	if cfg.GetPolicy() == nil {
		return &userError{msg: fmt.Sprintf("no active policy configured for sandbox '%s'", name)}
	}
	source := "sandbox"
	version := cfg.GetVersion()
	if cfg.GetPolicySource() == sandboxv1.PolicySource_POLICY_SOURCE_GLOBAL {
		source = "global"
		if cfg.GetGlobalPolicyVersion() > 0 {
			version = cfg.GetGlobalPolicyVersion()
		}
	}
	pol := policyView(cfg.GetPolicy(), full, base)
	if a.structured() {
		rv := cfg.GetConfigRevision()
		v := revisionView{Scope: "sandbox", Sandbox: name, Version: version, ActiveVersion: &version, Hash: cfg.GetPolicyHash(),
			Status: "effective", ConfigRevision: &rv, PolicySource: source, GlobalPolicyVersion: cfg.GetGlobalPolicyVersion()}
		if pol != nil {
			v.Policy = policyfile.Document(pol)
		}
		return a.printValue(v)
	}
	tw := newTable(a.stdout)
	row := func(k string, v any) { _, _ = fmt.Fprintf(tw, "%s:\t%v\n", k, v) }
	row("Version", version)
	row("Hash", cfg.GetPolicyHash())
	row("Status", "Effective")
	row("Source", source)
	row("Config rev", cfg.GetConfigRevision())
	if cfg.GetGlobalPolicyVersion() > 0 {
		row("Global", cfg.GetGlobalPolicyVersion())
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return a.printPolicyYAML(pol)
}

func (a *app) printPolicyYAML(p *sandboxv1.SandboxPolicy) error {
	if p == nil {
		return nil
	}
	b, err := policyfile.Marshal(p)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(a.stdout, "---\n%s", b)
	return err
}

func (a *app) policyGetRevision(ctx context.Context, c openshellv1.OpenShellClient, name string, rev uint32, global, full, base bool) error {
	st, err := c.GetSandboxPolicyStatus(ctx, &openshellv1.GetSandboxPolicyStatusRequest{Name: name, Version: rev, Global: global, Workspace: a.ws()})
	switch {
	case err == nil:
	case global && status.Code(err) == codes.NotFound && rev == 0:
		st = &openshellv1.GetSandboxPolicyStatusResponse{} // none set: as OpenShell, say so below
	case global && status.Code(err) == codes.NotFound:
		return &userError{msg: fmt.Sprintf("global policy revision %d not found", rev), cause: err}
	case global:
		return a.rpcError(err, "")
	default:
		return a.objectError(err, name, fmt.Sprintf("policy revision %d", rev))
	}
	r := st.GetRevision()
	if r == nil {
		if global {
			_, _ = fmt.Fprintln(a.stderr, "No global policy history found")
		} else {
			_, _ = fmt.Fprintf(a.stderr, "No policy history found for sandbox '%s'\n", name)
		}
		return nil
	}
	pol := policyView(r.GetPolicy(), full, base)
	if a.structured() {
		v := revisionFromProto(r, name, global)
		if !global {
			av := st.GetActiveVersion()
			v.ActiveVersion = &av
		}
		if pol != nil {
			v.Policy = policyfile.Document(pol)
		}
		return a.printValue(v)
	}
	tw := newTable(a.stdout)
	row := func(k string, v any) { _, _ = fmt.Fprintf(tw, "%s:\t%v\n", k, v) }
	if global {
		row("Scope", "global")
	}
	row("Version", r.GetVersion())
	row("Hash", r.GetPolicyHash())
	row("Status", policyStatusName(r.GetStatus()))
	if !global {
		row("Active", st.GetActiveVersion())
	}
	if r.GetCreatedAtMs() > 0 {
		row("Created", formatMs(r.GetCreatedAtMs()))
	}
	if r.GetLoadedAtMs() > 0 {
		row("Loaded", formatMs(r.GetLoadedAtMs()))
	}
	if r.GetLoadError() != "" {
		row("Error", r.GetLoadError())
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if (full || base) && r.GetPolicy() == nil {
		_, _ = fmt.Fprintln(a.stderr, "Policy payload not available for this version")
	}
	return a.printPolicyYAML(pol)
}

func formatMs(ms int64) string { return time.UnixMilli(ms).UTC().Format(time.RFC3339) }

func revisionFromProto(r *openshellv1.SandboxPolicyRevision, name string, global bool) revisionView {
	v := revisionView{Scope: "sandbox", Sandbox: name, Version: r.GetVersion(), Hash: r.GetPolicyHash(),
		Status: strings.ToLower(policyStatusName(r.GetStatus())), CreatedAtMs: r.GetCreatedAtMs(),
		LoadedAtMs: r.GetLoadedAtMs(), LoadError: r.GetLoadError(), Provenance: r.GetProvenance()}
	if global {
		v.Scope, v.Sandbox = "global", ""
	}
	return v
}

func (a *app) newPolicyListCmd() *cobra.Command {
	var (
		limit  uint32
		global bool
	)
	cmd := &cobra.Command{
		Use:   "list [NAME]",
		Short: "List the policy revisions of a sandbox or of the global policy",
		Long: `List the policy revisions of sandbox NAME, newest first, with the status
its supervisor reported for each (Pending, Loaded, Failed, Superseded) and the
load error of a failed one. --global lists the global policy's revisions.`,
		Args:              argsUsage(cobra.MaximumNArgs(1)),
		ValidArgsFunction: a.completeSandboxes,
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := scopeName("policy list", args, global)
			if err != nil {
				return err
			}
			c, err := a.gateway()
			if err != nil {
				return err
			}
			resp, err := c.ListSandboxPolicies(cmd.Context(), &openshellv1.ListSandboxPoliciesRequest{Name: name, Limit: limit, Global: global, Workspace: a.ws()})
			if err != nil {
				return a.rpcError(err, scopeWhat(name, global))
			}
			revs := resp.GetRevisions()
			if a.structured() {
				out := make([]revisionView, 0, len(revs))
				for _, r := range revs {
					out = append(out, revisionFromProto(r, name, global))
				}
				return a.printValue(out)
			}
			if len(revs) == 0 {
				if global {
					_, _ = fmt.Fprintln(a.stderr, "No global policy history found")
				} else {
					_, _ = fmt.Fprintf(a.stderr, "No policy history found for sandbox '%s'\n", name)
				}
				return nil
			}
			tw := newTable(a.stdout)
			_, _ = fmt.Fprintln(tw, "VERSION\tHASH\tSTATUS\tCREATED\tERROR")
			for _, r := range revs {
				errText := r.GetLoadError()
				if len(errText) > 40 {
					errText = errText[:40] + "..."
				}
				_, _ = fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", r.GetVersion(), shortHash(r.GetPolicyHash()),
					policyStatusName(r.GetStatus()), a.age(r.GetCreatedAtMs()), errText)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().Uint32Var(&limit, "limit", 20, "maximum number of revisions to list")
	cmd.Flags().BoolVar(&global, "global", false, "list the global policy's revisions")
	return cmd
}

func (a *app) newPolicyDeleteCmd() *cobra.Command {
	var global, yes bool
	cmd := &cobra.Command{
		Use:   "delete --global",
		Short: "Remove the global policy, restoring each sandbox's own policy",
		Long: `Remove the gateway-wide policy; every sandbox returns to its own policy.
A sandbox's own policy cannot be deleted, only replaced ('policy set').`,
		Args: argsUsage(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !global {
				return usagef("sandbox policy delete is not supported; use --global to remove global policy lock")
			}
			return a.deleteGlobalSetting(cmd.Context(), "policy", yes)
		},
	}
	cmd.Flags().BoolVar(&global, "global", false, "delete the global policy")
	cmd.Flags().BoolVar(&yes, "yes", false, "skip the confirmation prompt")
	return cmd
}
