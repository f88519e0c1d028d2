package cli

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/policy"
)

// 'policy update' is OpenShell's incremental policy change: its flags are
// turned into UpdateConfig merge_operations (one revision for all of
// them), with OpenShell's spec formats and error texts.

// updateFlags are the operation flags of 'policy update'.
type updateFlags struct {
	addEndpoints, removeEndpoints, addAllow, addDeny, removeRules, binaries []string
	ruleName                                                                string
	ruleNameSet                                                             bool
}

func (a *app) newPolicyUpdateCmd() *cobra.Command {
	var (
		fl             updateFlags
		dryRun, wait   bool
		timeoutSeconds uint
	)
	cmd := &cobra.Command{
		Use:   "update NAME [flags]",
		Short: "Incrementally update the network rules of a live sandbox",
		Long: `Change the network rules of sandbox NAME without sending the whole policy:
all flags of one command become one new revision (the gateway applies them
to the newest policy, all or none).

  --add-endpoint host:port[:access[:protocol[:enforcement[:options]]]]
      adds (or merges) a rule allowing the --binary paths to reach host:port.
      access: read-only, read-write or full; protocol: tcp, rest, websocket
      or sql; enforcement: enforce or audit (needs a protocol); options,
      comma separated: allow-uninspected-credentials,
      websocket-credential-rewrite, request-body-credential-rewrite,
      allowed-ip=CIDR. The rule is named allow_<host>_<port> unless
      --rule-name (with exactly one --add-endpoint).
  --remove-endpoint host:port   removes that port of the endpoint, in every rule
  --remove-rule NAME            removes a rule
  --add-allow host:port:METHOD:path_glob
  --add-deny host:port:METHOD:path_glob
      add method/path rules to the rest or websocket endpoint at host:port.

--dry-run prints the merged policy without sending it; --wait waits for the
supervisor's load report as 'policy set --wait' does.`,
		Example: `  openshell policy update my-sandbox --add-endpoint api.github.com:443:read-only:rest:enforce --binary /usr/bin/gh --wait
  openshell policy update my-sandbox --add-allow 'api.github.com:443:POST:/repos/*/issues'
  openshell policy update my-sandbox --remove-rule allow_pypi_org_443 --dry-run`,
		Args:              argsUsage(cobra.ExactArgs(1)),
		ValidArgsFunction: a.completeSandboxes,
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if dryRun && wait {
				return usagef("--wait cannot be combined with --dry-run")
			}
			fl.ruleNameSet = cmd.Flags().Changed("rule-name")
			ops, err := fl.plan()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			c, err := a.gateway()
			if err != nil {
				return err
			}
			sb, err := a.getSandbox(ctx, name)
			if err != nil {
				return err
			}
			cur, err := c.GetSandboxConfig(ctx, &sandboxv1.GetSandboxConfigRequest{SandboxId: sb.GetMetadata().GetId()})
			if err != nil {
				return a.rpcError(err, sandboxWhat(name))
			}
			if cur.GetPolicySource() == sandboxv1.PolicySource_POLICY_SOURCE_GLOBAL {
				return &userError{msg: "policy is managed globally; delete the global policy before using `openshell policy update`"}
			}
			if dryRun {
				merged, err := policy.Merge(cur.GetPolicy(), ops)
				if err != nil {
					return &userError{msg: err.Error(), cause: err}
				}
				_, _ = fmt.Fprintf(a.stderr, "Dry run preview for %d incremental policy operation(s)\n", len(ops))
				return a.printPolicyYAML(merged)
			}
			resp, err := c.UpdateConfig(ctx, &openshellv1.UpdateConfigRequest{Name: name, MergeOperations: ops, Workspace: a.ws()})
			if err != nil {
				return a.rpcError(err, sandboxWhat(name))
			}
			if resp.GetVersion() == cur.GetVersion() && resp.GetPolicyHash() == cur.GetPolicyHash() {
				_, _ = fmt.Fprintf(a.stderr, "Policy unchanged (version %d, hash: %s)\n", resp.GetVersion(), shortHash(resp.GetPolicyHash()))
				return nil
			}
			_, _ = fmt.Fprintf(a.stderr, "Policy version %d submitted (hash: %s)\n", resp.GetVersion(), shortHash(resp.GetPolicyHash()))
			if !wait {
				return nil
			}
			return a.waitPolicyLoaded(ctx, c, name, resp.GetVersion(), time.Duration(timeoutSeconds)*time.Second)
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&fl.addEndpoints, "add-endpoint", nil, "add or merge an endpoint: host:port[:access[:protocol[:enforcement[:options]]]] (repeatable)")
	f.StringArrayVar(&fl.removeEndpoints, "remove-endpoint", nil, "remove an endpoint: host:port (repeatable)")
	f.StringArrayVar(&fl.addAllow, "add-allow", nil, "add a REST or WebSocket allow rule: host:port:METHOD:path_glob (repeatable)")
	f.StringArrayVar(&fl.addDeny, "add-deny", nil, "add a REST or WebSocket deny rule: host:port:METHOD:path_glob (repeatable)")
	f.StringArrayVar(&fl.removeRules, "remove-rule", nil, "remove a network rule by name (repeatable)")
	f.StringArrayVar(&fl.binaries, "binary", nil, "binary allowed by each --add-endpoint rule (repeatable)")
	f.StringVar(&fl.ruleName, "rule-name", "", "name of the rule when exactly one --add-endpoint is given (default allow_<host>_<port>)")
	f.BoolVar(&dryRun, "dry-run", false, "print the merged policy without sending it")
	f.BoolVar(&wait, "wait", false, "wait until the sandbox loads the new revision (exit 1 if it fails, 124 on timeout)")
	f.UintVar(&timeoutSeconds, "timeout", 60, "seconds --wait waits")
	return cmd
}

