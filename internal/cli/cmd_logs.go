package cli

import (
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

func (a *app) newLogsCmd() *cobra.Command {
	var (
		follow  bool
		tail    uint32
		since   time.Duration
		sources []string
		level   string
	)
	cmd := &cobra.Command{
		Use:     "logs NAME",
		Aliases: []string{"lg"},
		Short:   "Show a sandbox's logs",
		Long: `Show recent log lines of a sandbox from the gateway ("gateway") and from the
sandbox's supervisor ("sandbox"). With --follow, keep printing new lines.`,
		Example: `  openshell logs dev --tail 50
  openshell logs dev --follow --source sandbox --level warn`,
		Args: argsUsage(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, s := range sources {
				if s != "gateway" && s != "sandbox" {
					return usagef("invalid --source %q: want gateway or sandbox", s)
				}
			}
			if since < 0 {
				return usagef("--since must be positive")
			}
			ctx := cmd.Context()
			name := args[0]
			sb, err := a.getSandbox(ctx, name)
			if err != nil {
				return err
			}
			var sinceMs int64
			if since > 0 {
				sinceMs = a.now().Add(-since).UnixMilli()
			}
			if !follow {
				resp, err := a.client.GetSandboxLogs(ctx, &openshellv1.GetSandboxLogsRequest{
					SandboxId: sb.GetMetadata().GetId(), Lines: tail, SinceMs: sinceMs,
					Sources: sources, MinLevel: level, Workspace: a.ws(),
				})
				if err != nil {
					return a.rpcError(err, sandboxWhat(name))
				}
				if a.structured() {
					return a.printProto(resp)
				}
				for _, l := range resp.GetLogs() {
					a.printLogLine(l)
				}
				return nil
			}
			stream, err := a.client.WatchSandbox(ctx, &openshellv1.WatchSandboxRequest{
				Id: sb.GetMetadata().GetId(), FollowLogs: true, LogTailLines: tail, LogSinceMs: sinceMs,
				LogSources: sources, LogMinLevel: level,
			})
			if err != nil {
				return a.rpcError(err, sandboxWhat(name))
			}
			for {
				ev, err := stream.Recv()
				if err != nil {
					if errors.Is(err, io.EOF) || ctx.Err() != nil {
						return nil //nolint:nilerr // end of stream or interrupted: a normal exit
					}
					return a.rpcError(err, sandboxWhat(name))
				}
				switch p := ev.GetPayload().(type) {
				case *openshellv1.SandboxStreamEvent_Log:
					if a.structured() {
						if err := a.printProto(p.Log); err != nil {
							return err
						}
						continue
					}
					a.printLogLine(p.Log)
				case *openshellv1.SandboxStreamEvent_Warning:
					_, _ = fmt.Fprintf(a.stderr, "warning: %s\n", p.Warning.GetMessage())
				}
			}
		},
	}
	f := cmd.Flags()
	f.BoolVarP(&follow, "follow", "f", false, "keep printing new log lines")
	f.Uint32Var(&tail, "tail", 0, "number of recent lines to show (default: the gateway's default, 200)")
	f.DurationVar(&since, "since", 0, "only lines newer than this, e.g. 10m or 2h")
	f.StringArrayVar(&sources, "source", nil, "only lines from this source: gateway or sandbox (repeatable)")
	f.StringVar(&level, "level", "", "minimum level: trace, debug, info, warn or error")
	return cmd
}

// printLogLine prints "TIME LEVEL [source] target: message k=v...".
func (a *app) printLogLine(l *openshellv1.SandboxLogLine) {
	var b strings.Builder
	b.WriteString(time.UnixMilli(l.GetTimestampMs()).UTC().Format("2006-01-02T15:04:05.000Z"))
	fmt.Fprintf(&b, " %-5s", strings.ToUpper(orDash(l.GetLevel())))
	if l.GetSource() != "" {
		fmt.Fprintf(&b, " [%s]", l.GetSource())
	}
	if l.GetTarget() != "" {
		fmt.Fprintf(&b, " %s:", l.GetTarget())
	}
	b.WriteString(" ")
	b.WriteString(l.GetMessage())
	if len(l.GetFields()) > 0 {
		keys := make([]string, 0, len(l.GetFields()))
		for k := range l.GetFields() {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(&b, " %s=%s", k, l.GetFields()[k])
		}
	}
	_, _ = fmt.Fprintln(a.stdout, b.String())
}
