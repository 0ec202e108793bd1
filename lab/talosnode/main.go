package talosnode

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"k8s.io/klog/v2"
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
	if cfg.Platform == PlatformContainer && cfg.NodeServices && os.Getenv(mountNamespaceEnv) == "" {
		return inMountNamespace(args, stderr)
	}
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	// client-go logs its retries through klog; the node logs what they
	// come to.
	klog.SetOutput(io.Discard)
	klog.LogToStderr(false)
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

// mountNamespaceEnv marks the node process that runs in a mount
// namespace of its own (see inMountNamespace).
const mountNamespaceEnv = "COZY_TALOS_NODE_MOUNT_NAMESPACE"

// inMountNamespace runs the node again, with the same arguments, in a new
// mount and UTS namespace, and returns its exit code. A node of the container
// platform binds its disk over Talos's system directories; in a mount
// namespace of its own, the host never sees those mounts. Signals reach
// the node; the node dies with this process.
func inMountNamespace(args []string, stderr io.Writer) int {
	cmd := exec.Command("/proc/self/exe", args...)
	cmd.Env = append(os.Environ(), mountNamespaceEnv+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, stderr
	// Its own UTS namespace too: the node sets its hostname, which its
	// controller-manager and scheduler take as their identity.
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS, Pdeathsig: syscall.SIGKILL}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, os.Interrupt)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(stderr, "cozy-talos-node: a mount namespace for the container platform:", err)
		return 1
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for {
		select {
		case sig := <-sigs:
			_ = cmd.Process.Signal(sig)
		case err := <-done:
			var exit *exec.ExitError
			if errors.As(err, &exit) {
				return exit.ExitCode()
			}
			if err != nil {
				fmt.Fprintln(stderr, "cozy-talos-node:", err)
				return 1
			}
			return 0
		}
	}
}
