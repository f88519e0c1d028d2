package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// 'provider profile export|import|lint|update|delete' and 'provider
// refresh configure|rotate|status|delete', as OpenShell's CLI. Profile
// writes without --workspace go to the gateway's platform scope (visible
// in every workspace; a platform admin's call). No command prints
// refresh material or a credential value.

func (a *app) newProviderProfileCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "profile",
		Short: "Manage provider profiles: export built-in ones, import and maintain custom ones",
		Long: `Manage provider profiles. Custom profiles are imported into a workspace
(--workspace) or, without it, the platform scope (visible in every
workspace; platform admins only). Built-in profiles are read-only.`,
		RunE: groupRunE,
	}
	cmd.AddCommand(a.newProfileExportCmd(), a.newProfileImportCmd(false), a.newProfileImportCmd(true),
		a.newProfileUpdateCmd(), a.newProfileDeleteCmd())
	return cmd
}

func profileWhat(id string) string { return fmt.Sprintf("provider profile %q", id) }

func (a *app) newProfileExportCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "export ID",
		Short: "Print a profile as YAML (or -o json), ready to edit and import or update",
		Args:  argsUsage(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.gateway()
			if err != nil {
				return err
			}
			resp, err := c.GetProviderProfile(cmd.Context(), &openshellv1.GetProviderProfileRequest{Id: args[0], Workspace: a.ws()})
			if err != nil {
				return a.rpcError(err, profileWhat(args[0]))
			}
			b, err := marshalProto(resp.GetProfile(), cmpOr(a.output, "yaml"))
			if err != nil {
				return err
			}
			_, err = a.stdout.Write(b)
			return err
		},
	}
}

func cmpOr(a, b string) string {
	if a != "" && a != "table" {
		return a
	}
	return b
}

// readProfiles reads profile files (YAML or JSON): the files given, and
// the *.yaml, *.yml and *.json files directly in dir.
func readProfiles(files []string, dir string) ([]*openshellv1.ProviderProfileImportItem, error) {
	if dir != "" {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return nil, usagef("--from %s: %v", dir, err)
		}
		for _, e := range entries {
			if ext := filepath.Ext(e.Name()); !e.IsDir() && slices.Contains([]string{".yaml", ".yml", ".json"}, ext) {
				files = append(files, filepath.Join(dir, e.Name()))
			}
		}
	}
	if len(files) == 0 {
		return nil, usagef("give profile files with -f FILE or a directory with --from DIR")
	}
	var items []*openshellv1.ProviderProfileImportItem
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, usagef("%v", err)
		}
		j, err := yaml.YAMLToJSON(b)
		if err != nil {
			return nil, usagef("%s: %v", f, err)
		}
		p := &openshellv1.ProviderProfile{}
		if err := protojson.Unmarshal(j, p); err != nil {
			return nil, usagef("%s: not a provider profile: %v", f, err)
		}
		items = append(items, &openshellv1.ProviderProfileImportItem{Profile: p, Source: f})
	}
	return items, nil
}

// printDiagnostics writes diagnostics to stderr, one a line.
func (a *app) printDiagnostics(ds []*openshellv1.ProviderProfileDiagnostic) {
	for _, d := range ds {
		where := d.GetSource()
		if d.GetProfileId() != "" {
			where += " " + d.GetProfileId()
		}
		if d.GetField() != "" {
			where += " " + d.GetField()
		}
		_, _ = fmt.Fprintf(a.stderr, "%s: %s: %s\n", d.GetSeverity(), strings.TrimSpace(where), d.GetMessage())
	}
}

