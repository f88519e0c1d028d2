// Command openshell-gateway is a thin wrapper around gateway.Run.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/openshell-go/openshell/internal/gateway"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The first signal starts a graceful drain; restoring the default
	// handlers makes a second one end the process at once.
	context.AfterFunc(ctx, stop)
	if err := gateway.Run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) { // --help already printed the usage
			fmt.Fprintf(os.Stderr, "openshell-gateway: %v\n", err)
		}
		os.Exit(gateway.ExitCode(err))
	}
}
