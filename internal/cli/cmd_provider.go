package cli

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// The provider commands follow OpenShell's CLI: 'provider create --name N
// --type T --credential KEY[=VALUE] --config KEY=VALUE', 'provider
// list-profiles', 'sandbox provider list|attach|detach'. No command prints
// a credential value: the gateway answers with REDACTED and the CLI
// redacts again before printing; errors name keys, never values.

const redacted = "REDACTED"

// envNameRE is the shape of the conventional environment variable names
// (upper case) a bare --credential KEY may be echoed as in errors; anything
// else might be a value typed without its key.
var envNameRE = regexp.MustCompile(`^[A-Z_][A-Z0-9_]*$`)

func providerWhat(name string) string { return fmt.Sprintf("provider %q", name) }

func (a *app) newProviderCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "provider",
		Short: "Manage providers: named credentials and configuration for sandboxes",
		Long: `Manage providers: named sets of credentials (API keys, tokens) and plain
configuration that sandboxes use. The gateway keeps the credential values; a
sandbox sees only placeholders, and no command prints a value.`,
		RunE: groupRunE,
	}
	cmd.AddCommand(a.newProviderCreateCmd(), a.newProviderGetCmd(), a.newProviderListCmd(),
		a.newProviderUpdateCmd(), a.newProviderDeleteCmd(), a.newProviderListProfilesCmd(),
		a.newProviderProfileCmd(), a.newProviderRefreshCmd())
	return cmd
}

// parseCredentials parses --credential flags: KEY=VALUE, or a bare KEY whose
// value is read from openshell's own environment. Its errors never contain a
// value.
// parseCredentialsConfig parses the --credential and --config values of
// provider create and update.
func (a *app) parseCredentialsConfig(creds, config []string) (cr, cfg map[string]string, err error) {
	if cr, err = a.parseCredentials(creds); err != nil {
		return nil, nil, err
	}
	if cfg, err = parseKV("config", config); err != nil {
		return nil, nil, err
	}
	return cr, cfg, nil
}

func (a *app) parseCredentials(vals []string) (map[string]string, error) {
	if len(vals) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(vals))
	for i, v := range vals {
		k, val, hasValue := strings.Cut(v, "=")
		if k == "" {
			return nil, usagef("invalid --credential (#%d): the key is empty (want KEY=VALUE or KEY)", i+1)
		}
		if !hasValue {
			env, ok := a.lookupEnv(k)
			if !ok {
				if !envNameRE.MatchString(k) {
					// Perhaps a value given without its key: do not echo it.
					return nil, usagef("invalid --credential (#%d, not shown): want KEY=VALUE, or KEY naming a set environment variable", i+1)
				}
				return nil, usagef("--credential %s: environment variable %s is not set (give KEY=VALUE or export %s)", k, k, k)
			}
			val = env
		}
		if _, dup := m[k]; dup {
			return nil, usagef("--credential %s given more than once", k)
		}
		m[k] = val
	}
	return m, nil
}

// fromExisting collects, for --from-existing, the credentials of provider
// type typ found in openshell's own environment: each environment variable
// the type's profile names for a credential, keyed by the variable's name.
// explicit (--credential) entries win over discovered ones.
func (a *app) fromExisting(cmd *cobra.Command, c openshellv1.OpenShellClient, typ string, explicit map[string]string) (map[string]string, error) {
	resp, err := c.GetProviderProfile(cmd.Context(), &openshellv1.GetProviderProfileRequest{Id: typ, Workspace: a.ws()})
	if err != nil {
		return nil, a.rpcError(err, fmt.Sprintf("provider profile %q", typ))
	}
	out := make(map[string]string, len(explicit))
	var names []string
	for _, cr := range resp.GetProfile().GetCredentials() {
		for _, env := range cr.GetEnvVars() {
			names = append(names, env)
			if v, ok := a.lookupEnv(env); ok && v != "" {
				out[env] = v
			}
		}
	}
	if len(out) == 0 {
		if len(names) == 0 {
			return nil, usagef("--from-existing: provider type %s names no environment variables; give --credential KEY=VALUE", typ)
		}
		return nil, usagef("--from-existing: none of the environment variables of provider type %s is set (%s)", typ, strings.Join(names, ", "))
	}
	for k, v := range explicit {
		out[k] = v
	}
	return out, nil
}

