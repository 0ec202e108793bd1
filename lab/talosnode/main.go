package talosnode

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

// Main is the cozy-talos-node command: it parses args into a Config, runs
// the node until SIGTERM or SIGINT (or a shutdown through the API) and
// returns the process exit code: 0, RebootExitCode when the machine must
// reboot, 1 on failure, 2 on bad flags. Tests that run the node as a
// process call it from their TestMain.
func Main(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("cozy-talos-node", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg Config
	cfg.RegisterFlags(fs)
	debug := fs.Bool("debug", false, "log every request")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	level := slog.LevelInfo
	if *debug {
		level = slog.LevelDebug
	}
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	node, err := New(cfg)
	if err != nil {
		fmt.Fprintln(stderr, "cozy-talos-node:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	err = node.Run(ctx)
	switch {
	case errors.Is(err, ErrReboot):
		return RebootExitCode
	case err != nil:
		fmt.Fprintln(stderr, "cozy-talos-node:", err)
		return 1
	}
	return 0
}
