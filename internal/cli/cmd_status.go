package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/version"
)

func healthName(s openshellv1.ServiceStatus) string {
	n := strings.TrimPrefix(s.String(), "SERVICE_STATUS_")
	if n == "" || n == "UNSPECIFIED" {
		return "Unknown"
	}
	return n[:1] + strings.ToLower(n[1:])
}

func (a *app) newStatusCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Check that the gateway answers and show its version and compute driver",
		Args:  argsUsage(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			c, err := a.gateway()
			if err != nil {
				return err
			}
			h, err := c.Health(ctx, &openshellv1.HealthRequest{})
			if err != nil {
				return a.rpcError(err, "")
			}
			view := map[string]any{"gateway": a.target.Name, "endpoint": a.target.Endpoint, "health": healthName(h.GetStatus()), "version": h.GetVersion()}
			info, err := c.GetGatewayInfo(ctx, &openshellv1.GetGatewayInfoRequest{})
			auth := "authenticated"
			var drivers []string
			switch {
			case err == nil:
				if info.GetGatewayVersion() != "" {
					view["version"] = info.GetGatewayVersion()
				}
				for _, d := range info.GetComputeDrivers() {
					name := d.GetName()
					if v := d.GetCapabilities().GetDriverVersion(); v != "" {
						name += " " + v
					}
					drivers = append(drivers, name)
				}
			case status.Code(err) == codes.PermissionDenied:
				// The caller is authenticated but not a platform admin.
				auth = "authenticated (gateway details need the platform_admin role)"
			case status.Code(err) == codes.Unimplemented:
				auth = "unknown (the gateway does not serve GetGatewayInfo)"
			default:
				return a.rpcError(err, "")
			}
			view["auth"] = auth
			view["drivers"] = drivers
			if a.structured() {
				return a.printPlain(view)
			}
			tw := newTable(a.stdout)
			_, _ = fmt.Fprintf(tw, "Gateway:\t%s\n", orDash(a.target.Name))
			_, _ = fmt.Fprintf(tw, "Endpoint:\t%s\n", a.target.Endpoint)
			state := "Connected"
			switch h.GetStatus() {
			case openshellv1.ServiceStatus_SERVICE_STATUS_HEALTHY:
			case openshellv1.ServiceStatus_SERVICE_STATUS_DEGRADED:
				state = "Connected (" + healthName(h.GetStatus()) + ": the gateway is up but its database or compute driver is not answering; its /readyz says which)"
			default:
				state = "Connected (" + healthName(h.GetStatus()) + ")"
			}
			_, _ = fmt.Fprintf(tw, "Status:\t%s\n", state)
			_, _ = fmt.Fprintf(tw, "Version:\t%s\n", orDash(fmt.Sprint(view["version"])))
			if len(drivers) > 0 {
				_, _ = fmt.Fprintf(tw, "Driver:\t%s\n", strings.Join(drivers, ", "))
			}
			_, _ = fmt.Fprintf(tw, "Auth:\t%s\n", auth)
			return tw.Flush()
		},
	}
}

func (a *app) newWhoamiCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "whoami",
		Short: "Show the identity the gateway sees for you",
		Args:  argsUsage(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.gateway()
			if err != nil {
				return err
			}
			u, err := c.GetCurrentUser(cmd.Context(), &openshellv1.GetCurrentUserRequest{})
			if err != nil {
				return a.rpcError(err, "")
			}
			if a.structured() {
				return a.printProto(u)
			}
			tw := newTable(a.stdout)
			_, _ = fmt.Fprintf(tw, "Subject:\t%s\n", u.GetSubject())
			if u.GetDisplayName() != "" {
				_, _ = fmt.Fprintf(tw, "Name:\t%s\n", u.GetDisplayName())
			}
			_, _ = fmt.Fprintf(tw, "Provider:\t%s\n", orDash(u.GetIdentityProvider()))
			_, _ = fmt.Fprintf(tw, "Roles:\t%s\n", orDash(strings.Join(u.GetRoles(), ", ")))
			if len(u.GetScopes()) > 0 {
				_, _ = fmt.Fprintf(tw, "Scopes:\t%s\n", strings.Join(u.GetScopes(), ", "))
			}
			return tw.Flush()
		},
	}
}

func (a *app) newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the client and gateway versions",
		Args:  argsUsage(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			view := map[string]string{"client": version.Version}
			gw := ""
			c, err := a.gateway()
			if err == nil {
				var h *openshellv1.HealthResponse
				h, err = c.Health(cmd.Context(), &openshellv1.HealthRequest{})
				if err == nil {
					gw = h.GetVersion()
				} else {
					err = a.rpcError(err, "")
				}
			}
			if gw != "" {
				view["gateway"] = gw
			}
			if a.structured() {
				if perr := a.printPlain(view); perr != nil {
					return perr
				}
			} else {
				_, _ = fmt.Fprintf(a.stdout, "Client:  %s\n", version.Version)
				if gw != "" {
					_, _ = fmt.Fprintf(a.stdout, "Gateway: %s\n", gw)
				}
			}
			if err != nil {
				_, _ = fmt.Fprintf(a.stderr, "gateway version unavailable: %v\n", err)
			}
			return nil
		},
	}
}

func (a *app) newCompletionCmd(root *cobra.Command) *cobra.Command {
	return &cobra.Command{
		Use:       "completion bash|zsh|fish",
		Short:     "Print a shell completion script",
		Long:      "Print a shell completion script. For bash: source <(openshell completion bash)",
		ValidArgs: []string{"bash", "zsh", "fish"},
		Args:      argsUsage(cobra.MatchAll(cobra.ExactArgs(1), cobra.OnlyValidArgs)),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch args[0] {
			case "bash":
				return root.GenBashCompletionV2(a.stdout, true)
			case "zsh":
				return root.GenZshCompletion(a.stdout)
			default:
				return root.GenFishCompletion(a.stdout, true)
			}
		},
	}
}
