package cli

import (
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	inferencev1 "github.com/openshell-go/openshell/api/openshell/inference/v1"
)

// The inference commands follow OpenShell's CLI: 'inference set --provider P
// --model M [--timeout S] [--no-verify] [--system]', 'inference update' (a
// partial set), 'inference get [--system]', 'inference delete [--system]',
// over the openshell.inference.v1.Inference service. Routes live in the
// workspace given by --workspace.

const systemRoute = "sandbox-system"

func (a *app) newInferenceCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "inference",
		Short: "Manage the inference route sandboxes reach at http://inference.local",
		Long: `Manage the workspace's inference route: the provider and model behind
http://inference.local in every sandbox of the workspace. Sandboxes never hold
the provider's key; their supervisor injects it. Changes reach running
sandboxes within about 5 seconds.`,
		Example: `  openshell inference set --provider openai-prod --model gpt-4o-mini
  openshell inference set --provider local --model llama3 --timeout 300 --no-verify
  openshell inference update --model gpt-4o
  openshell inference get
  openshell inference delete`,
		RunE: groupRunE,
	}
	cmd.AddCommand(a.newInferenceSetCmd(false), a.newInferenceSetCmd(true), a.newInferenceGetCmd(), a.newInferenceDeleteCmd())
	return cmd
}

// inference dials the gateway and returns its Inference client.
func (a *app) inference() (inferencev1.InferenceClient, error) {
	if _, err := a.gateway(); err != nil {
		return nil, err
	}
	if a.conn == nil {
		return nil, errors.New("no gateway connection for the inference service")
	}
	return inferencev1.NewInferenceClient(a.conn), nil
}

func routeName(system bool) string {
	if system {
		return systemRoute
	}
	return ""
}

func printTimeout(w io.Writer, secs uint64) {
	if secs == 0 {
		_, _ = fmt.Fprintln(w, "  Timeout: 60s (default)")
		return
	}
	_, _ = fmt.Fprintf(w, "  Timeout: %ds\n", secs)
}

// newInferenceSetCmd builds 'set' or, with update, 'update' (unset flags
// keep the route's current values).
func (a *app) newInferenceSetCmd(update bool) *cobra.Command {
	var (
		provider, model  string
		timeout          uint64
		system, noVerify bool
	)
	use, short := "set --provider NAME --model ID [--timeout SECONDS] [--no-verify] [--system]", "Set the workspace's inference provider and model"
	if update {
		use, short = "update [--provider NAME] [--model ID] [--timeout SECONDS] [--no-verify] [--system]", "Change some fields of the workspace's inference route"
	}
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Long: short + `.

The gateway checks that the provider exists in the workspace and is of a
supported type (openai, anthropic, nvidia, deepinfra, google-vertex-ai), then,
unless --no-verify, sends a minimal request to the resolved endpoint with the
provider's key; the gateway must reach the endpoint for that.`,
		Args: argsUsage(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			f := cmd.Flags()
			if update && !f.Changed("provider") && !f.Changed("model") && !f.Changed("timeout") {
				return usagef("at least one of --provider, --model, or --timeout must be specified")
			}
			if !update && (provider == "" || model == "") {
				return usagef("--provider and --model are required")
			}
			c, err := a.inference()
			if err != nil {
				return err
			}
			req := &inferencev1.SetInferenceRouteRequest{ProviderName: provider, ModelId: model, RouteName: routeName(system),
				NoVerify: noVerify, TimeoutSecs: timeout, Workspace: a.ws()}
			if update {
				cur, err := c.GetInferenceRoute(cmd.Context(), &inferencev1.GetInferenceRouteRequest{RouteName: req.RouteName, Workspace: a.ws()})
				if err != nil {
					return a.rpcError(err, "")
				}
				if !f.Changed("provider") {
					req.ProviderName = cur.GetProviderName()
				}
				if !f.Changed("model") {
					req.ModelId = cur.GetModelId()
				}
				if !f.Changed("timeout") {
					req.TimeoutSecs = cur.GetTimeoutSecs()
				}
			}
			resp, err := c.SetInferenceRoute(cmd.Context(), req)
			if err != nil {
				return a.rpcError(err, "")
			}
			if a.structured() {
				return a.printProto(resp)
			}
			label := "Inference"
			if resp.GetRouteName() == systemRoute {
				label = "System inference"
			}
			verb := "configured"
			if update {
				verb = "updated"
			}
			w := a.stdout
			_, _ = fmt.Fprintf(w, "%s %s:\n\n  Workspace: %s\n  Route: %s\n  Provider: %s\n  Model: %s\n  Version: %d\n",
				label, verb, resp.GetWorkspace(), resp.GetRouteName(), resp.GetProviderName(), resp.GetModelId(), resp.GetVersion())
			printTimeout(w, resp.GetTimeoutSecs())
			if resp.GetValidationPerformed() {
				_, _ = fmt.Fprintln(w, "  Validated Endpoints:")
				for _, e := range resp.GetValidatedEndpoints() {
					_, _ = fmt.Fprintf(w, "    - %s (%s)\n", e.GetUrl(), e.GetProtocol())
				}
			}
			return nil
		},
	}
	f := cmd.Flags()
	keep := ""
	if update {
		keep = " (unchanged if omitted)"
	}
	f.StringVar(&provider, "provider", "", "provider name"+keep)
	f.StringVar(&model, "model", "", "model identifier to force for generation calls"+keep)
	f.Uint64Var(&timeout, "timeout", 0, "request timeout in seconds for inference calls (0 = default 60s)"+keep)
	f.BoolVar(&system, "system", false, "target the system inference route (sandbox-system) instead of inference.local")
	f.BoolVar(&noVerify, "no-verify", false, "skip endpoint verification before saving the route")
	_ = cmd.RegisterFlagCompletionFunc("provider", a.completeProviders)
	return cmd
}