// redactProvider returns a copy of p whose credential values are REDACTED,
// whatever the gateway sent.
func redactProvider(p *datamodelv1.Provider) *datamodelv1.Provider {
	if p == nil {
		return nil
	}
	c := proto.Clone(p).(*datamodelv1.Provider)
	for k := range c.Credentials {
		c.Credentials[k] = redacted
	}
	c.CredentialHandles = nil
	return c
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func keyList[V any](m map[string]V) string {
	return orDash(strings.Join(sortedKeys(m), ","))
}

func (a *app) printProviderDetail(p *datamodelv1.Provider) error {
	if a.structured() {
		return a.printProto(redactProvider(p))
	}
	md := p.GetMetadata()
	tw := newTable(a.stdout)
	_, _ = fmt.Fprintf(tw, "Name:\t%s\nId:\t%s\nType:\t%s\n", md.GetName(), orDash(md.GetId()), p.GetType())
	if md.GetWorkspace() != "" {
		_, _ = fmt.Fprintf(tw, "Workspace:\t%s\n", md.GetWorkspace())
	}
	_, _ = fmt.Fprintf(tw, "Credential keys:\t%s\n", keyList(p.GetCredentials()))
	_, _ = fmt.Fprintf(tw, "Config:\t%s\n", orDash(formatMap(p.GetConfig())))
	for _, k := range sortedKeys(p.GetCredentialExpiresAtMs()) {
		_, _ = fmt.Fprintf(tw, "Expires %s:\t%s\n", k, time.UnixMilli(p.GetCredentialExpiresAtMs()[k]).UTC().Format(time.RFC3339))
	}
	_, _ = fmt.Fprintf(tw, "Resource version:\t%d\n", md.GetResourceVersion())
	if md.GetCreatedAtMs() != 0 {
		_, _ = fmt.Fprintf(tw, "Created:\t%s (%s ago)\n", time.UnixMilli(md.GetCreatedAtMs()).UTC().Format(time.RFC3339), a.age(md.GetCreatedAtMs()))
	}
	return tw.Flush()
}

func (a *app) printProviderTable(ps []*datamodelv1.Provider, withWorkspace bool) error {
	tw := newTable(a.stdout)
	header := "NAME\tTYPE\tCREDENTIAL_KEYS\tCONFIG_KEYS\tAGE"
	if withWorkspace {
		header = "WORKSPACE\t" + header
	}
	_, _ = fmt.Fprintln(tw, header)
	for _, p := range ps {
		md := p.GetMetadata()
		row := []string{md.GetName(), p.GetType(), keyList(p.GetCredentials()), keyList(p.GetConfig()), a.age(md.GetCreatedAtMs())}
		if withWorkspace {
			row = append([]string{orDash(md.GetWorkspace())}, row...)
		}
		_, _ = fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	return tw.Flush()
}

func (a *app) newProviderCreateCmd() *cobra.Command {
	var (
		name, typ     string
		creds, config []string
		existing      bool
	)
	cmd := &cobra.Command{
		Use:   "create [NAME] --type TYPE [--credential KEY[=VALUE]...] [--config KEY=VALUE...]",
		Short: "Create a provider",
		Long: `Create a provider. --type names a provider profile ('openshell provider
list-profiles'). --credential KEY=VALUE stores a credential; a bare
--credential KEY takes the value of the environment variable KEY of this
process, which keeps the value off the command line. --from-existing takes
every credential of the type's profile that is set in the environment of
this process, under the profile's environment variable names
('openshell provider list-profiles -o yaml' shows them).`,
		Example: "  export OPENAI_API_KEY=...\n  openshell provider create work-openai --type openai --credential OPENAI_API_KEY\n  openshell provider create --name gh --type github --credential GITHUB_TOKEN --config org=acme",
		Args:    argsUsage(cobra.MaximumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := nameFromArgOrFlag("provider", args, name, "a provider name is required: openshell provider create NAME --type TYPE")
			if err != nil {
				return err
			}
			if typ == "" {
				return usagef("--type is required ('openshell provider list-profiles' lists the types)")
			}
			cr, cfg, err := a.parseCredentialsConfig(creds, config)
			if err != nil {
				return err
			}
			c, err := a.gateway()
			if err != nil {
				return err
			}
			if existing {
				if cr, err = a.fromExisting(cmd, c, typ, cr); err != nil {
					return err
				}
			}
			resp, err := c.CreateProvider(cmd.Context(), &openshellv1.CreateProviderRequest{
				Workspace: a.ws(),
				Provider: &datamodelv1.Provider{
					Metadata:    &datamodelv1.ObjectMeta{Name: name},
					Type:        typ,
					Credentials: cr,
					Config:      cfg,
				},
			})
			if err != nil {
				return a.rpcError(err, providerWhat(name))
			}
			if a.structured() {
				return a.printProto(redactProvider(resp.GetProvider()))
			}
			_, _ = fmt.Fprintf(a.stdout, "Created provider %s\n", resp.GetProvider().GetMetadata().GetName())
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&name, "name", "", "provider name")
	f.StringVar(&typ, "type", "", "provider type: a profile id such as openai, anthropic, github")
	f.StringArrayVar(&creds, "credential", nil, "credential KEY=VALUE, or KEY to read the value from the environment (repeatable)")
	f.StringArrayVar(&config, "config", nil, "configuration KEY=VALUE (repeatable)")
	f.BoolVar(&existing, "from-existing", false, "read the type's credentials from this process's environment")
	_ = cmd.RegisterFlagCompletionFunc("type", a.completeProviderTypes)
	return cmd
}

func (a *app) newProviderGetCmd() *cobra.Command {
	return &cobra.Command{
		Use:               "get NAME",
		Short:             "Show one provider (credential keys, never values)",
		Args:              argsUsage(cobra.ExactArgs(1)),
		ValidArgsFunction: a.completeProviders,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.gateway()
			if err != nil {
				return err
			}
			resp, err := c.GetProvider(cmd.Context(), &openshellv1.GetProviderRequest{Name: args[0], Workspace: a.ws()})
			if err != nil {
				return a.rpcError(err, providerWhat(args[0]))
			}
			return a.printProviderDetail(resp.GetProvider())
		},
	}
}

func (a *app) newProviderListCmd() *cobra.Command {
	var (
		limit, offset uint32
		all, names    bool
	)
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List providers",
		Args:    argsUsage(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.gateway()
			if err != nil {
				return err
			}
			resp, err := c.ListProviders(cmd.Context(), &openshellv1.ListProvidersRequest{Limit: limit, Offset: offset, Workspace: a.ws(), AllWorkspaces: all})
			if err != nil {
				return a.rpcError(err, "")
			}
			ps := resp.GetProviders()
			if a.structured() {
				out := &openshellv1.ListProvidersResponse{}
				for _, p := range ps {
					out.Providers = append(out.Providers, redactProvider(p))
				}
				return a.printProto(out)
			}
			if names {
				for _, p := range ps {
					_, _ = fmt.Fprintln(a.stdout, p.GetMetadata().GetName())
				}
				return nil
			}
			if len(ps) == 0 {
				_, _ = fmt.Fprintln(a.stderr, "No providers found")
				return nil
			}
			return a.printProviderTable(ps, all)
		},
	}
	f := cmd.Flags()
	f.Uint32Var(&limit, "limit", 100, "maximum number of providers to return")
	f.Uint32Var(&offset, "offset", 0, "offset into the provider list")
	f.BoolVarP(&all, "all-workspaces", "A", false, "list the providers of every workspace (platform admin)")
	f.BoolVar(&names, "names", false, "print only provider names")
	return cmd
}

func (a *app) newProviderUpdateCmd() *cobra.Command {
	var (
		creds, config []string
		existing      bool
	)
	cmd := &cobra.Command{
		Use:   "update NAME [--credential KEY[=VALUE]...] [--config KEY=VALUE...] [--from-existing]",
		Short: "Change a provider's credentials or configuration",
		Long: `Change a provider's credentials or configuration, key by key: keys not named
keep their values. --credential KEY=VALUE sets a credential, a bare
--credential KEY takes the value of the environment variable KEY of this
process, and KEY= (empty value) removes the key; the same holds for --config.
--from-existing sets every credential of the provider's type that is set in
the environment of this process. The type cannot change.`,
		Example:           "  openshell provider update work-openai --credential OPENAI_API_KEY\n  openshell provider update gh --config org=",
		Args:              argsUsage(cobra.ExactArgs(1)),
		ValidArgsFunction: a.completeProviders,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(creds) == 0 && len(config) == 0 && !existing {
				return usagef("nothing to update: give --credential, --config or --from-existing")
			}
			cr, cfg, err := a.parseCredentialsConfig(creds, config)
			if err != nil {
				return err
			}
			c, err := a.gateway()
			if err != nil {
				return err
			}
			if existing {
				cur, err := c.GetProvider(cmd.Context(), &openshellv1.GetProviderRequest{Name: args[0], Workspace: a.ws()})
				if err != nil {
					return a.rpcError(err, providerWhat(args[0]))
				}
				if cr, err = a.fromExisting(cmd, c, cur.GetProvider().GetType(), cr); err != nil {
					return err
				}
			}
			resp, err := c.UpdateProvider(cmd.Context(), &openshellv1.UpdateProviderRequest{
				Workspace: a.ws(),
				Provider: &datamodelv1.Provider{
					Metadata:    &datamodelv1.ObjectMeta{Name: args[0]},
					Credentials: cr,
					Config:      cfg,
				},
			})
			if err != nil {
				return a.rpcError(err, providerWhat(args[0]))
			}
			if a.structured() {
				return a.printProto(redactProvider(resp.GetProvider()))
			}
			_, _ = fmt.Fprintf(a.stdout, "Updated provider %s\n", args[0])
			return nil
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&creds, "credential", nil, "credential KEY=VALUE, KEY to read the value from the environment, or KEY= to remove it (repeatable)")
	f.StringArrayVar(&config, "config", nil, "configuration KEY=VALUE, or KEY= to remove it (repeatable)")
	f.BoolVar(&existing, "from-existing", false, "read the type's credentials from this process's environment")
	return cmd
}

func (a *app) newProviderDeleteCmd() *cobra.Command {
	return &cobra.Command{
		Use:               "delete NAME...",
		Aliases:           []string{"rm"},
		Short:             "Delete providers",
		Args:              argsUsage(cobra.MinimumNArgs(1)),
		ValidArgsFunction: a.completeProviders,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.gateway()
			if err != nil {
				return err
			}
			return a.deleteEach(args, "provider", func(name string) error {
				resp, err := c.DeleteProvider(cmd.Context(), &openshellv1.DeleteProviderRequest{Name: name, Workspace: a.ws()})
				if err == nil && !resp.GetDeleted() {
					err = status.Error(codes.NotFound, "provider not found")
				}
				if err != nil {
					return a.rpcError(err, providerWhat(name))
				}
				return nil
			})
		},
	}
}

