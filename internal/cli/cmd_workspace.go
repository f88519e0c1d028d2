package cli

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	datamodelv1 "github.com/openshell-go/openshell/api/openshell/datamodel/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// The workspace commands follow OpenShell's CLI: 'workspace create --name',
// 'workspace member add --workspace W --subject S --role user|admin'.

func (a *app) newWorkspaceCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "workspace",
		Aliases: []string{"ws"},
		Short:   "Manage workspaces and their members",
		Long: `Manage workspaces: the scopes sandboxes and other resources live in.

Other commands act in the workspace given by --workspace, else env
OPENSHELL_WORKSPACE, else the default set for the selected gateway with
"openshell workspace use", else the gateway's "default" workspace.`,
		RunE: groupRunE,
	}
	cmd.AddCommand(a.newWorkspaceCreateCmd(), a.newWorkspaceListCmd(), a.newWorkspaceGetCmd(), a.newWorkspaceDeleteCmd(), a.newWorkspaceUseCmd(), a.newWorkspaceMemberCmd())
	return cmd
}

func workspaceWhat(name string) string { return fmt.Sprintf("workspace %q", name) }

// workspaceRPCError phrases errors of RPCs about one workspace: rpcError's
// NotFound text ("... in workspace X") fits objects inside a workspace, not
// the workspace itself.
func (a *app) workspaceRPCError(err error, name string) error {
	switch status.Code(err) {
	case codes.NotFound:
		return &userError{msg: fmt.Sprintf("%s not found", workspaceWhat(name)), cause: err}
	case codes.AlreadyExists:
		return &userError{msg: fmt.Sprintf("%s already exists", workspaceWhat(name)), cause: err}
	}
	return a.rpcError(err, "")
}

func (a *app) newWorkspaceCreateCmd() *cobra.Command {
	var (
		name   string
		labels []string
	)
	cmd := &cobra.Command{
		Use:     "create [NAME] [--name NAME] [--label KEY=VALUE...]",
		Short:   "Create a workspace",
		Example: "  openshell workspace create team-a --label env=dev\n  openshell workspace create --name team-a",
		Args:    argsUsage(cobra.MaximumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := nameFromArgOrFlag("workspace", args, name, "a workspace name is required: openshell workspace create NAME")
			if err != nil {
				return err
			}
			lbl, err := parseKV("label", labels)
			if err != nil {
				return err
			}
			c, err := a.gateway()
			if err != nil {
				return err
			}
			resp, err := c.CreateWorkspace(cmd.Context(), &openshellv1.CreateWorkspaceRequest{Name: name, Labels: lbl})
			if err != nil {
				return a.workspaceRPCError(err, name)
			}
			if a.structured() {
				return a.printProto(resp.GetWorkspace())
			}
			_, _ = fmt.Fprintf(a.stdout, "Created workspace %s\n", resp.GetWorkspace().GetMetadata().GetName())
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&name, "name", "", "workspace name (DNS label: lowercase letters, digits and '-', at most 19 characters)")
	f.StringArrayVarP(&labels, "label", "l", nil, "label KEY=VALUE (repeatable)")
	return cmd
}

func workspacePhase(w *datamodelv1.Workspace) string {
	s := strings.TrimPrefix(w.GetStatus().GetPhase().String(), "WORKSPACE_PHASE_")
	if s == "" || s == "UNSPECIFIED" {
		return "Unknown"
	}
	return s[:1] + strings.ToLower(s[1:])
}

func (a *app) newWorkspaceListCmd() *cobra.Command {
	var (
		limit, offset uint32
		selector      string
	)
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List workspaces",
		Args:    argsUsage(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.gateway()
			if err != nil {
				return err
			}
			resp, err := c.ListWorkspaces(cmd.Context(), &openshellv1.ListWorkspacesRequest{Limit: limit, Offset: offset, LabelSelector: selector})
			if err != nil {
				return a.rpcError(err, "")
			}
			if a.structured() {
				return a.printProto(resp)
			}
			if len(resp.GetWorkspaces()) == 0 {
				_, _ = fmt.Fprintln(a.stderr, "No workspaces found")
				return nil
			}
			tw := newTable(a.stdout)
			_, _ = fmt.Fprintln(tw, "NAME\tSTATUS\tAGE\tLABELS")
			for _, w := range resp.GetWorkspaces() {
				md := w.GetMetadata()
				_, _ = fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", md.GetName(), workspacePhase(w), a.age(md.GetCreatedAtMs()), formatMap(md.GetLabels()))
			}
			return tw.Flush()
		},
	}
	f := cmd.Flags()
	f.Uint32Var(&limit, "limit", 100, "maximum number of workspaces to return")
	f.Uint32Var(&offset, "offset", 0, "offset into the workspace list")
	f.StringVar(&selector, "label-selector", "", "label selector k=v[,k2=v2]")
	return cmd
}