func (a *app) newInferenceGetCmd() *cobra.Command {
	var system bool
	cmd := &cobra.Command{
		Use:   "get [--system]",
		Short: "Show the workspace's inference routes",
		Long:  "Show the workspace's inference route; without --system both the inference.local and the system route.",
		Args:  argsUsage(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.inference()
			if err != nil {
				return err
			}
			routes := []struct{ label, name string }{{"Inference", ""}, {"System inference", systemRoute}}
			if system {
				routes = routes[1:]
			}
			w := a.stdout
			for i, r := range routes {
				resp, err := c.GetInferenceRoute(cmd.Context(), &inferencev1.GetInferenceRouteRequest{RouteName: r.name, Workspace: a.ws()})
				notFound := status.Code(err) == codes.NotFound
				if err != nil && (system || !notFound) {
					return a.rpcError(err, "")
				}
				if a.structured() {
					if notFound {
						continue
					}
					if err := a.printProto(resp); err != nil {
						return err
					}
					continue
				}
				if i > 0 {
					_, _ = fmt.Fprintln(w)
				}
				_, _ = fmt.Fprintf(w, "%s:\n\n", r.label)
				if notFound {
					_, _ = fmt.Fprintln(w, "  Not configured")
					continue
				}
				_, _ = fmt.Fprintf(w, "  Workspace: %s\n  Provider: %s\n  Model: %s\n  Version: %d\n",
					resp.GetWorkspace(), resp.GetProviderName(), resp.GetModelId(), resp.GetVersion())
				printTimeout(w, resp.GetTimeoutSecs())
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&system, "system", false, "show only the system inference route (sandbox-system)")
	return cmd
}

func (a *app) newInferenceDeleteCmd() *cobra.Command {
	var system bool
	cmd := &cobra.Command{
		Use:   "delete [--system]",
		Short: "Delete the workspace's inference route",
		Args:  argsUsage(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.inference()
			if err != nil {
				return err
			}
			resp, err := c.DeleteInferenceRoute(cmd.Context(), &inferencev1.DeleteInferenceRouteRequest{RouteName: routeName(system), Workspace: a.ws()})
			if err != nil {
				return a.rpcError(err, "")
			}
			if a.structured() {
				return a.printProto(resp)
			}
			label := "Inference route"
			if system {
				label = "System inference route"
			}
			if resp.GetDeleted() {
				_, _ = fmt.Fprintf(a.stdout, "%s deleted.\n", label)
			} else {
				_, _ = fmt.Fprintf(a.stdout, "%s not found (already deleted).\n", label)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&system, "system", false, "delete the system inference route (sandbox-system) instead of inference.local")
	return cmd
}
