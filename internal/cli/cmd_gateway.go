package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"
)

func (a *app) newGatewayCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "gateway",
		Aliases: []string{"gw"},
		Short:   "Manage the gateways this machine knows about",
		Long: `Manage the client-side gateway registry.

Gateways live under $XDG_CONFIG_HOME/openshell (default ~/.config/openshell);
entries under /etc/openshell (or $OPENSHELL_SYSTEM_GATEWAY_DIR) are read-only.`,
		RunE: groupRunE,
	}
	cmd.AddCommand(a.newGatewayAddCmd(), a.newGatewayListCmd(), a.newGatewaySelectCmd(), a.newGatewayRemoveCmd(), a.newGatewayInfoCmd(),
		a.newGatewayLoginCmd(), a.newGatewayLogoutCmd())
	return cmd
}

func (a *app) newGatewayAddCmd() *cobra.Command {
	var o addOptions
	cmd := &cobra.Command{
		Use:   "add NAME --endpoint URL [--ca FILE --cert FILE --key FILE | --insecure] [--oidc-issuer URL ...]",
		Short: "Register a gateway",
		Example: `  openshell gateway add prod --endpoint https://gw.example.com:17670 --ca ca.crt --cert tls.crt --key tls.key
  openshell gateway add dev --endpoint http://127.0.0.1:17670
  openshell gateway add corp --endpoint https://gw.example.com --oidc-issuer https://idp.example.com/realms/openshell`,
		Args: argsUsage(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Name = args[0]
			if o.Endpoint == "" {
				return usagef("--endpoint is required")
			}
			reg := a.newRegistry()
			e, err := reg.Add(o)
			if err != nil {
				return err
			}
			active := ""
			if reg.Active() == "" {
				if err := reg.Select(e.Name); err != nil {
					return err
				}
				active = " and selected it"
			}
			_, _ = fmt.Fprintf(a.stdout, "Registered gateway %q at %s%s\n", e.Name, e.Endpoint, active)
			if e.AuthMode == authModeOIDC {
				_, _ = fmt.Fprintf(a.stdout, "Log in with: openshell gateway login %s\n", e.Name)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Endpoint, "endpoint", "", "gateway URL: http://HOST:PORT, https://HOST:PORT or unix:///PATH")
	f.StringVar(&o.CA, "ca", "", "PEM file of the CA that signed the gateway's certificate")
	f.StringVar(&o.Cert, "cert", "", "PEM client certificate for mTLS")
	f.StringVar(&o.Key, "key", "", "PEM private key of the client certificate")
	f.BoolVar(&o.Insecure, "insecure", false, "do not verify the gateway's TLS certificate")
	f.StringVar(&o.OIDCIssuer, "oidc-issuer", "", "OIDC issuer URL: the gateway authenticates users by this issuer's tokens (auth_mode oidc; log in with 'gateway login')")
	f.StringVar(&o.OIDCClientID, "oidc-client-id", "", "OIDC client ID for 'gateway login' (default \"openshell-cli\")")
	f.StringVar(&o.OIDCAudience, "oidc-audience", "", "audience to request at login, when the issuer needs one")
	f.StringVar(&o.OIDCScopes, "oidc-scopes", "", "space-separated scopes to request at login and again at every refresh")
	return cmd
}

type gatewayView struct {
	Name     string `json:"name"`
	Endpoint string `json:"endpoint"`
	Auth     string `json:"auth"`
	Active   bool   `json:"active"`
	Source   string `json:"source"`
	Dir      string `json:"dir"`
	// Workspace is the default workspace set with 'workspace use'.
	Workspace string `json:"workspace,omitempty"`
}

func viewOf(e gatewayEntry, active string) gatewayView {
	auth := "none"
	switch {
	case e.AuthMode == authModeOIDC || e.AuthMode == authModeCloudflareJWT:
		auth = e.AuthMode
	case e.Insecure:
		auth = "tls (unverified)"
	case e.CertFile() != "":
		auth = "mtls"
	case strings.HasPrefix(e.Endpoint, "https://"):
		auth = "tls"
	}
	src := "user"
	if e.System {
		src = "system"
	}
	return gatewayView{Name: e.Name, Endpoint: e.Endpoint, Auth: auth, Active: e.Name == active, Source: src, Dir: e.Dir, Workspace: e.Workspace}
}

// printPlain prints v as JSON or YAML for -o json|yaml.
func (a *app) printPlain(v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if a.output == "yaml" {
		b, err = yaml.JSONToYAML(b)
		if err != nil {
			return err
		}
		_, err = a.stdout.Write(b)
		return err
	}
	_, err = fmt.Fprintf(a.stdout, "%s\n", b)
	return err
}

func (a *app) newGatewayListCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List registered gateways",
		Args:    argsUsage(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			reg := a.newRegistry()
			all, err := reg.List()
			if err != nil {
				return err
			}
			active := reg.Active()
			views := make([]gatewayView, len(all))
			for i, e := range all {
				views[i] = viewOf(e, active)
			}
			if a.structured() {
				return a.printPlain(views)
			}
			if len(views) == 0 {
				_, _ = fmt.Fprintln(a.stdout, "No gateways registered; openshell uses a local gateway on 127.0.0.1:17670.")
				_, _ = fmt.Fprintln(a.stdout, "Register one with: openshell gateway add NAME --endpoint URL")
				return nil
			}
			tw := newTable(a.stdout)
			_, _ = fmt.Fprintln(tw, "ACTIVE\tNAME\tENDPOINT\tAUTH\tSOURCE")
			for _, v := range views {
				mark := ""
				if v.Active {
					mark = "*"
				}
				_, _ = fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", mark, v.Name, v.Endpoint, v.Auth, v.Source)
			}
			return tw.Flush()
		},
	}
}