// newProfileImportCmd is 'profile import' or, with lint, 'profile lint'.
func (a *app) newProfileImportCmd(lint bool) *cobra.Command {
	var (
		files []string
		dir   string
	)
	verb, short := "import", "Import custom profiles (all or none); an existing id is refused"
	if lint {
		verb, short = "lint", "Check profiles as an import would, storing nothing"
	}
	cmd := &cobra.Command{
		Use:   verb + " (-f FILE... | --from DIR)",
		Short: short,
		Args:  argsUsage(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			items, err := readProfiles(files, dir)
			if err != nil {
				return err
			}
			c, err := a.gateway()
			if err != nil {
				return err
			}
			if lint {
				resp, err := c.LintProviderProfiles(cmd.Context(), &openshellv1.LintProviderProfilesRequest{Profiles: items, Workspace: a.ws()})
				if err != nil {
					return a.rpcError(err, "")
				}
				a.printDiagnostics(resp.GetDiagnostics())
				if !resp.GetValid() {
					return fmt.Errorf("%d profile(s) are not valid", len(items))
				}
				_, _ = fmt.Fprintf(a.stdout, "%d profile(s) valid\n", len(items))
				return nil
			}
			resp, err := c.ImportProviderProfiles(cmd.Context(), &openshellv1.ImportProviderProfilesRequest{Profiles: items, Workspace: a.ws()})
			if err != nil {
				return a.rpcError(err, "")
			}
			a.printDiagnostics(resp.GetDiagnostics())
			if !resp.GetImported() {
				return fmt.Errorf("nothing imported")
			}
			for _, p := range resp.GetProfiles() {
				_, _ = fmt.Fprintf(a.stdout, "Imported provider profile %s\n", p.GetId())
			}
			return nil
		},
	}
	cmd.Flags().StringArrayVarP(&files, "file", "f", nil, "profile file (YAML or JSON); repeatable")
	cmd.Flags().StringVar(&dir, "from", "", "directory of profile files (*.yaml, *.yml, *.json, not recursive)")
	return cmd
}

func (a *app) newProfileUpdateCmd() *cobra.Command {
	var file string
	cmd := &cobra.Command{
		Use:   "update ID -f FILE",
		Short: "Replace a custom profile with an edited export (its resource_version must be current)",
		Args:  argsUsage(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if file == "" {
				return usagef("give the edited profile with -f FILE")
			}
			items, err := readProfiles([]string{file}, "")
			if err != nil {
				return err
			}
			c, err := a.gateway()
			if err != nil {
				return err
			}
			resp, err := c.UpdateProviderProfiles(cmd.Context(), &openshellv1.UpdateProviderProfilesRequest{Id: args[0], Profile: items[0], Workspace: a.ws()})
			if err != nil {
				return a.rpcError(err, profileWhat(args[0]))
			}
			a.printDiagnostics(resp.GetDiagnostics())
			if !resp.GetUpdated() {
				return fmt.Errorf("provider profile %s not updated", args[0])
			}
			_, _ = fmt.Fprintf(a.stdout, "Updated provider profile %s\n", args[0])
			return nil
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "the edited profile (YAML or JSON)")
	return cmd
}

func (a *app) newProfileDeleteCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "delete ID...",
		Short: "Delete custom profiles no provider uses",
		Args:  argsUsage(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.gateway()
			if err != nil {
				return err
			}
			for _, id := range args {
				if _, err := c.DeleteProviderProfile(cmd.Context(), &openshellv1.DeleteProviderProfileRequest{Id: id, Workspace: a.ws()}); err != nil {
					return a.rpcError(err, profileWhat(id))
				}
				_, _ = fmt.Fprintf(a.stdout, "Deleted provider profile %s\n", id)
			}
			return nil
		},
	}
}

func (a *app) newProviderRefreshCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "refresh",
		Short: "Manage credentials the gateway mints with OAuth2 (refresh token, client credentials)",
		RunE:  groupRunE,
	}
	cmd.AddCommand(a.newRefreshConfigureCmd(), a.newRefreshKeyCmd("rotate"), a.newRefreshStatusCmd(), a.newRefreshKeyCmd("delete"))
	return cmd
}

// refreshStrategies are the CLI names of the strategies.
var refreshStrategies = map[string]openshellv1.ProviderCredentialRefreshStrategy{
	"oauth2-refresh-token":       openshellv1.ProviderCredentialRefreshStrategy_PROVIDER_CREDENTIAL_REFRESH_STRATEGY_OAUTH2_REFRESH_TOKEN,
	"oauth2-client-credentials":  openshellv1.ProviderCredentialRefreshStrategy_PROVIDER_CREDENTIAL_REFRESH_STRATEGY_OAUTH2_CLIENT_CREDENTIALS,
	"google-service-account-jwt": openshellv1.ProviderCredentialRefreshStrategy_PROVIDER_CREDENTIAL_REFRESH_STRATEGY_GOOGLE_SERVICE_ACCOUNT_JWT,
	"aws-sts-assume-role":        openshellv1.ProviderCredentialRefreshStrategy_PROVIDER_CREDENTIAL_REFRESH_STRATEGY_AWS_STS_ASSUME_ROLE,
}

