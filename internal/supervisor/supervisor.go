// Package supervisor is the openshell-sandbox supervisor that runs inside every sandbox.
package supervisor

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/openshell-go/openshell/internal/version"
)

// Run runs openshell-sandbox with args (without the program name).
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("openshell-sandbox", flag.ContinueOnError)
	fs.SetOutput(stderr)
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *showVersion {
		fmt.Fprintf(stdout, "openshell-sandbox %s\n", version.Version)
		return nil
	}
	return errors.New("serving is not implemented yet")
}

// ExitCode maps an error returned by Run to a process exit code.
func ExitCode(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	return 1
}