func (a *app) newGatewaySelectCmd() *cobra.Command {
	return &cobra.Command{
		Use:               "select NAME",
		ValidArgsFunction: a.completeGateways,
		Short:             "Make a gateway the default for later commands",
		Args:              argsUsage(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := a.newRegistry().Select(args[0]); err != nil {
				return err
			}
			_, _ = fmt.Fprintf(a.stdout, "Selected gateway %q\n", args[0])
			return nil
		},
	}
}

func (a *app) newGatewayRemoveCmd() *cobra.Command {
	return &cobra.Command{
		Use:               "remove NAME",
		ValidArgsFunction: a.completeGateways,
		Aliases:           []string{"rm"},
		Short:             "Forget a registered gateway and its certificates",
		Args:              argsUsage(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := a.newRegistry().Remove(args[0]); err != nil {
				return err
			}
			_, _ = fmt.Fprintf(a.stdout, "Removed gateway %q\n", args[0])
			return nil
		},
	}
}

func (a *app) newGatewayInfoCmd() *cobra.Command {
	return &cobra.Command{
		Use:               "info [NAME]",
		ValidArgsFunction: a.completeGateways,
		Short:             "Show a gateway's registration (default: the gateway commands would use)",
		Args:              argsUsage(cobra.MaximumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			reg := a.newRegistry()
			var t gatewayTarget
			if len(args) == 1 {
				e, err := reg.Get(args[0])
				if err != nil {
					return err
				}
				v := viewOf(e, reg.Active())
				if a.structured() {
					return a.printPlain(v)
				}
				tw := newTable(a.stdout)
				_, _ = fmt.Fprintf(tw, "Name:\t%s\nEndpoint:\t%s\nAuth:\t%s\nActive:\t%v\nSource:\t%s\nDirectory:\t%s\n", v.Name, v.Endpoint, v.Auth, v.Active, v.Source, v.Dir)
				if v.Workspace != "" {
					_, _ = fmt.Fprintf(tw, "Default workspace:\t%s\n", v.Workspace)
				}
				return tw.Flush()
			}
			t, err := a.resolveGateway()
			if err != nil {
				return err
			}
			view := map[string]any{"name": t.Name, "endpoint": t.Endpoint, "chosen_by": t.Source,
				"ca": t.CAFile, "client_cert": t.CertFile, "insecure": t.Insecure, "bearer_token": t.BearerToken != ""}
			if a.structured() {
				return a.printPlain(view)
			}
			tw := newTable(a.stdout)
			_, _ = fmt.Fprintf(tw, "Name:\t%s\nEndpoint:\t%s\nChosen by:\t%s\n", orDash(t.Name), t.Endpoint, t.Source)
			if t.CAFile != "" {
				_, _ = fmt.Fprintf(tw, "CA:\t%s\n", t.CAFile)
			}
			if t.CertFile != "" {
				_, _ = fmt.Fprintf(tw, "Client certificate:\t%s\n", t.CertFile)
			}
			if t.Insecure {
				_, _ = fmt.Fprintf(tw, "TLS verification:\tdisabled\n")
			}
			if t.BearerToken != "" {
				_, _ = fmt.Fprintf(tw, "Bearer token:\tOIDC access token from %s\n", a.newRegistry().oidcTokenPath(t.Name))
			}
			return tw.Flush()
		},
	}
}

