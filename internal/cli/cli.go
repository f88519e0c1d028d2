// Package cli is the openshell command-line client: a gateway registry kept
// on the client, sandbox lifecycle, exec, interactive shells over SSH, TCP
// forwarding and logs, all spoken over the OpenShell v1 gRPC API.
//
// The entry points are Run and ExitCode; cmd/openshell is a thin wrapper.
// Every command is a cobra command built per Run call, so Run is safe to
// call concurrently (tests do) as long as the environment is not changed
// underneath it.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"
	"google.golang.org/grpc"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// Run runs openshell with args (without the program name).
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	a := newApp(os.Stdin, stdout, stderr)
	return a.run(ctx, args)
}

// ExitCode maps an error returned by Run to a process exit code: 0 for nil,
// 2 for usage errors, the remote exit code for a command run in a sandbox,
// 130 for an interrupt and 1 for everything else.
func ExitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		return ee.Code
	}
	var ue *usageError
	if errors.As(err, &ue) {
		return 2
	}
	if errors.Is(err, context.Canceled) {
		return 130
	}
	return 1
}

// ExitError reports that a command run in a sandbox exited with a non-zero
// code; ExitCode returns that code.
type ExitError struct{ Code int }

func (e *ExitError) Error() string { return fmt.Sprintf("remote command exited with code %d", e.Code) }

// usageError is a command-line mistake: exit code 2.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error {
	return &usageError{err: fmt.Errorf(format, args...)}
}

// app holds the state of one Run: I/O, environment, global flags and the
// lazily dialled gateway connection.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
	lookupEnv      func(string) (string, bool)
	now            func() time.Time
	// stdinTerminal reports whether stdin is an interactive terminal.
	stdinTerminal func() bool
	// executable returns the absolute path of this program (ssh-config,
	// forward --background).
	executable func() (string, error)
	// onListen, when set, is told the address a foreground forward listens on.
	onListen func(net.Addr)

	// global flags
	gatewayName     string
	gatewayEndpoint string
	gatewayInsecure bool
	workspace       string
	// workspaceLoaded records that ws() consulted the registry once.
	workspaceLoaded bool
	output          string
	verbose         bool
	debug           bool

	logger   *slog.Logger
	executed bool
	// ctx is the context of this Run (for work done while resolving the
	// gateway, such as refreshing an OIDC token).
	ctx context.Context
	// openBrowser opens a URL for 'gateway login'; tests replace it.
	openBrowser func(string) error

	target *gatewayTarget
	conn   *grpc.ClientConn
	client openshellv1.OpenShellClient

	// probeWithoutCredentials lets 'status' dial a gateway whose stored
	// credentials cannot be used (credentialsProblem says why), to report
	// whether it is reachable.
	probeWithoutCredentials bool
	credentialsProblem      string
}

func newApp(stdin io.Reader, stdout, stderr io.Writer) *app {
	a := &app{
		stdin:       stdin,
		stdout:      stdout,
		stderr:      stderr,
		getenv:      os.Getenv,
		lookupEnv:   os.LookupEnv,
		now:         time.Now,
		openBrowser: defaultOpenBrowser,
		executable: func() (string, error) {
			p, err := os.Executable()
			if err != nil {
				return "", err
			}
			return p, nil
		},
	}
	a.stdinTerminal = func() bool {
		f, ok := a.stdin.(*os.File)
		return ok && term.IsTerminal(int(f.Fd()))
	}
	return a
}