// plan turns the flags into merge operations, in OpenShell's order:
// add-endpoint, remove-endpoint, remove-rule, add-allow, add-deny.
func (fl *updateFlags) plan() ([]*openshellv1.PolicyMergeOperation, error) {
	for _, b := range fl.binaries {
		if strings.TrimSpace(b) == "" {
			return nil, usagef("--binary values must not be empty")
		}
	}
	if len(fl.binaries) > 0 && len(fl.addEndpoints) == 0 {
		return nil, usagef("--binary can only be used with --add-endpoint")
	}
	if fl.ruleNameSet && len(fl.addEndpoints) == 0 {
		return nil, usagef("--rule-name can only be used with --add-endpoint")
	}
	if fl.ruleNameSet && len(fl.addEndpoints) > 1 {
		return nil, usagef("--rule-name is only supported when exactly one --add-endpoint is provided")
	}
	var ops []*openshellv1.PolicyMergeOperation
	var bins []*sandboxv1.NetworkBinary
	var seen []string
	for _, b := range fl.binaries {
		if b = strings.TrimSpace(b); !slices.Contains(seen, b) {
			seen = append(seen, b)
			bins = append(bins, &sandboxv1.NetworkBinary{Path: b})
		}
	}
	for _, spec := range fl.addEndpoints {
		ep, err := parseAddEndpoint(spec)
		if err != nil {
			return nil, err
		}
		name := strings.TrimSpace(fl.ruleName)
		if name == "" {
			name = generatedRuleName(ep.GetHost(), ep.GetPort())
		}
		ops = append(ops, &openshellv1.PolicyMergeOperation{Operation: &openshellv1.PolicyMergeOperation_AddRule{AddRule: &openshellv1.AddNetworkRule{
			RuleName: name, Rule: &sandboxv1.NetworkPolicyRule{Name: name, Endpoints: []*sandboxv1.NetworkEndpoint{ep}, Binaries: bins},
		}}})
	}
	for _, spec := range fl.removeEndpoints {
		parts := strings.Split(spec, ":")
		if len(parts) != 2 {
			return nil, usagef("--remove-endpoint expects host:port, got '%s'", spec)
		}
		host, err := parseSpecHost("--remove-endpoint", spec, parts[0])
		if err != nil {
			return nil, err
		}
		port, err := parseSpecPort("--remove-endpoint", spec, parts[1])
		if err != nil {
			return nil, err
		}
		ops = append(ops, &openshellv1.PolicyMergeOperation{Operation: &openshellv1.PolicyMergeOperation_RemoveEndpoint{RemoveEndpoint: &openshellv1.RemoveNetworkEndpoint{Host: host, Port: port}}})
	}
	for _, n := range fl.removeRules {
		if n = strings.TrimSpace(n); n == "" {
			return nil, usagef("--remove-rule values must not be empty")
		}
		ops = append(ops, &openshellv1.PolicyMergeOperation{Operation: &openshellv1.PolicyMergeOperation_RemoveRule{RemoveRule: &openshellv1.RemoveNetworkRule{RuleName: n}}})
	}
	allow, err := groupL7Specs("--add-allow", fl.addAllow)
	if err != nil {
		return nil, err
	}
	for _, g := range allow {
		var rules []*sandboxv1.L7Rule
		for _, r := range g.rules {
			rules = append(rules, &sandboxv1.L7Rule{Allow: &sandboxv1.L7Allow{Method: r[0], Path: r[1]}})
		}
		ops = append(ops, &openshellv1.PolicyMergeOperation{Operation: &openshellv1.PolicyMergeOperation_AddAllowRules{AddAllowRules: &openshellv1.AddAllowRules{Host: g.host, Port: g.port, Rules: rules}}})
	}
	deny, err := groupL7Specs("--add-deny", fl.addDeny)
	if err != nil {
		return nil, err
	}
	for _, g := range deny {
		var rules []*sandboxv1.L7DenyRule
		for _, r := range g.rules {
			rules = append(rules, &sandboxv1.L7DenyRule{Method: r[0], Path: r[1]})
		}
		ops = append(ops, &openshellv1.PolicyMergeOperation{Operation: &openshellv1.PolicyMergeOperation_AddDenyRules{AddDenyRules: &openshellv1.AddDenyRules{Host: g.host, Port: g.port, DenyRules: rules}}})
	}
	if len(ops) == 0 {
		return nil, usagef("policy update requires at least one operation flag")
	}
	return ops, nil
}