// parseExpiry reads epoch milliseconds or an RFC 3339 time.
func parseExpiry(s string) (int64, error) {
	if ms, err := strconv.ParseInt(s, 10, 64); err == nil {
		return ms, nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return 0, usagef("--credential-expires-at %q: want epoch milliseconds or an RFC 3339 time", s)
	}
	return t.UnixMilli(), nil
}

func (a *app) newRefreshConfigureCmd() *cobra.Command {
	var (
		key, strategy, expires      string
		material, secretKeys, fromE []string
	)
	cmd := &cobra.Command{
		Use:   "configure PROVIDER --credential-key KEY --strategy STRATEGY [--material K=V...] [--secret-material-env K=ENV...]",
		Short: "Configure how the gateway mints a provider credential",
		Long: `Configure how the gateway mints a provider credential. Strategies:
oauth2-refresh-token (material client_id, refresh_token, optional
client_secret) and oauth2-client-credentials (client_id, client_secret); the
token endpoint comes from the provider's profile. --secret-material-env
K=ENV reads a secret from openshell's environment, so it stays out of shell
history. The first value is minted by 'provider refresh rotate'.`,
		Args:              argsUsage(cobra.ExactArgs(1)),
		ValidArgsFunction: a.completeProviders,
		RunE: func(cmd *cobra.Command, args []string) error {
			st, ok := refreshStrategies[strategy]
			if !ok {
				return usagef("--strategy %q: want one of oauth2-refresh-token, oauth2-client-credentials, google-service-account-jwt, aws-sts-assume-role", strategy)
			}
			if key == "" {
				return usagef("--credential-key is required")
			}
			req := &openshellv1.ConfigureProviderRefreshRequest{Provider: args[0], CredentialKey: key, Strategy: st, Material: map[string]string{}, SecretMaterialKeys: secretKeys, Workspace: a.ws()}
			for _, kv := range material {
				k, v, ok := strings.Cut(kv, "=")
				if !ok || k == "" {
					return usagef("--material takes KEY=VALUE")
				}
				req.Material[k] = v
			}
			for _, kv := range fromE {
				k, env, ok := strings.Cut(kv, "=")
				v, set := a.lookupEnv(env)
				if !ok || k == "" || !set {
					return usagef("--secret-material-env %q: want KEY=ENV with ENV set in openshell's environment", kv)
				}
				req.Material[k] = v
				req.SecretMaterialKeys = append(req.SecretMaterialKeys, k)
			}
			if expires != "" {
				ms, err := parseExpiry(expires)
				if err != nil {
					return err
				}
				req.ExpiresAtMs = &ms
			}
			c, err := a.gateway()
			if err != nil {
				return err
			}
			resp, err := c.ConfigureProviderRefresh(cmd.Context(), req)
			if err != nil {
				return a.rpcError(err, providerWhat(args[0]))
			}
			_, _ = fmt.Fprintf(a.stdout, "Configured refresh of %s for provider %s (%s)\n", key, args[0], resp.GetStatus().GetStatus())
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&key, "credential-key", "", "the credential (environment variable name) to mint")
	f.StringVar(&strategy, "strategy", "", "oauth2-refresh-token or oauth2-client-credentials")
	f.StringArrayVar(&material, "material", nil, "refresh material KEY=VALUE; repeatable")
	f.StringArrayVar(&secretKeys, "secret-material-key", nil, "a --material key whose value is secret (sealed); repeatable")
	f.StringArrayVar(&fromE, "secret-material-env", nil, "secret material KEY=ENV read from openshell's environment; repeatable")
	f.StringVar(&expires, "credential-expires-at", "", "the current value's expiry: epoch milliseconds or RFC 3339")
	return cmd
}

// newRefreshKeyCmd is 'refresh rotate' or 'refresh delete'.
func (a *app) newRefreshKeyCmd(verb string) *cobra.Command {
	var key string
	short := "Mint a new value now (a failure revokes the current one)"
	if verb == "delete" {
		short = "Delete a credential's refresh configuration and material"
	}
	cmd := &cobra.Command{
		Use:               verb + " PROVIDER --credential-key KEY",
		Short:             short,
		Args:              argsUsage(cobra.ExactArgs(1)),
		ValidArgsFunction: a.completeProviders,
		RunE: func(cmd *cobra.Command, args []string) error {
			if key == "" {
				return usagef("--credential-key is required")
			}
			c, err := a.gateway()
			if err != nil {
				return err
			}
			if verb == "delete" {
				resp, err := c.DeleteProviderRefresh(cmd.Context(), &openshellv1.DeleteProviderRefreshRequest{Provider: args[0], CredentialKey: key, Workspace: a.ws()})
				if err != nil {
					return a.rpcError(err, providerWhat(args[0]))
				}
				if !resp.GetDeleted() {
					_, _ = fmt.Fprintf(a.stdout, "No refresh configuration found for provider '%s' credential '%s'.\n", args[0], key)
					return nil
				}
				_, _ = fmt.Fprintf(a.stdout, "Deleted refresh of %s for provider %s\n", key, args[0])
				return nil
			}
			resp, err := c.RotateProviderCredential(cmd.Context(), &openshellv1.RotateProviderCredentialRequest{Provider: args[0], CredentialKey: key, Workspace: a.ws()})
			if err != nil {
				return a.rpcError(err, providerWhat(args[0]))
			}
			_, _ = fmt.Fprintf(a.stdout, "Rotated %s of provider %s (expires %s)\n", key, args[0], msTime(resp.GetStatus().GetExpiresAtMs()))
			return nil
		},
	}
	cmd.Flags().StringVar(&key, "credential-key", "", "the refreshed credential")
	return cmd
}

// msTime prints epoch milliseconds as UTC, or "-".
func msTime(ms int64) string {
	if ms <= 0 {
		return "-"
	}
	return time.UnixMilli(ms).UTC().Format("2006-01-02 15:04:05")
}

func (a *app) newRefreshStatusCmd() *cobra.Command {
	var key string
	cmd := &cobra.Command{
		Use:               "status PROVIDER [--credential-key KEY]",
		Short:             "Show refresh status (never values or material)",
		Args:              argsUsage(cobra.ExactArgs(1)),
		ValidArgsFunction: a.completeProviders,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.gateway()
			if err != nil {
				return err
			}
			resp, err := c.GetProviderRefreshStatus(cmd.Context(), &openshellv1.GetProviderRefreshStatusRequest{Provider: args[0], CredentialKey: key, Workspace: a.ws()})
			if err != nil {
				return a.rpcError(err, providerWhat(args[0]))
			}
			if a.structured() {
				return a.printProto(resp)
			}
			if len(resp.GetCredentials()) == 0 {
				if key != "" {
					_, _ = fmt.Fprintf(a.stdout, "No refresh configuration found for provider '%s' credential '%s'.\n", args[0], key)
				} else {
					_, _ = fmt.Fprintf(a.stdout, "No refresh configurations found for provider '%s'.\n", args[0])
				}
				return nil
			}
			tw := newTable(a.stdout)
			_, _ = fmt.Fprintln(tw, "PROVIDER\tCREDENTIAL_KEY\tSTRATEGY\tSTATUS\tEXPIRES_AT\tNEXT_REFRESH\tLAST_REFRESH\tLAST_ERROR")
			for _, s := range resp.GetCredentials() {
				strategyName := strings.ToLower(strings.TrimPrefix(s.GetStrategy().String(), "PROVIDER_CREDENTIAL_REFRESH_STRATEGY_"))
				_, _ = fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.GetProviderName(), s.GetCredentialKey(), strategyName, s.GetStatus(),
					msTime(s.GetExpiresAtMs()), msTime(s.GetNextRefreshAtMs()), msTime(s.GetLastRefreshAtMs()), orDash(s.GetLastError()))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVar(&key, "credential-key", "", "one credential (default: every refreshed credential of the provider)")
	return cmd
}
