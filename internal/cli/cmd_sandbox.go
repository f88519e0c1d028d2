package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/pkg/sftp"
	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

func (a *app) newSandboxCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "sandbox",
		Aliases: []string{"sb"},
		Short:   "Create, inspect and use sandboxes",
		RunE:    groupRunE,
	}
	cmd.AddCommand(
		a.newSandboxCreateCmd(),
		a.newSandboxAdoptCmd(),
		a.newSandboxListCmd(),
		a.newSandboxGetCmd(),
		a.newSandboxDeleteCmd(),
		a.newSandboxStopStartCmd("stop"),
		a.newSandboxStopStartCmd("start"),
		a.newSandboxExecCmd(),
		a.newSandboxConnectCmd(),
		a.newSandboxUploadCmd(),
		a.newSandboxDownloadCmd(),
		a.newSSHConfigCmd(),
		a.newSandboxProviderCmd(),
	)
	return cmd
}

func sandboxWhat(name string) string { return fmt.Sprintf("sandbox %q", name) }

// getSandbox fetches a sandbox by name.
func (a *app) getSandbox(ctx context.Context, name string) (*openshellv1.Sandbox, error) {
	c, err := a.gateway()
	if err != nil {
		return nil, err
	}
	resp, err := c.GetSandbox(ctx, &openshellv1.GetSandboxRequest{Name: name, Workspace: a.ws()})
	if err != nil {
		return nil, a.rpcError(err, sandboxWhat(name))
	}
	return resp.GetSandbox(), nil
}

