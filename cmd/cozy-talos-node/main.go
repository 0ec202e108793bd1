// Command cozy-talos-node is an emulated Talos Linux node: it serves
// Talos's machine API on --address:50000 in maintenance mode until a
// machine config is applied, then in configured mode, and runs etcd and
// kube-apiserver once bootstrapped. See lab/talosnode and
// docs/talos-node.md.
//
//	cozy-talos-node --address 10.0.0.11/24 --state-dir /var/lib/node \
//	    --mac 52:54:00:00:00:01 --uuid 6f1c... --disk vda:20GiB:virtio
//
// It runs until SIGTERM or SIGINT, or until the machine is shut down
// through the API. With --reboot=exit it also exits when the machine
// should reboot, with status 10 (talosnode.RebootExitCode), so a VM's init
// can reboot the VM; it exits 0 when the machine should power off.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"cozy.dev/cozy/lab/talosnode"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	fs := flag.NewFlagSet("cozy-talos-node", flag.ContinueOnError)
	var cfg talosnode.Config
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
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	node, err := talosnode.New(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cozy-talos-node:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	err = node.Run(ctx)
	switch {
	case errors.Is(err, talosnode.ErrReboot):
		return talosnode.RebootExitCode
	case err != nil:
		fmt.Fprintln(os.Stderr, "cozy-talos-node:", err)
		return 1
	}
	return 0
}