func (a *app) newProviderListProfilesCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "list-profiles",
		Short: "List the provider types (profiles) the gateway knows",
		Long: `List the provider types (profiles) the gateway knows: the values --type
accepts. In the CREDENTIALS column a '*' marks a required credential.`,
		Args: argsUsage(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.gateway()
			if err != nil {
				return err
			}
			resp, err := c.ListProviderProfiles(cmd.Context(), &openshellv1.ListProviderProfilesRequest{Limit: 1000, Workspace: a.ws()})
			if err != nil {
				return a.rpcError(err, "")
			}
			if a.structured() {
				return a.printProto(resp)
			}
			tw := newTable(a.stdout)
			_, _ = fmt.Fprintln(tw, "ID\tNAME\tCREDENTIALS\tENDPOINTS")
			for _, p := range resp.GetProfiles() {
				var cr []string
				for _, c := range p.GetCredentials() {
					n := c.GetName()
					if c.GetRequired() {
						n += "*"
					}
					cr = append(cr, n)
				}
				_, _ = fmt.Fprintf(tw, "%s\t%s\t%s\t%d\n", p.GetId(), orDash(p.GetDisplayName()), orDash(strings.Join(cr, ",")), len(p.GetEndpoints()))
			}
			return tw.Flush()
		},
	}
}