// generatedRuleName is OpenShell's name for a rule added for host:port.
func generatedRuleName(host string, port uint32) string {
	var b strings.Builder
	for _, r := range strings.NewReplacer(".", "_", "-", "_").Replace(host) {
		if r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		}
	}
	return fmt.Sprintf("allow_%s_%d", b.String(), port)
}

func parseSpecHost(flag, spec, host string) (string, error) {
	host = strings.TrimSpace(host)
	switch {
	case host == "":
		return "", usagef("%s has an empty host segment in '%s'", flag, spec)
	case strings.ContainsAny(host, " \t\n\r"):
		return "", usagef("%s host must not contain whitespace in '%s'", flag, spec)
	case strings.Contains(host, "/"):
		return "", usagef("%s host must not contain '/' in '%s'", flag, spec)
	}
	return host, nil
}

func parseSpecPort(flag, spec, port string) (uint32, error) {
	port = strings.TrimSpace(port)
	if port == "" {
		return 0, usagef("%s has an empty port segment in '%s'", flag, spec)
	}
	n, err := strconv.ParseUint(port, 10, 32)
	if err != nil {
		return 0, usagef("%s port segment must be a base-10 integer, got '%s' in '%s'", flag, port, spec)
	}
	if n == 0 || n > 65535 {
		return 0, usagef("%s port must be in the range 1-65535, got '%d' in '%s'", flag, n, spec)
	}
	return uint32(n), nil
}

