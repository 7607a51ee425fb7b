// Command facilitator-dev holds the developer's tools around the facilitator: the local stack,
// the demo, the load command and the ledger filler. They live apart from `facilitator`, so that
// the production binary links no anvil launcher, load generator or demo. The local stack runs the
// production binary itself as a child process: what a developer tries is what ships.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

const usage = `usage: facilitator-dev <command> [flags]

commands:
  dev     run the whole local stack: anvil with Circle's USDC deployed and funded, plus
          'facilitator serve' against it (needs DATABASE_URL; 'make run' provides one)
  demo    the lost-response story on the local stack: pay, lose the answer, retry, look it up ('make demo')
  bench   load-test a running local stack ('make run') and the official facilitator beside it,
          print a table ('make bench-load')
  fill    grow a ledger synthetically (COPY) under a network id of its own, to measure costs at
          millions of rows ('facilitator-dev fill --rows 10000000')

dev and demo run the production binary, 'facilitator', found beside this one or on PATH
(--facilitator names another). Run 'facilitator-dev <command> -h' for a command's flags.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "dev":
		err = runDev(ctx, args[1:], getenv, stdout, stderr)
	case "demo":
		err = runDemo(ctx, args[1:], getenv, stdout, stderr)
	case "bench":
		err = runBench(ctx, args[1:], getenv, stdout, stderr)
	case "fill":
		err = runFill(ctx, args[1:], getenv, stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "facilitator-dev: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	default:
		fmt.Fprintf(stderr, "facilitator-dev: %v\n", err)
		return 1
	}
}