func (a *app) newSandboxCreateCmd() *cobra.Command {
	var (
		name, image         string
		labels, envs, provs []string
		tty, noTTY, detach  bool
		cpu, memory, gpu    string
		driverConfig        string
		forward             string
		policyFile          string
		upload              string
	)
	cmd := &cobra.Command{
		Use:   "create [flags] [-- CMD...]",
		Short: "Create a sandbox, wait until it is ready and open a shell in it",
		Long: `Create a sandbox and wait until it is ready, showing its progress.

The sandbox's main process is CMD. Without CMD the request carries no command
and the sandbox supervisor starts a login shell: /bin/bash -l when bash is
installed, else /bin/sh -l. Without --detach, an interactive shell is opened
in the sandbox once it is ready. With -o json|yaml the ready sandbox is
printed instead.

--cpu and --memory set resource limits (template.resources.limits);
--gpu N requests N GPUs; --driver-config-json passes a JSON object keyed by
driver name (e.g. {"kubernetes":{...}}) that the gateway hands to its compute
driver; keys for other drivers are ignored by the gateway. --forward
[LOCAL:]REMOTE starts a background forward (see 'openshell forward') once the
sandbox is ready. --upload LOCAL[:REMOTE] copies a file or directory into the
sandbox (see 'openshell sandbox upload') once it is ready, before the shell
opens; the main process may already be running by then.

Ctrl-C while the sandbox provisions asks whether to delete it.`,
		Example: `  openshell sandbox create --name dev
  openshell sandbox create --name agent --image ghcr.io/acme/agent:1 --env MODE=ci --detach -- claude
  openshell sandbox create --name web --cpu 2 --memory 4Gi --forward 8080 --detach -- python3 -m http.server 8080`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if tty && noTTY {
				return usagef("--tty and --no-tty are mutually exclusive")
			}
			var command []string
			if d := cmd.ArgsLenAtDash(); d >= 0 {
				if d > 0 {
					return usagef("unexpected arguments before --: %s", strings.Join(args[:d], " "))
				}
				command = args
			} else if len(args) > 0 {
				return usagef("put the sandbox command after --, e.g. 'openshell sandbox create -- %s'", strings.Join(args, " "))
			}
			lbl, err := parseKV("label", labels)
			if err != nil {
				return err
			}
			env, err := parseKV("env", envs)
			if err != nil {
				return err
			}
			resources, err := resourceLimits(cpu, memory)
			if err != nil {
				return err
			}
			var dc *structpb.Struct
			if driverConfig != "" {
				if dc, err = parseDriverConfig(driverConfig); err != nil {
					return err
				}
			}
			var fwdLocal, fwdRemote uint16
			if forward != "" {
				if a.structured() {
					return usagef("--forward cannot be combined with -o %s", a.output)
				}
				if fwdLocal, fwdRemote, err = parsePortSpec(forward); err != nil {
					return err
				}
			}
			useTTY := a.stdinTerminal()
			if tty {
				useTTY = true
			} else if noTTY {
				useTTY = false
			}
			spec := &openshellv1.SandboxSpec{Environment: env, Providers: provs, Command: command, Tty: useTTY}
			if image != "" || resources != nil || dc != nil {
				spec.Template = &openshellv1.SandboxTemplate{Image: image, Resources: resources, DriverConfig: dc}
			}
			if cmd.Flags().Changed("gpu") {
				n, err := strconv.ParseUint(gpu, 10, 32)
				if err != nil || n == 0 {
					return usagef("invalid --gpu %q: want a GPU count greater than 0", gpu)
				}
				count := uint32(n)
				spec.ResourceRequirements = &openshellv1.ResourceRequirements{Gpu: &openshellv1.GpuResourceRequirements{Count: &count}}
			}
			if policyFile == "" {
				policyFile = a.getenv("OPENSHELL_SANDBOX_POLICY")
			}
			if policyFile != "" {
				if spec.Policy, err = readPolicyFile(policyFile); err != nil {
					return err
				}
			}
			req := &openshellv1.CreateSandboxRequest{Spec: spec, Name: name, Labels: lbl, Workspace: a.ws()}
			upLocal, upRemote, _ := strings.Cut(upload, ":")
			if upload != "" && upLocal == "" {
				return usagef("invalid --upload %q: want LOCAL[:REMOTE]", upload)
			}
			return a.createSandbox(cmd.Context(), req, detach, func(name string) error {
				if upload != "" {
					report := a.stdout
					if a.structured() {
						report = a.stderr
					}
					if err := a.withSFTP(cmd.Context(), name, func(c *sftp.Client) error {
						return a.upload(c, upLocal, upRemote, report)
					}); err != nil {
						return err
					}
				}
				if forward == "" {
					return nil
				}
				return a.startBackgroundForward(cmd.Context(), name, fwdLocal, fwdRemote)
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&name, "name", "", "sandbox name (DNS label, at most 19 characters; default: generated)")
	f.StringVar(&image, "image", "", "container image (default: the driver's default image)")
	f.StringArrayVarP(&labels, "label", "l", nil, "label KEY=VALUE (repeatable)")
	f.StringArrayVarP(&envs, "env", "e", nil, "environment variable KEY=VALUE for the sandbox (repeatable)")
	f.StringArrayVar(&provs, "provider", nil, "provider to attach (repeatable)")
	f.BoolVar(&tty, "tty", false, "run the main process with a terminal (default: when stdin is a terminal)")
	f.BoolVar(&noTTY, "no-tty", false, "run the main process without a terminal")
	f.BoolVarP(&detach, "detach", "d", false, "do not open a shell once the sandbox is ready")
	f.StringVar(&cpu, "cpu", "", "CPU limit: cores or millicores, e.g. 2, 0.5 or 500m")
	f.StringVar(&memory, "memory", "", "memory limit: bytes or a quantity, e.g. 512Mi, 4Gi or 8G")
	f.StringVar(&gpu, "gpu", "", "number of GPUs to request (a count is required: the gateway has no driver-default GPU selection)")
	f.StringVar(&driverConfig, "driver-config-json", "", "driver-specific settings: a JSON object keyed by driver name")
	f.StringVar(&policyFile, "policy", "", "sandbox policy YAML file (OpenShell's policy format; see 'openshell policy'; env OPENSHELL_SANDBOX_POLICY)")
	_ = cmd.MarkFlagFilename("policy", "yaml", "yml")
	f.StringVar(&upload, "upload", "", "once ready, copy a local file or directory into the sandbox (LOCAL[:REMOTE], REMOTE default /sandbox)")
	f.StringVar(&forward, "forward", "", "once ready, forward 127.0.0.1:LOCAL to port REMOTE in the sandbox in the background ([LOCAL:]REMOTE)")
	return cmd
}

var (
	millicoresRE = regexp.MustCompile(`^[0-9]+m$`)
	memoryRE     = regexp.MustCompile(`^([0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|K|M|G|T|P|E)?$`)
)

// resourceLimits builds template.resources {"limits":{"cpu","memory"}} as
// OpenShell's CLI does, or nil when neither is set.
func resourceLimits(cpu, memory string) (*structpb.Struct, error) {
	limits := map[string]any{}
	if cpu != "" {
		c := strings.TrimSpace(cpu)
		positive := false
		if millicoresRE.MatchString(c) {
			n, err := strconv.ParseUint(strings.TrimSuffix(c, "m"), 10, 64)
			positive = err == nil && n > 0
		} else if f, err := strconv.ParseFloat(c, 64); err == nil {
			positive = f > 0 && !math.IsInf(f, 0)
		} else {
			return nil, usagef("invalid --cpu %q: want positive cores or millicores, e.g. 2, 0.5 or 500m", cpu)
		}
		if !positive {
			return nil, usagef("--cpu must be greater than zero")
		}
		limits["cpu"] = c
	}
	if memory != "" {
		m := strings.TrimSpace(memory)
		sub := memoryRE.FindStringSubmatch(m)
		if sub == nil {
			return nil, usagef("invalid --memory %q: want positive bytes or a quantity such as 512Mi, 4Gi or 8G", memory)
		}
		if strings.TrimLeft(sub[1], "0") == "" {
			return nil, usagef("--memory must be greater than zero")
		}
		limits["memory"] = m
	}
	if len(limits) == 0 {
		return nil, nil
	}
	return structpb.NewStruct(map[string]any{"limits": limits})
}

// parseDriverConfig parses --driver-config-json: a JSON object keyed by
// driver name.
func parseDriverConfig(s string) (*structpb.Struct, error) {
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		return nil, usagef("--driver-config-json must be valid JSON: %v", err)
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, usagef("--driver-config-json must be a JSON object keyed by driver name, e.g. {\"kubernetes\":{...}}")
	}
	st, err := structpb.NewStruct(obj)
	if err != nil {
		return nil, usagef("--driver-config-json: %v", err)
	}
	return st, nil
}

// createSandbox creates the sandbox, waits for READY, runs afterReady (if
// any) and then attaches a shell unless detach.
func (a *app) createSandbox(ctx context.Context, req *openshellv1.CreateSandboxRequest, detach bool, afterReady func(name string) error) error {
	c, err := a.gateway()
	if err != nil {
		return err
	}
	what := "sandbox"
	if req.Name != "" {
		what = sandboxWhat(req.Name)
	}
	resp, err := c.CreateSandbox(ctx, req)
	if err != nil {
		return a.rpcError(err, what)
	}
	sb := resp.GetSandbox()
	name := sb.GetMetadata().GetName()
	if !a.structured() {
		_, _ = fmt.Fprintf(a.stderr, "Created sandbox %s\n", name)
	}
	ready, err := a.waitReady(ctx, sb)
	if err != nil {
		if errors.Is(err, context.Canceled) || ctx.Err() != nil {
			return a.interruptedProvisioning(name)
		}
		return err
	}
	if a.structured() {
		return a.printProto(ready)
	}
	_, _ = fmt.Fprintf(a.stderr, "Sandbox %s is ready\n", name)
	if afterReady != nil {
		if err := afterReady(name); err != nil {
			return err
		}
	}
	if detach {
		_, _ = fmt.Fprintf(a.stderr, "Connect with: openshell sandbox connect %s\n", name)
		return nil
	}
	return a.connect(ctx, ready)
}

// interruptedProvisioning handles Ctrl-C while a sandbox provisions: on a
// terminal it asks whether to delete the sandbox, otherwise it leaves it
// and says how to delete it.
func (a *app) interruptedProvisioning(name string) error {
	_, _ = fmt.Fprintln(a.stderr)
	if !a.stdinTerminal() {
		_, _ = fmt.Fprintf(a.stderr, "Interrupted; sandbox %s was left in place. Delete it with: openshell sandbox delete %s\n", name, name)
		return context.Canceled
	}
	_, _ = fmt.Fprintf(a.stderr, "delete sandbox %s? [y/N] ", name)
	line, _ := bufio.NewReader(a.stdin).ReadString('\n')
	if ans := strings.ToLower(strings.TrimSpace(line)); ans != "y" && ans != "yes" {
		_, _ = fmt.Fprintf(a.stderr, "Sandbox %s was left in place. Delete it with: openshell sandbox delete %s\n", name, name)
		return context.Canceled
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := a.client.DeleteSandbox(ctx, &openshellv1.DeleteSandboxRequest{Name: name, Workspace: a.ws()}); err != nil {
		return a.rpcError(err, sandboxWhat(name))
	}
	_, _ = fmt.Fprintf(a.stderr, "Deleted sandbox %s\n", name)
	return context.Canceled
}

// readyFailure builds the error for a sandbox in phase ERROR.
func readyFailure(sb *openshellv1.Sandbox) error {
	name := sb.GetMetadata().GetName()
	msg := ""
	for _, c := range sb.GetStatus().GetConditions() {
		if c.GetMessage() == "" {
			continue
		}
		if msg == "" || (c.GetType() == "Ready" && c.GetStatus() == "False") {
			msg = c.GetMessage()
			if c.GetReason() != "" {
				msg = c.GetReason() + ": " + msg
			}
		}
	}
	if msg == "" {
		msg = "no reason given"
	}
	if sb.GetStatus().ExitCode != nil {
		msg += fmt.Sprintf(" (main process exit code %d)", sb.GetStatus().GetExitCode())
	}
	return &userError{msg: fmt.Sprintf("sandbox %s failed: %s\nhint: 'openshell logs %s' shows what happened", name, msg, name)}
}

// waitReady follows the sandbox until it is READY, showing phase changes and
// platform events. It falls back to polling GetSandbox when the gateway
// does not implement WatchSandbox.
func (a *app) waitReady(ctx context.Context, sb *openshellv1.Sandbox) (*openshellv1.Sandbox, error) {
	name := sb.GetMetadata().GetName()
	p := newProgress(a.stderr, a.stderrTerminal() && !a.structured(), name)
	defer p.stop()
	check := func(sb *openshellv1.Sandbox) (bool, error) {
		ph := sb.GetStatus().GetPhase()
		p.setPhase(phaseName(ph))
		switch ph {
		case openshellv1.SandboxPhase_SANDBOX_PHASE_READY:
			return true, nil
		case openshellv1.SandboxPhase_SANDBOX_PHASE_ERROR:
			return false, readyFailure(sb)
		case openshellv1.SandboxPhase_SANDBOX_PHASE_DELETING:
			return false, &userError{msg: fmt.Sprintf("sandbox %s is being deleted", name)}
		}
		return false, nil
	}
	if ok, err := check(sb); ok || err != nil {
		return sb, err
	}
	stream, err := a.client.WatchSandbox(ctx, &openshellv1.WatchSandboxRequest{
		Id: sb.GetMetadata().GetId(), FollowStatus: true, FollowEvents: true, StopOnTerminal: true,
	})
	if err == nil {
		for {
			ev, rerr := stream.Recv()
			if rerr != nil {
				err = rerr
				break
			}
			switch pl := ev.GetPayload().(type) {
			case *openshellv1.SandboxStreamEvent_Sandbox:
				sb = pl.Sandbox
				if ok, err := check(sb); ok || err != nil {
					return sb, err
				}
			case *openshellv1.SandboxStreamEvent_Event:
				e := pl.Event
				if e.GetReason() != "" {
					p.line("  %s: %s", e.GetReason(), e.GetMessage())
				} else {
					p.line("  %s", e.GetMessage())
				}
			case *openshellv1.SandboxStreamEvent_Warning:
				p.line("  warning: %s", pl.Warning.GetMessage())
			case *openshellv1.SandboxStreamEvent_Log:
				if a.verbose {
					p.line("  %s", pl.Log.GetMessage())
				}
			}
		}
	}
	if ctx.Err() != nil {
		return nil, context.Canceled
	}
	if err != nil && !errors.Is(err, io.EOF) && status.Code(err) != codes.Unimplemented {
		return nil, a.rpcError(err, sandboxWhat(name))
	}
	// The watch ended (or is not served): poll until a terminal answer.
	for {
		cur, err := a.getSandbox(ctx, name)
		if err != nil {
			if ctx.Err() != nil {
				return nil, context.Canceled
			}
			return nil, err
		}
		if ok, err := check(cur); ok || err != nil {
			return cur, err
		}
		select {
		case <-ctx.Done():
			return nil, context.Canceled
		case <-time.After(time.Second):
		}
	}
}

func (a *app) newSandboxListCmd() *cobra.Command {
	var (
		names, all bool
		selector   string
	)
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List sandboxes",
		Args:    argsUsage(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.gateway()
			if err != nil {
				return err
			}
			req := &openshellv1.ListSandboxesRequest{LabelSelector: selector, AllWorkspaces: all, Limit: 1000}
			if !all {
				req.Workspace = a.ws()
			}
			var sbs []*openshellv1.Sandbox
			for {
				resp, err := c.ListSandboxes(cmd.Context(), req)
				if err != nil {
					return a.rpcError(err, "")
				}
				sbs = append(sbs, resp.GetSandboxes()...)
				if len(resp.GetSandboxes()) < int(req.Limit) {
					break
				}
				req.Offset += req.Limit
			}
			switch {
			case a.structured():
				return a.printProto(&openshellv1.ListSandboxesResponse{Sandboxes: sbs})
			case names:
				for _, sb := range sbs {
					_, _ = fmt.Fprintln(a.stdout, sb.GetMetadata().GetName())
				}
				return nil
			case len(sbs) == 0:
				_, _ = fmt.Fprintf(a.stderr, "No sandboxes in workspace %q\n", a.wsDisplay())
				return nil
			}
			return a.printSandboxTable(sbs, all)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&names, "names", false, "print only names, one per line")
	f.StringVarP(&selector, "selector", "l", "", "label selector k=v[,k2=v2]")
	f.BoolVarP(&all, "all-workspaces", "A", false, "list sandboxes in every workspace (platform admins)")
	return cmd
}

func (a *app) newSandboxGetCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "get NAME",
		Short: "Show one sandbox",
		Args:  argsUsage(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := a.getSandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if a.structured() {
				return a.printProto(sb)
			}
			return a.printSandboxDetail(sb)
		},
	}
}

