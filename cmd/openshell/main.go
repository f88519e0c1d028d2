// Command openshell is a thin wrapper around cli.Run.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/openshell-go/openshell/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := cli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		var exit *cli.ExitError
		if !errors.As(err, &exit) { // a remote exit code is not an error message
			fmt.Fprintf(os.Stderr, "openshell: %v\n", err)
		}
		os.Exit(cli.ExitCode(err))
	}
}
