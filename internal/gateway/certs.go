package gateway

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/openshell-go/openshell/internal/pki"
)

// stringList is a repeatable, comma-splitting flag value.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error {
	for p := range strings.SplitSeq(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*l = append(*l, p)
		}
	}
	return nil
}

// RunGenerateCerts implements `openshell-gateway generate-certs`: it writes
// the CA, server and client certificates and the sandbox JWT key pair into
// --output-dir, idempotently (complete → skip, partial → error, empty →
// generate). args excludes the subcommand name.
func RunGenerateCerts(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("openshell-gateway generate-certs", flag.ContinueOnError)
	fs.SetOutput(stderr)
	outputDir := fs.String("output-dir", "", "directory to write the PKI bundle into (created 0700)")
	var sans stringList
	fs.Var(&sans, "server-san", "extra server certificate name or IP (repeatable, comma separated)")
	dryRun := fs.Bool("dry-run", false, "print what would be written and exit")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: openshell-gateway generate-certs --output-dir DIR [--server-san NAME]... [--dry-run]\n\n")
		fmt.Fprintf(stderr, "Writes %s under DIR.\nDefault server names: %s.\n\nFlags:\n",
			strings.Join(pki.DirFiles, ", "), strings.Join(pki.DefaultServerSANs, ", "))
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("generate-certs: unexpected argument %q", fs.Arg(0))
	}
	if *outputDir == "" {
		return errors.New("generate-certs: --output-dir is required")
	}
	sink := pki.Dir{Path: *outputDir}
	rep, err := pki.Ensure(ctx, sink, pki.Options{ServerSANs: sans}, *dryRun)
	if err != nil {
		return fmt.Errorf("generate-certs: %w", err)
	}
	switch rep.Outcome {
	case pki.Skipped:
		fmt.Fprintf(stdout, "PKI in %s is complete; skipped generation (nothing was changed)\n", sink)
	case pki.WouldGenerate:
		fmt.Fprintf(stdout, "dry run: would write to %s:\n", sink)
		for _, it := range rep.Items {
			fmt.Fprintf(stdout, "  %s\n", it)
		}
		fmt.Fprintf(stdout, "server names: %s\n", strings.Join(append(append([]string(nil), pki.DefaultServerSANs...), sans...), ", "))
	case pki.Generated:
		fmt.Fprintf(stdout, "generated PKI in %s:\n", sink)
		for _, it := range rep.Items {
			fmt.Fprintf(stdout, "  %s\n", it)
		}
		fmt.Fprintf(stdout, "sandbox JWT kid: %s\n", rep.KID)
	}
	return nil
}