// newSandboxProviderCmd is 'sandbox provider list|attach|detach'.
func (a *app) newSandboxProviderCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "provider",
		Short: "List, attach and detach a sandbox's providers",
		RunE:  groupRunE,
	}
	list := &cobra.Command{
		Use:               "list SANDBOX",
		Aliases:           []string{"ls"},
		Short:             "List the providers attached to a sandbox",
		Args:              argsUsage(cobra.ExactArgs(1)),
		ValidArgsFunction: a.completeSandboxes,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.gateway()
			if err != nil {
				return err
			}
			resp, err := c.ListSandboxProviders(cmd.Context(), &openshellv1.ListSandboxProvidersRequest{SandboxName: args[0], Workspace: a.ws()})
			if err != nil {
				return a.rpcError(err, sandboxWhat(args[0]))
			}
			ps := resp.GetProviders()
			if a.structured() {
				out := &openshellv1.ListSandboxProvidersResponse{}
				for _, p := range ps {
					out.Providers = append(out.Providers, redactProvider(p))
				}
				return a.printProto(out)
			}
			if len(ps) == 0 {
				_, _ = fmt.Fprintf(a.stderr, "No providers attached to sandbox %s\n", args[0])
				return nil
			}
			return a.printProviderTable(ps, false)
		},
	}
	attachDetach := func(verb string) *cobra.Command {
		return &cobra.Command{
			Use:               verb + " SANDBOX PROVIDER",
			Short:             strings.ToUpper(verb[:1]) + verb[1:] + " a provider " + map[string]string{"attach": "to", "detach": "from"}[verb] + " a sandbox",
			Args:              argsUsage(cobra.ExactArgs(2)),
			ValidArgsFunction: a.completeSandboxThenProvider,
			RunE: func(cmd *cobra.Command, args []string) error {
				c, err := a.gateway()
				if err != nil {
					return err
				}
				sb, prov := args[0], args[1]
				var changed bool
				if verb == "attach" {
					resp, err := c.AttachSandboxProvider(cmd.Context(), &openshellv1.AttachSandboxProviderRequest{SandboxName: sb, ProviderName: prov, Workspace: a.ws()})
					if err != nil {
						return a.rpcError(err, sandboxWhat(sb))
					}
					changed = resp.GetAttached()
				} else {
					resp, err := c.DetachSandboxProvider(cmd.Context(), &openshellv1.DetachSandboxProviderRequest{SandboxName: sb, ProviderName: prov, Workspace: a.ws()})
					if err != nil {
						return a.rpcError(err, sandboxWhat(sb))
					}
					changed = resp.GetDetached()
				}
				switch {
				case changed && verb == "attach":
					_, _ = fmt.Fprintf(a.stdout, "Attached provider %s to sandbox %s\n", prov, sb)
				case changed:
					_, _ = fmt.Fprintf(a.stdout, "Detached provider %s from sandbox %s\n", prov, sb)
				case verb == "attach":
					_, _ = fmt.Fprintf(a.stdout, "Provider %s is already attached to sandbox %s\n", prov, sb)
				default:
					_, _ = fmt.Fprintf(a.stdout, "Provider %s is not attached to sandbox %s\n", prov, sb)
				}
				return nil
			},
		}
	}
	cmd.AddCommand(list, attachDetach("attach"), attachDetach("detach"))
	return cmd
}