// completeGateways completes registered gateway names.
func (a *app) completeGateways(_ *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	all, err := a.newRegistry().List()
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var out []cobra.Completion
	for _, e := range all {
		if strings.HasPrefix(e.Name, toComplete) {
			out = append(out, e.Name)
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

// loginGateway picks the gateway of 'gateway login|logout': NAME, then
// --gateway, then the selected gateway, then the only registered one.
func (a *app) loginGateway(reg *registry, args []string, verb string) (gatewayEntry, error) {
	name := a.gatewayName
	if len(args) == 1 {
		name = args[0]
	}
	if name == "" {
		name = reg.Active()
	}
	if name == "" {
		all, err := reg.List()
		if err != nil {
			return gatewayEntry{}, err
		}
		if len(all) != 1 {
			return gatewayEntry{}, usagef("no gateway is selected: name one ('openshell gateway %s NAME') or select one with 'openshell gateway select NAME'", verb)
		}
		return all[0], nil
	}
	return reg.Get(name)
}

func (a *app) newGatewayLoginCmd() *cobra.Command {
	var o loginOptions
	cmd := &cobra.Command{
		Use:               "login [NAME]",
		ValidArgsFunction: a.completeGateways,
		Short:             "Log in to an OIDC gateway and store its tokens",
		Long: `Log in to a gateway with auth_mode "oidc" (see 'gateway add --oidc-issuer') and
store the tokens in gateways/NAME/oidc_token.json (mode 0600), where
OpenShell's CLI and SDKs find them too. NAME defaults to --gateway, then the
selected gateway, then the only registered one. --gateway-insecure also skips
certificate checks towards the identity provider.

The grant depends on the environment, as with OpenShell's CLI:
  OPENSHELL_OIDC_CLIENT_SECRET set   client credentials (for CI and automation);
                                     the secret is read from the environment only
  --no-browser / OPENSHELL_NO_BROWSER=1, and the issuer offers device authorization
                                     the device authorization grant: approve the
                                     login on any device with a browser
  otherwise                          authorization code with PKCE: the URL is
                                     printed (and opened in a browser unless
                                     --no-browser); the identity provider
                                     redirects to a listener on 127.0.0.1

Scopes are "openid" plus the gateway's oidc_scopes (client credentials: the
oidc_scopes only). Later commands refresh a token that expires within 30
seconds with the refresh token, requesting the same scopes.`,
		Args: argsUsage(cobra.MaximumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			reg := a.newRegistry()
			e, err := a.loginGateway(reg, args, "login")
			if err != nil {
				return err
			}
			if mode := e.effectiveAuthMode(); mode != authModeOIDC {
				return fmt.Errorf("gateway %q uses %s authentication, not OIDC: only OIDC gateways support login", e.Name, mode)
			}
			b, err := a.oidcLogin(cmd.Context(), reg, e, o, e.Insecure || a.gatewayInsecure)
			if err != nil {
				return fmt.Errorf("log in to gateway %q: %w", e.Name, err)
			}
			if err := reg.storeOIDCToken(e.Name, b); err != nil {
				return err
			}
			as := ""
			if u := jwtPreferredUsername(b.AccessToken); u != "" {
				as = " as " + u
			}
			_, _ = fmt.Fprintf(a.stdout, "Logged in to gateway %q%s\n", e.Name, as)
			return nil
		},
	}
	cmd.Flags().StringVar(&o.ClientID, "client-id", "", "OIDC client ID for this login (default: the gateway's oidc_client_id, else \"openshell-cli\"); the secret comes from OPENSHELL_OIDC_CLIENT_SECRET")
	cmd.Flags().BoolVar(&o.NoBrowser, "no-browser", false, "do not open a browser: use the device authorization grant when the issuer offers it, else print the URL only (also OPENSHELL_NO_BROWSER=1)")
	return cmd
}

func (a *app) newGatewayLogoutCmd() *cobra.Command {
	return &cobra.Command{
		Use:               "logout [NAME]",
		ValidArgsFunction: a.completeGateways,
		Short:             "Revoke and delete the stored OIDC tokens of a gateway",
		Long: `Revoke the stored OIDC tokens at the issuer (RFC 7009, when its discovery
document has a revocation_endpoint) and delete oidc_token.json. The next
browser login asks the identity provider for a fresh login, so you can switch
users. The tokens are deleted even when the issuer cannot be reached.`,
		Args: argsUsage(cobra.MaximumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			reg := a.newRegistry()
			e, err := a.loginGateway(reg, args, "logout")
			if err != nil {
				return err
			}
			if mode := e.effectiveAuthMode(); mode != authModeOIDC {
				return fmt.Errorf("gateway %q uses %s authentication: there are no stored credentials to clear", e.Name, mode)
			}
			how := "no tokens were stored"
			b, err := reg.loadOIDCToken(e.Name)
			switch {
			case err == nil:
				ctx, cancel := context.WithTimeout(cmd.Context(), time.Minute)
				revoked, rerr := revokeOIDC(ctx, b, a.getenv(envOIDCClientSecret), e.Insecure || a.gatewayInsecure)
				cancel()
				switch {
				case rerr != nil:
					_, _ = fmt.Fprintf(a.stderr, "warning: could not revoke the tokens at the issuer: %v\n", rerr)
					how = "tokens deleted locally; revocation failed"
				case revoked:
					how = "tokens revoked at the issuer and deleted"
				default:
					how = "tokens deleted; the issuer offers no revocation endpoint"
				}
			case !errors.Is(err, fs.ErrNotExist):
				how = "unreadable token file deleted"
			}
			if err := reg.removeOIDCToken(e.Name); err != nil {
				return err
			}
			if err := reg.requestOIDCPrompt(e.Name); err != nil {
				return err
			}
			_, _ = fmt.Fprintf(a.stdout, "Logged out of gateway %q (%s)\n", e.Name, how)
			return nil
		},
	}
}
