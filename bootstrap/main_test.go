package bootstrap_test

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"testing"

	"cozy.dev/cozy/internal/cli"
	"cozy.dev/cozy/lab/talosnode"
)

// The test binary doubles as cozyctl (COZY_TEST_RUN_CLI=1) and as the
// emulated Talos node (COZY_TEST_RUN_TALOS_NODE=1), so both run as real
// processes inside the test's network namespace. No build tag on purpose:
// under any tags a re-executed binary must never run the tests again.
func TestMain(m *testing.M) {
	switch {
	case os.Getenv("COZY_TEST_RUN_CLI") == "1":
		os.Exit(cli.Execute(os.Args[1:], os.Stdout, os.Stderr))
	case os.Getenv("COZY_TEST_RUN_TALOS_NODE") == "1":
		os.Exit(runTalosNode(os.Args[1:]))
	}
	os.Exit(m.Run())
}

func runTalosNode(args []string) int {
	var cfg talosnode.Config
	fs := flag.NewFlagSet("cozy-talos-node", flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	node, err := talosnode.New(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cozy-talos-node:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := node.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "cozy-talos-node:", err)
		return 1
	}
	return 0
}
