package cli

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// newSandboxAdoptCmd is `openshell sandbox adopt`: bring an existing bare
// agent-sandbox Sandbox resource under the gateway's management.
func (a *app) newSandboxAdoptCmd() *cobra.Command {
	var (
		namespace, container string
		reenrich, detach     bool
	)
	cmd := &cobra.Command{
		Use:   "adopt NAME",
		Short: "Bring an existing Kubernetes Sandbox resource under the gateway's management",
		Long: `Adopt an existing agent-sandbox Sandbox custom resource named NAME (Kubernetes
driver only; the gateway must set allow_adoption = true) and wait until the
sandbox is ready, showing its progress.

The Sandbox resource is never deleted or recreated: it keeps its UID,
persistent volume claims, image, environment, ports, labels and annotations.
The gateway adds its labels, injects the supervisor and restarts the pod from
the new template (the Sandbox is suspended until its pod is gone, then
resumed).

Breaking change for the workload: the agent container's original entrypoint
(command and args) no longer runs as PID 1; it runs under the OpenShell
supervisor, which reports for each policy version whether it enforces all of
it (LOADED) or not (FAILED, with the reason).

The agent container is --container, else the only container, else the one
named "agent". --reenrich re-applies the current enrichment to a sandbox this
gateway already manages (for example after a supervisor upgrade). Adopting a
sandbox that is already adopted returns it unchanged.`,
		Example: `  openshell sandbox adopt research-agent
  openshell sandbox adopt research-agent --namespace agents --container agent --detach
  openshell sandbox adopt research-agent --reenrich`,
		Args: argsUsage(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if name == "" {
				return usagef("NAME must not be empty")
			}
			c, err := a.gateway()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			resp, err := c.AdoptSandbox(ctx, &openshellv1.AdoptSandboxRequest{
				Name: name, Namespace: namespace, Workspace: a.ws(), AgentContainer: container, Reenrich: reenrich,
			})
			if err != nil {
				what := sandboxWhat(name)
				if status.Code(err) == codes.NotFound {
					// The Sandbox resource is looked up in a namespace,
					// not in the workspace: keep the gateway's text,
					// which names the namespace.
					what = ""
				}
				return a.rpcError(err, what)
			}
			sb := resp.GetSandbox()
			if !a.structured() {
				_, _ = fmt.Fprintf(a.stderr, "Adopted sandbox %s (id %s)\n", name, sb.GetMetadata().GetId())
			}
			if detach {
				if a.structured() {
					return a.printProto(sb)
				}
				_, _ = fmt.Fprintf(a.stderr, "Follow it with: openshell sandbox get %s\n", name)
				return nil
			}
			ready, err := a.waitReady(ctx, sb)
			if err != nil {
				if errors.Is(err, context.Canceled) || ctx.Err() != nil {
					// Never offer a delete here: it would delete the
					// adopted Sandbox resource.
					_, _ = fmt.Fprintf(a.stderr, "\nInterrupted; sandbox %s stays adopted. Follow it with: openshell sandbox get %s\n", name, name)
					return context.Canceled
				}
				return err
			}
			if a.structured() {
				return a.printProto(ready)
			}
			_, _ = fmt.Fprintf(a.stderr, "Sandbox %s is ready\n", name)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&namespace, "namespace", "", "Kubernetes namespace of the Sandbox (default: the gateway's sandbox namespace for the workspace)")
	f.StringVar(&container, "container", "", `agent container (default: the only container, else the one named "agent")`)
	f.BoolVar(&reenrich, "reenrich", false, "re-apply the current enrichment to a sandbox this gateway already manages")
	f.BoolVarP(&detach, "detach", "d", false, "do not wait until the sandbox is ready")
	return cmd
}
