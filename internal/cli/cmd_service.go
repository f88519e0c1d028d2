package cli

import (
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// The service commands follow OpenShell's CLI: 'service expose SANDBOX PORT
// [SERVICE]', 'service list [SANDBOX]', 'service get|delete SANDBOX
// [SERVICE]'. An omitted SERVICE is the sandbox's unnamed service.

func (a *app) newServiceCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "service",
		Aliases: []string{"svc"},
		Short:   "Expose HTTP services of sandboxes through the gateway",
		Long: `Expose a web app listening on a loopback port inside a sandbox at a gateway URL:
http(s)://SANDBOX--SERVICE.DOMAIN:PORT/ (see docs/services.md). The gateway
carries the requests over the sandbox's supervisor relay; HTTP/1.1, HTTP/2,
streaming and WebSocket work.`,
		RunE: groupRunE,
	}
	cmd.AddCommand(a.newServiceExposeCmd(), a.newServiceListCmd(), a.newServiceGetCmd(), a.newServiceDeleteCmd())
	return cmd
}

func serviceWhat(sandbox, service string) string {
	if service == "" {
		return fmt.Sprintf("service of sandbox %q", sandbox)
	}
	return fmt.Sprintf("service %q of sandbox %q", service, sandbox)
}

func (a *app) newServiceExposeCmd() *cobra.Command {
	return &cobra.Command{
		Use:               "expose SANDBOX PORT [SERVICE]",
		Short:             "Expose a port of a sandbox as a service URL",
		Example:           "  openshell service expose my-app 8080 web\n  openshell service expose my-app 3000",
		Args:              argsUsage(cobra.RangeArgs(2, 3)),
		ValidArgsFunction: a.completeSandboxes,
		RunE: func(cmd *cobra.Command, args []string) error {
			port, err := strconv.ParseUint(args[1], 10, 32)
			if err != nil || port == 0 || port > 65535 {
				return usagef("invalid PORT %q: want 1-65535", args[1])
			}
			service := ""
			if len(args) == 3 {
				service = args[2]
			}
			c, err := a.gateway()
			if err != nil {
				return err
			}
			resp, err := c.ExposeService(cmd.Context(), &openshellv1.ExposeServiceRequest{
				Sandbox: args[0], Service: service, TargetPort: uint32(port), Domain: true, Workspace: a.ws(),
			})
			if err != nil {
				return a.rpcError(err, fmt.Sprintf("sandbox %q", args[0]))
			}
			if a.structured() {
				return a.printProto(resp)
			}
			_, _ = fmt.Fprintf(a.stdout, "Exposed %s on port %d\n", serviceWhat(args[0], service), port)
			if resp.GetUrl() != "" {
				_, _ = fmt.Fprintf(a.stdout, "URL: %s\n", resp.GetUrl())
			}
			return nil
		},
	}
}

func (a *app) newServiceListCmd() *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:               "list [SANDBOX]",
		Aliases:           []string{"ls"},
		Short:             "List exposed services",
		Args:              argsUsage(cobra.MaximumNArgs(1)),
		ValidArgsFunction: a.completeSandboxes,
		RunE: func(cmd *cobra.Command, args []string) error {
			if all && len(args) > 0 {
				return usagef("give a sandbox name or --all-workspaces, not both")
			}
			c, err := a.gateway()
			if err != nil {
				return err
			}
			req := &openshellv1.ListServicesRequest{AllWorkspaces: all, Limit: 1000}
			if !all {
				req.Workspace = a.ws()
			}
			if len(args) == 1 {
				req.Sandbox = args[0]
			}
			var out []*openshellv1.ServiceEndpointResponse
			for {
				resp, err := c.ListServices(cmd.Context(), req)
				if err != nil {
					if req.Sandbox != "" {
						return a.rpcError(err, fmt.Sprintf("sandbox %q", req.Sandbox))
					}
					return a.rpcError(err, "")
				}
				out = append(out, resp.GetServices()...)
				if len(resp.GetServices()) < int(req.Limit) {
					break
				}
				req.Offset += req.Limit
			}
			if a.structured() {
				return a.printProto(&openshellv1.ListServicesResponse{Services: out})
			}
			if len(out) == 0 {
				_, _ = fmt.Fprintf(a.stderr, "No services in workspace %q\n", a.wsDisplay())
				return nil
			}
			tw := newTable(a.stdout)
			if all {
				_, _ = fmt.Fprintln(tw, "WORKSPACE\tSANDBOX\tSERVICE\tPORT\tURL")
			} else {
				_, _ = fmt.Fprintln(tw, "SANDBOX\tSERVICE\tPORT\tURL")
			}
			for _, s := range out {
				ep := s.GetEndpoint()
				if all {
					_, _ = fmt.Fprintf(tw, "%s\t", ep.GetMetadata().GetWorkspace())
				}
				_, _ = fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", ep.GetSandboxName(), orDash(ep.GetServiceName()), ep.GetTargetPort(), orDash(s.GetUrl()))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVarP(&all, "all-workspaces", "A", false, "list services in every workspace (platform admins)")
	return cmd
}

func (a *app) newServiceGetCmd() *cobra.Command {
	return &cobra.Command{
		Use:               "get SANDBOX [SERVICE]",
		Short:             "Show one exposed service and its URL",
		Args:              argsUsage(cobra.RangeArgs(1, 2)),
		ValidArgsFunction: a.completeSandboxes,
		RunE: func(cmd *cobra.Command, args []string) error {
			service := optionalArg(args, 1)
			c, err := a.gateway()
			if err != nil {
				return err
			}
			resp, err := c.GetService(cmd.Context(), &openshellv1.GetServiceRequest{Sandbox: args[0], Service: service, Workspace: a.ws()})
			if err != nil {
				return a.rpcError(err, serviceWhat(args[0], service))
			}
			if a.structured() {
				return a.printProto(resp)
			}
			ep := resp.GetEndpoint()
			tw := newTable(a.stdout)
			_, _ = fmt.Fprintf(tw, "Sandbox:\t%s\nService:\t%s\nTarget port:\t%d\nURL:\t%s\nId:\t%s\n",
				ep.GetSandboxName(), orDash(ep.GetServiceName()), ep.GetTargetPort(), orDash(resp.GetUrl()), ep.GetMetadata().GetId())
			return tw.Flush()
		},
	}
}

func (a *app) newServiceDeleteCmd() *cobra.Command {
	return &cobra.Command{
		Use:               "delete SANDBOX [SERVICE]",
		Aliases:           []string{"rm"},
		Short:             "Stop exposing a service",
		Args:              argsUsage(cobra.RangeArgs(1, 2)),
		ValidArgsFunction: a.completeSandboxes,
		RunE: func(cmd *cobra.Command, args []string) error {
			service := optionalArg(args, 1)
			c, err := a.gateway()
			if err != nil {
				return err
			}
			resp, err := c.DeleteService(cmd.Context(), &openshellv1.DeleteServiceRequest{Sandbox: args[0], Service: service, Workspace: a.ws()})
			if err != nil {
				return a.rpcError(err, serviceWhat(args[0], service))
			}
			if !resp.GetDeleted() {
				return &userError{msg: serviceWhat(args[0], service) + " is not exposed"}
			}
			if a.structured() {
				return a.printProto(resp)
			}
			_, _ = fmt.Fprintf(a.stdout, "Deleted %s\n", serviceWhat(args[0], service))
			return nil
		},
	}
}

// optionalArg returns args[i], or "" when the optional argument was not given.
func optionalArg(args []string, i int) string {
	if len(args) > i {
		return args[i]
	}
	return ""
}