func (a *app) run(ctx context.Context, args []string) error {
	a.ctx = ctx
	root := a.newRootCmd()
	root.SetArgs(args)
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)
	root.SetIn(a.stdin)
	cmd, err := root.ExecuteContextC(ctx)
	defer a.closeConn()
	if err == nil {
		return nil
	}
	if !a.executed {
		// Cobra failed before any command ran: flags, arguments or an
		// unknown command. These are usage errors.
		var ue *usageError
		if !errors.As(err, &ue) {
			err = &usageError{err: err}
		}
	}
	if errors.Is(err, context.Canceled) {
		var uerr *userError
		if !errors.As(err, &uerr) {
			return &userError{msg: "interrupted", cause: err}
		}
	}
	var ue *usageError
	if errors.As(err, &ue) && cmd != nil {
		return &usageError{err: fmt.Errorf("%w\nRun '%s --help' for usage", ue.err, cmd.CommandPath())}
	}
	return err
}

func (a *app) closeConn() {
	if a.conn != nil {
		_ = a.conn.Close()
		a.conn = nil
	}
}

func (a *app) stderrTerminal() bool {
	f, ok := a.stderr.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

func (a *app) stdoutTerminal() bool {
	f, ok := a.stdout.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// ws is the workspace requests name: --workspace, else OPENSHELL_WORKSPACE,
// else the default workspace registered for the selected gateway
// ('openshell workspace use'); empty means the gateway's default.
func (a *app) ws() string {
	if a.workspace == "" && !a.workspaceLoaded {
		a.workspaceLoaded = true
		a.workspace = a.registeredWorkspace()
	}
	return a.workspace
}

// registeredWorkspace is the default workspace stored with the gateway this
// invocation selects by name (--gateway, OPENSHELL_GATEWAY, active_gateway
// or the only registered one); "" when there is none or no registered
// gateway is selected. It reads the registry only: no dialing, no token
// refresh.
func (a *app) registeredWorkspace() string {
	name, err := a.selectedGatewayName()
	if err != nil || name == "" {
		return ""
	}
	e, err := a.newRegistry().Get(name)
	if err != nil {
		return ""
	}
	return e.Workspace
}

// wsDisplay is the workspace shown in messages.
func (a *app) wsDisplay() string {
	if a.ws() == "" {
		return "default"
	}
	return a.ws()
}

func (a *app) newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "openshell",
		Short: "Run AI agents in sandboxes managed by an OpenShell gateway",
		Long: `openshell talks to an OpenShell gateway: it creates sandboxes, runs commands in
them, opens interactive shells, forwards ports and shows logs.

Gateways are registered on this machine with "openshell gateway add"; without
one, openshell uses a gateway on 127.0.0.1:17670.`,
		SilenceErrors: true,
		SilenceUsage:  true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			a.executed = true
			return a.setup(cmd)
		},
		RunE: groupRunE,
	}
	root.CompletionOptions.DisableDefaultCmd = true
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err: err} })

	pf := root.PersistentFlags()
	pf.StringVar(&a.gatewayName, "gateway", "", "name of a registered gateway to use (env OPENSHELL_GATEWAY)")
	pf.StringVar(&a.gatewayEndpoint, "gateway-endpoint", "", "gateway endpoint URL: http://, https:// or unix:// (env OPENSHELL_GATEWAY_ENDPOINT)")
	pf.BoolVar(&a.gatewayInsecure, "gateway-insecure", false, "do not verify the gateway's TLS certificate (env OPENSHELL_GATEWAY_INSECURE)")
	pf.StringVar(&a.workspace, "workspace", "", "workspace to act in (env OPENSHELL_WORKSPACE; default \"default\")")
	pf.StringVarP(&a.output, "output", "o", "table", "output format: table, json or yaml")
	_ = root.RegisterFlagCompletionFunc("workspace", a.completeWorkspaces)
	_ = root.RegisterFlagCompletionFunc("gateway", a.completeGateways)
	_ = root.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"table", "json", "yaml"}, cobra.ShellCompDirectiveNoFileComp))
	pf.BoolVarP(&a.verbose, "verbose", "v", false, "print more detail")
	pf.BoolVar(&a.debug, "debug", false, "log RPC method names and status codes to stderr")

	root.AddCommand(
		a.newGatewayCmd(),
		a.newStatusCmd(),
		a.newWhoamiCmd(),
		a.newVersionCmd(),
		a.newCompletionCmd(root),
		a.newSandboxCmd(),
		a.newWorkspaceCmd(),
		a.newProviderCmd(),
		a.newInferenceCmd(),
		a.newPolicyCmd(),
		a.newSettingsCmd(),
		a.newRuleCmd(),
		a.newForwardCmd(),
		a.newServiceCmd(),
		a.newLogsCmd(),
		a.newSSHProxyCmd(),
	)
	return root
}

