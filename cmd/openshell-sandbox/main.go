// Command openshell-sandbox is a thin wrapper around supervisor.Run.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/openshell-go/openshell/internal/supervisor"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := supervisor.Run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) { // --help already printed the usage
			fmt.Fprintf(os.Stderr, "openshell-sandbox: %v\n", err)
		}
		os.Exit(supervisor.ExitCode(err))
	}
}