func (a *app) newSandboxDeleteCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "delete NAME...",
		Aliases: []string{"rm"},
		Short:   "Delete sandboxes",
		Args:    argsUsage(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.gateway()
			if err != nil {
				return err
			}
			return a.deleteEach(args, "sandbox", func(name string) error {
				if _, err := c.DeleteSandbox(cmd.Context(), &openshellv1.DeleteSandboxRequest{Name: name, Workspace: a.ws()}); err != nil {
					return a.rpcError(err, sandboxWhat(name))
				}
				return nil
			})
		},
	}
}

func (a *app) newSandboxStopStartCmd(verb string) *cobra.Command {
	short := "Stop a sandbox, keeping its state"
	if verb == "start" {
		short = "Start a stopped sandbox"
	}
	return &cobra.Command{
		Use:   verb + " NAME",
		Short: short,
		Args:  argsUsage(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.gateway()
			if err != nil {
				return err
			}
			name := args[0]
			var resp *openshellv1.SandboxResponse
			if verb == "stop" {
				resp, err = c.StopSandbox(cmd.Context(), &openshellv1.StopSandboxRequest{Name: name, Workspace: a.ws()})
			} else {
				resp, err = c.StartSandbox(cmd.Context(), &openshellv1.StartSandboxRequest{Name: name, Workspace: a.ws()})
			}
			if err != nil {
				return a.rpcError(err, sandboxWhat(name))
			}
			if a.structured() {
				return a.printProto(resp.GetSandbox())
			}
			_, _ = fmt.Fprintf(a.stdout, "Sandbox %s: %s\n", name, phaseName(resp.GetSandbox().GetStatus().GetPhase()))
			return nil
		},
	}
}