// groupRunE is the RunE of command groups: with no arguments it prints
// help, with an unknown subcommand it is a usage error.
func groupRunE(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("unknown command %q for %q", args[0], cmd.CommandPath())
	}
	return cmd.Help()
}

// setup applies environment defaults, validates global flags and builds the
// logger. It runs before every command.
func (a *app) setup(cmd *cobra.Command) error {
	flags := cmd.Flags()
	envDefault := func(flag, env string, dst *string) {
		if f := flags.Lookup(flag); f != nil && f.Changed {
			return
		}
		if v := a.getenv(env); v != "" {
			*dst = v
		}
	}
	envDefault("gateway", "OPENSHELL_GATEWAY", &a.gatewayName)
	envDefault("gateway-endpoint", "OPENSHELL_GATEWAY_ENDPOINT", &a.gatewayEndpoint)
	envDefault("workspace", "OPENSHELL_WORKSPACE", &a.workspace)
	if f := flags.Lookup("gateway-insecure"); (f == nil || !f.Changed) && a.getenv("OPENSHELL_GATEWAY_INSECURE") != "" {
		v, err := strconv.ParseBool(a.getenv("OPENSHELL_GATEWAY_INSECURE"))
		if err != nil {
			return usagef("invalid OPENSHELL_GATEWAY_INSECURE=%q: want true or false", a.getenv("OPENSHELL_GATEWAY_INSECURE"))
		}
		a.gatewayInsecure = v
	}
	switch a.output {
	case "table", "json", "yaml":
	default:
		return usagef("invalid --output %q: want table, json or yaml", a.output)
	}
	level := slog.LevelWarn
	if a.debug {
		level = slog.LevelDebug
	}
	a.logger = slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: level}))
	return nil
}

// noArgs, exactArgs etc. wrap cobra's validators so that their errors are
// usage errors.
func argsUsage(v cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := v(cmd, args); err != nil {
			return &usageError{err: err}
		}
		return nil
	}
}

// parseKV parses repeated k=v flags into a map.
// nameFromArgOrFlag returns the KIND name of a create command, given either
// as its one argument or with --name (flag), but not as two different values;
// missing is the usage error when it is given neither way.
func nameFromArgOrFlag(kind string, args []string, flag, missing string) (string, error) {
	switch {
	case len(args) == 1 && flag != "" && args[0] != flag:
		return "", usagef("give the %s name once: as an argument or with --name", kind)
	case len(args) == 1:
		return args[0], nil
	case flag == "":
		return "", usagef("%s", missing)
	}
	return flag, nil
}

// deleteEach calls del for every name, printing "Deleted KIND NAME" for each
// one that succeeded, and returns the joined errors of the ones that failed.
func (a *app) deleteEach(names []string, kind string, del func(name string) error) error {
	var errs []error
	for _, name := range names {
		if err := del(name); err != nil {
			errs = append(errs, err)
			continue
		}
		_, _ = fmt.Fprintf(a.stdout, "Deleted %s %s\n", kind, name)
	}
	return errors.Join(errs...)
}

func parseKV(flag string, vals []string) (map[string]string, error) {
	if len(vals) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(vals))
	for _, v := range vals {
		k, val, ok := strings.Cut(v, "=")
		if !ok || k == "" {
			return nil, usagef("invalid --%s %q: want KEY=VALUE", flag, v)
		}
		m[k] = val
	}
	return m, nil
}