func (a *app) newWorkspaceGetCmd() *cobra.Command {
	return &cobra.Command{
		Use:               "get NAME",
		Short:             "Show one workspace",
		Args:              argsUsage(cobra.ExactArgs(1)),
		ValidArgsFunction: a.completeWorkspaces,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.gateway()
			if err != nil {
				return err
			}
			resp, err := c.GetWorkspace(cmd.Context(), &openshellv1.GetWorkspaceRequest{Name: args[0]})
			if err != nil {
				return a.workspaceRPCError(err, args[0])
			}
			w := resp.GetWorkspace()
			if a.structured() {
				return a.printProto(w)
			}
			md := w.GetMetadata()
			tw := newTable(a.stdout)
			_, _ = fmt.Fprintf(tw, "Name:\t%s\nId:\t%s\nStatus:\t%s\nResource version:\t%d\n", md.GetName(), md.GetId(), workspacePhase(w), md.GetResourceVersion())
			if md.GetCreatedAtMs() != 0 {
				_, _ = fmt.Fprintf(tw, "Created:\t%s (%s ago)\n", time.UnixMilli(md.GetCreatedAtMs()).UTC().Format(time.RFC3339), a.age(md.GetCreatedAtMs()))
			}
			if len(md.GetLabels()) > 0 {
				_, _ = fmt.Fprintf(tw, "Labels:\t%s\n", formatMap(md.GetLabels()))
			}
			return tw.Flush()
		},
	}
}

func (a *app) newWorkspaceUseCmd() *cobra.Command {
	var clear bool
	cmd := &cobra.Command{
		Use:   "use [NAME]",
		Short: "Set this machine's default workspace for the selected gateway",
		Long: `Store NAME as the default workspace of the selected registered gateway
(--gateway, OPENSHELL_GATEWAY or the active gateway), in its metadata.json
under the key "workspace". Commands then act in NAME unless --workspace or
OPENSHELL_WORKSPACE says otherwise. The workspace must exist on the gateway.

OpenShell's own CLI and SDKs do not read this key: they act in the workspace
of --workspace or OPENSHELL_WORKSPACE only, so set OPENSHELL_WORKSPACE when
you switch between clients. --clear removes the default.`,
		Args:              argsUsage(cobra.MaximumNArgs(1)),
		ValidArgsFunction: a.completeWorkspaces,
		RunE: func(cmd *cobra.Command, args []string) error {
			if clear == (len(args) == 1) {
				return usagef("give a workspace NAME or --clear")
			}
			gw, err := a.selectedGatewayName()
			if err != nil {
				return err
			}
			if gw == "" {
				return fmt.Errorf("no registered gateway is selected: a default workspace is stored with a registered gateway (see 'openshell gateway add' and 'openshell gateway select')")
			}
			reg := a.newRegistry()
			if clear {
				if err := reg.SetWorkspace(gw, ""); err != nil {
					return err
				}
				_, _ = fmt.Fprintf(a.stdout, "Gateway %q has no default workspace now\n", gw)
				return nil
			}
			c, err := a.gateway()
			if err != nil {
				return err
			}
			if _, err := c.GetWorkspace(cmd.Context(), &openshellv1.GetWorkspaceRequest{Name: args[0]}); err != nil {
				return a.workspaceRPCError(err, args[0])
			}
			if err := reg.SetWorkspace(gw, args[0]); err != nil {
				return err
			}
			_, _ = fmt.Fprintf(a.stdout, "Default workspace of gateway %q: %s\n", gw, args[0])
			return nil
		},
	}
	cmd.Flags().BoolVar(&clear, "clear", false, "remove the default workspace")
	return cmd
}

func (a *app) newWorkspaceDeleteCmd() *cobra.Command {
	return &cobra.Command{
		Use:               "delete NAME...",
		Aliases:           []string{"rm"},
		Short:             "Delete workspaces",
		Args:              argsUsage(cobra.MinimumNArgs(1)),
		ValidArgsFunction: a.completeWorkspaces,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.gateway()
			if err != nil {
				return err
			}
			return a.deleteEach(args, "workspace", func(name string) error {
				resp, err := c.DeleteWorkspace(cmd.Context(), &openshellv1.DeleteWorkspaceRequest{Name: name})
				if err == nil && !resp.GetDeleted() {
					err = status.Error(codes.NotFound, "workspace not found")
				}
				if err != nil {
					return a.workspaceRPCError(err, name)
				}
				return nil
			})
		},
	}
}

// memberWorkspace is the workspace the member commands act on: --workspace
// (or OPENSHELL_WORKSPACE) is required, so that a member is never added to
// "default" by accident.
func (a *app) memberWorkspace() (string, error) {
	if a.ws() == "" {
		return "", usagef("--workspace is required (or set OPENSHELL_WORKSPACE)")
	}
	return a.ws(), nil
}

var workspaceRoles = map[string]openshellv1.WorkspaceRole{
	"user":  openshellv1.WorkspaceRole_WORKSPACE_ROLE_USER,
	"admin": openshellv1.WorkspaceRole_WORKSPACE_ROLE_ADMIN,
}