// completeNames completes names from the gateway with list; when the
// gateway cannot be asked, it offers nothing (and no file names).
func (a *app) completeNames(cmd *cobra.Command, toComplete string, list func(openshellv1.OpenShellClient) ([]string, error)) ([]cobra.Completion, cobra.ShellCompDirective) {
	if err := a.setup(cmd); err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	c, err := a.gateway()
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	names, err := list(c)
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var out []cobra.Completion
	for _, n := range names {
		if strings.HasPrefix(n, toComplete) {
			out = append(out, n)
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

func (a *app) completeProviders(cmd *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	return a.completeNames(cmd, toComplete, func(c openshellv1.OpenShellClient) ([]string, error) {
		resp, err := c.ListProviders(cmd.Context(), &openshellv1.ListProvidersRequest{Limit: 1000, Workspace: a.ws()})
		var out []string
		for _, p := range resp.GetProviders() {
			out = append(out, p.GetMetadata().GetName())
		}
		return out, err
	})
}

func (a *app) completeProviderTypes(cmd *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	return a.completeNames(cmd, toComplete, func(c openshellv1.OpenShellClient) ([]string, error) {
		resp, err := c.ListProviderProfiles(cmd.Context(), &openshellv1.ListProviderProfilesRequest{Limit: 1000, Workspace: a.ws()})
		var out []string
		for _, p := range resp.GetProfiles() {
			out = append(out, p.GetId())
		}
		return out, err
	})
}

func (a *app) completeSandboxes(cmd *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	return a.completeNames(cmd, toComplete, func(c openshellv1.OpenShellClient) ([]string, error) {
		resp, err := c.ListSandboxes(cmd.Context(), &openshellv1.ListSandboxesRequest{Limit: 1000, Workspace: a.ws()})
		var out []string
		for _, sb := range resp.GetSandboxes() {
			out = append(out, sb.GetMetadata().GetName())
		}
		return out, err
	})
}

func (a *app) completeSandboxThenProvider(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	switch len(args) {
	case 0:
		return a.completeSandboxes(cmd, args, toComplete)
	case 1:
		return a.completeProviders(cmd, args, toComplete)
	}
	return nil, cobra.ShellCompDirectiveNoFileComp
}
