package talosnode_test

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"testing"

	"cozy.dev/cozy/lab/talosnode"
)

// runNodeEnv makes the test binary run as cozy-talos-node, with the same
// flags, so tests can kill a node's process outright.
const runNodeEnv = "COZY_TEST_RUN_TALOS_NODE"

func TestMain(m *testing.M) {
	if os.Getenv(runNodeEnv) == "1" {
		os.Exit(runNode(os.Args[1:]))
	}
	os.Exit(m.Run())
}

func runNode(args []string) int {
	fs := flag.NewFlagSet("cozy-talos-node", flag.ContinueOnError)
	var cfg talosnode.Config
	cfg.RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	n, err := talosnode.New(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := n.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}