func roleName(r openshellv1.WorkspaceRole) string {
	for n, v := range workspaceRoles {
		if v == r {
			return n
		}
	}
	return "unknown"
}

func (a *app) newWorkspaceMemberCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "member",
		Aliases: []string{"members"},
		Short:   "Manage the members of a workspace (--workspace W)",
		RunE:    groupRunE,
	}
	var subject, role string
	add := &cobra.Command{
		Use:     "add --workspace W --subject SUBJECT --role user|admin",
		Short:   "Add a member to a workspace, or change its role",
		Example: "  openshell workspace member add --workspace team-a --subject alice@example.com --role admin",
		Args:    argsUsage(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			ws, err := a.memberWorkspace()
			if err != nil {
				return err
			}
			if subject == "" {
				return usagef("--subject is required")
			}
			r, ok := workspaceRoles[strings.ToLower(role)]
			if !ok {
				return usagef("invalid --role %q: must be 'user' or 'admin'", role)
			}
			c, err := a.gateway()
			if err != nil {
				return err
			}
			resp, err := c.AddWorkspaceMember(cmd.Context(), &openshellv1.AddWorkspaceMemberRequest{Workspace: ws, PrincipalSubject: subject, Role: r})
			if err != nil {
				return a.workspaceRPCError(err, ws)
			}
			if a.structured() {
				return a.printProto(resp.GetMember())
			}
			_, _ = fmt.Fprintf(a.stdout, "Added %s to workspace %s as %s\n", resp.GetMember().GetPrincipalSubject(), ws, roleName(resp.GetMember().GetRole()))
			return nil
		},
	}
	add.Flags().StringVar(&subject, "subject", "", "subject of the principal (OIDC sub claim, or the common name of an mTLS client certificate)")
	add.Flags().StringVar(&role, "role", "", "role: user or admin")
	_ = add.RegisterFlagCompletionFunc("role", cobra.FixedCompletions([]string{"user", "admin"}, cobra.ShellCompDirectiveNoFileComp))

	var rmSubject string
	remove := &cobra.Command{
		Use:     "remove --workspace W --subject SUBJECT",
		Aliases: []string{"rm"},
		Short:   "Remove a member from a workspace",
		Args:    argsUsage(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			ws, err := a.memberWorkspace()
			if err != nil {
				return err
			}
			if rmSubject == "" {
				return usagef("--subject is required")
			}
			c, err := a.gateway()
			if err != nil {
				return err
			}
			resp, err := c.RemoveWorkspaceMember(cmd.Context(), &openshellv1.RemoveWorkspaceMemberRequest{Workspace: ws, PrincipalSubject: rmSubject})
			if err != nil {
				return a.workspaceRPCError(err, ws)
			}
			if !resp.GetRemoved() {
				return fmt.Errorf("%q is not a member of workspace %q", rmSubject, ws)
			}
			_, _ = fmt.Fprintf(a.stdout, "Removed %s from workspace %s\n", rmSubject, ws)
			return nil
		},
	}
	remove.Flags().StringVar(&rmSubject, "subject", "", "subject of the principal to remove")

	var limit, offset uint32
	list := &cobra.Command{
		Use:     "list --workspace W",
		Aliases: []string{"ls"},
		Short:   "List the members of a workspace",
		Args:    argsUsage(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			ws, err := a.memberWorkspace()
			if err != nil {
				return err
			}
			c, err := a.gateway()
			if err != nil {
				return err
			}
			resp, err := c.ListWorkspaceMembers(cmd.Context(), &openshellv1.ListWorkspaceMembersRequest{Workspace: ws, Limit: limit, Offset: offset})
			if err != nil {
				return a.workspaceRPCError(err, ws)
			}
			if a.structured() {
				return a.printProto(resp)
			}
			if len(resp.GetMembers()) == 0 {
				_, _ = fmt.Fprintf(a.stderr, "No members in workspace %q\n", ws)
				return nil
			}
			tw := newTable(a.stdout)
			_, _ = fmt.Fprintln(tw, "SUBJECT\tROLE")
			for _, m := range resp.GetMembers() {
				_, _ = fmt.Fprintf(tw, "%s\t%s\n", m.GetPrincipalSubject(), roleName(m.GetRole()))
			}
			return tw.Flush()
		},
	}
	list.Flags().Uint32Var(&limit, "limit", 100, "maximum number of members to return")
	list.Flags().Uint32Var(&offset, "offset", 0, "offset into the member list")

	cmd.AddCommand(add, remove, list)
	return cmd
}

// completeWorkspaces completes workspace names from the gateway.
func (a *app) completeWorkspaces(cmd *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	return a.completeNames(cmd, toComplete, func(c openshellv1.OpenShellClient) ([]string, error) {
		resp, err := c.ListWorkspaces(cmd.Context(), &openshellv1.ListWorkspacesRequest{Limit: 1000})
		var out []string
		for _, w := range resp.GetWorkspaces() {
			out = append(out, w.GetMetadata().GetName())
		}
		return out, err
	})
}
