package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"

	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
)

// structured reports whether -o asks for machine-readable output.
func (a *app) structured() bool { return a.output == "json" || a.output == "yaml" }

// printProto prints m as protobuf JSON (proto field names, stable
// whitespace) or as YAML converted from that JSON.
func (a *app) printProto(m proto.Message) error {
	b, err := marshalProto(m, a.output)
	if err != nil {
		return err
	}
	_, err = a.stdout.Write(b)
	return err
}

func marshalProto(m proto.Message, format string) ([]byte, error) {
	raw, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
	if err != nil {
		return nil, err
	}
	// protojson randomizes whitespace on purpose; normalize it.
	var compact bytes.Buffer
	if err := json.Compact(&compact, raw); err != nil {
		return nil, err
	}
	if format == "yaml" {
		return yaml.JSONToYAML(compact.Bytes())
	}
	var out bytes.Buffer
	if err := json.Indent(&out, compact.Bytes(), "", "  "); err != nil {
		return nil, err
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}

func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
}

// phaseName renders SANDBOX_PHASE_READY as "Ready".
func phaseName(p openshellv1.SandboxPhase) string {
	s := strings.TrimPrefix(p.String(), "SANDBOX_PHASE_")
	if s == "" {
		return "Unknown"
	}
	return s[:1] + strings.ToLower(s[1:])
}

// humanAge renders a duration like kubectl: 45s, 12m, 3h, 5d.
func humanAge(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	default:
		return fmt.Sprintf("%dd", int(d.Hours()/24))
	}
}

func (a *app) age(ms int64) string {
	if ms == 0 {
		return "-"
	}
	return humanAge(a.now().Sub(time.UnixMilli(ms)))
}

func formatMap(m map[string]string) string {
	if len(m) == 0 {
		return ""
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + m[k]
	}
	return strings.Join(parts, ",")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func sandboxImage(sb *openshellv1.Sandbox) string {
	return sb.GetSpec().GetTemplate().GetImage()
}

// printSandboxTable prints the sandbox list table.
func (a *app) printSandboxTable(sbs []*openshellv1.Sandbox, withWorkspace bool) error {
	tw := newTable(a.stdout)
	if withWorkspace {
		_, _ = fmt.Fprintln(tw, "WORKSPACE\tNAME\tPHASE\tIMAGE\tAGE")
	} else {
		_, _ = fmt.Fprintln(tw, "NAME\tPHASE\tIMAGE\tAGE")
	}
	for _, sb := range sbs {
		row := []string{sb.GetMetadata().GetName(), phaseName(sb.GetStatus().GetPhase()), orDash(sandboxImage(sb)), a.age(sb.GetMetadata().GetCreatedAtMs())}
		if withWorkspace {
			row = append([]string{orDash(sb.GetMetadata().GetWorkspace())}, row...)
		}
		_, _ = fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	return tw.Flush()
}

// printSandboxDetail prints one sandbox for "sandbox get".
func (a *app) printSandboxDetail(sb *openshellv1.Sandbox) error {
	md, spec, st := sb.GetMetadata(), sb.GetSpec(), sb.GetStatus()
	tw := newTable(a.stdout)
	row := func(k, v string) { _, _ = fmt.Fprintf(tw, "%s:\t%s\n", k, v) }
	row("Name", md.GetName())
	row("ID", md.GetId())
	row("Workspace", orDash(md.GetWorkspace()))
	row("Phase", phaseName(st.GetPhase()))
	row("Image", orDash(sandboxImage(sb)))
	row("Command", orDash(strings.Join(spec.GetCommand(), " ")))
	row("TTY", fmt.Sprint(spec.GetTty()))
	if len(spec.GetProviders()) > 0 {
		row("Providers", strings.Join(spec.GetProviders(), ","))
	}
	if md.GetCreatedAtMs() != 0 {
		row("Created", fmt.Sprintf("%s (%s ago)", time.UnixMilli(md.GetCreatedAtMs()).UTC().Format(time.RFC3339), a.age(md.GetCreatedAtMs())))
	}
	row("Labels", orDash(formatMap(md.GetLabels())))
	if st.ExitCode != nil {
		row("Exit code", fmt.Sprint(st.GetExitCode()))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if conds := st.GetConditions(); len(conds) > 0 {
		_, _ = fmt.Fprintln(a.stdout, "Conditions:")
		ct := newTable(a.stdout)
		_, _ = fmt.Fprintln(ct, "  TYPE\tSTATUS\tREASON\tMESSAGE")
		for _, c := range conds {
			_, _ = fmt.Fprintf(ct, "  %s\t%s\t%s\t%s\n", c.GetType(), c.GetStatus(), orDash(c.GetReason()), c.GetMessage())
		}
		return ct.Flush()
	}
	return nil
}