// parseAddEndpoint parses host:port[:access[:protocol[:enforcement[:options]]]].
func parseAddEndpoint(spec string) (*sandboxv1.NetworkEndpoint, error) {
	parts := strings.Split(spec, ":")
	if len(parts) < 2 || len(parts) > 6 {
		return nil, usagef("--add-endpoint expects host:port[:access[:protocol[:enforcement[:options]]]], got '%s'", spec)
	}
	host, err := parseSpecHost("--add-endpoint", spec, parts[0])
	if err != nil {
		return nil, err
	}
	port, err := parseSpecPort("--add-endpoint", spec, parts[1])
	if err != nil {
		return nil, err
	}
	seg := func(i int) string {
		if i < len(parts) {
			return strings.TrimSpace(parts[i])
		}
		return ""
	}
	access, protocol, enforcement, options := seg(2), seg(3), seg(4), seg(5)
	switch {
	case len(parts) == 3 && access == "":
		return nil, usagef("--add-endpoint has an empty access segment in '%s'; omit it entirely if you do not need access or protocol fields", spec)
	case len(parts) == 6 && options == "":
		return nil, usagef("--add-endpoint has an empty options segment in '%s'; omit it entirely if you do not need endpoint options", spec)
	case enforcement != "" && protocol == "":
		return nil, usagef("--add-endpoint cannot set enforcement without protocol in '%s'", spec)
	case access != "" && !slices.Contains([]string{"read-only", "read-write", "full"}, access):
		return nil, usagef("--add-endpoint access segment must be one of read-only, read-write, or full; got '%s' in '%s'", access, spec)
	case protocol != "" && !slices.Contains([]string{"tcp", "rest", "websocket", "sql"}, protocol):
		return nil, usagef("--add-endpoint protocol segment must be 'tcp', 'rest', 'websocket', or 'sql'; got '%s' in '%s'", protocol, spec)
	case protocol == "tcp" && (access != "" || enforcement != ""):
		return nil, usagef("--add-endpoint protocol 'tcp' does not support access or enforcement in '%s'", spec)
	case enforcement != "" && enforcement != "enforce" && enforcement != "audit":
		return nil, usagef("--add-endpoint enforcement segment must be 'enforce' or 'audit'; got '%s' in '%s'", enforcement, spec)
	}
	ep := &sandboxv1.NetworkEndpoint{Host: host, Port: port, Ports: []uint32{port}, Protocol: protocol, Enforcement: enforcement, Access: access}
	if options == "" {
		return ep, nil
	}
	shown := protocol
	if shown == "" {
		shown = "<empty>"
	}
	for _, opt := range strings.Split(options, ",") {
		opt = strings.TrimSpace(opt)
		switch {
		case opt == "":
			return nil, usagef("--add-endpoint options segment must not contain empty options in '%s'", spec)
		case opt == "allow-uninspected-credentials":
			ep.AllowUninspectedCredentials = true
		case opt == "websocket-credential-rewrite":
			if protocol != "rest" && protocol != "websocket" {
				return nil, usagef("websocket-credential-rewrite endpoint option requires --add-endpoint protocol segment to be 'rest' or 'websocket'; got '%s' in '%s'", shown, spec)
			}
			ep.WebsocketCredentialRewrite = true
		case opt == "request-body-credential-rewrite":
			if protocol != "rest" {
				return nil, usagef("request-body-credential-rewrite endpoint option requires --add-endpoint protocol segment to be 'rest'; got '%s' in '%s'", shown, spec)
			}
			ep.RequestBodyCredentialRewrite = true
		case strings.HasPrefix(opt, "allowed-ip="):
			ip := strings.TrimSpace(strings.TrimPrefix(opt, "allowed-ip="))
			if ip == "" {
				return nil, usagef("--add-endpoint allowed-ip option must include a CIDR or IP value in '%s'", spec)
			}
			if strings.ContainsAny(ip, " \t\n\r") {
				return nil, usagef("--add-endpoint allowed-ip option must not contain whitespace in '%s'", spec)
			}
			if !slices.Contains(ep.AllowedIps, ip) {
				ep.AllowedIps = append(ep.AllowedIps, ip)
			}
		default:
			return nil, usagef("--add-endpoint options segment supports only 'allow-uninspected-credentials', 'websocket-credential-rewrite', 'request-body-credential-rewrite', and 'allowed-ip=<CIDR-or-IP>'; got '%s' in '%s'", opt, spec)
		}
	}
	return ep, nil
}

// l7Group is the method/path rules of one host:port, in flag order.
type l7Group struct {
	host  string
	port  uint32
	rules [][2]string // method, path
}

// groupL7Specs parses host:port:METHOD:path_glob specs grouped by
// host:port, sorted by host then port (OpenShell's order).
func groupL7Specs(flag string, specs []string) ([]*l7Group, error) {
	var groups []*l7Group
	for _, spec := range specs {
		parts := strings.Split(spec, ":")
		if len(parts) != 4 {
			return nil, usagef("%s expects host:port:METHOD:path_glob, got '%s'", flag, spec)
		}
		host, err := parseSpecHost(flag, spec, parts[0])
		if err != nil {
			return nil, err
		}
		port, err := parseSpecPort(flag, spec, parts[1])
		if err != nil {
			return nil, err
		}
		method, path := strings.TrimSpace(parts[2]), strings.TrimSpace(parts[3])
		switch {
		case method == "":
			return nil, usagef("%s has an empty METHOD segment in '%s'", flag, spec)
		case strings.ContainsAny(method, " \t\n\r"):
			return nil, usagef("%s METHOD must not contain whitespace in '%s'", flag, spec)
		case path == "":
			return nil, usagef("%s has an empty path segment in '%s'", flag, spec)
		case !strings.HasPrefix(path, "/") && path != "**" && !strings.HasPrefix(path, "**/"):
			return nil, usagef("%s path must start with '/' or be '**', got '%s' in '%s'", flag, path, spec)
		}
		i := slices.IndexFunc(groups, func(g *l7Group) bool { return g.host == host && g.port == port })
		if i < 0 {
			groups = append(groups, &l7Group{host: host, port: port})
			i = len(groups) - 1
		}
		groups[i].rules = append(groups[i].rules, [2]string{strings.ToUpper(method), path})
	}
	slices.SortFunc(groups, func(a, b *l7Group) int {
		if c := strings.Compare(a.host, b.host); c != 0 {
			return c
		}
		return int(a.port) - int(b.port)
	})
	return groups, nil
}
