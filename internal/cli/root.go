// Package cli is the cozyctl command tree. Each subcommand parses flags,
// calls into the library packages and prints their results with the output
// package; the libraries themselves never print.
package cli

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/spf13/cobra"

	"cozy.dev/cozy/internal/output"
)

// Globals are the flags every command accepts.
type Globals struct {
	// Kubeconfig is the path given with --kubeconfig; empty means the
	// usual client-go rules (KUBECONFIG, then ~/.kube/config).
	Kubeconfig string
	// Output is the -o format for command results.
	Output output.Format
	// LogLevel filters what goes to stderr.
	LogLevel logLevel

	stdout io.Writer
	stderr io.Writer
	logger *slog.Logger
}

// Logger returns the logger for progress messages; it writes to stderr at
// the --log-level given. Call it only once flags are parsed (in Run).
func (g *Globals) Logger() *slog.Logger {
	if g.logger == nil {
		g.logger = slog.New(slog.NewTextHandler(g.stderr, &slog.HandlerOptions{Level: slog.Level(g.LogLevel)}))
	}
	return g.logger
}

// Print writes a command result to stdout in the chosen -o format.
func (g *Globals) Print(v any) error { return output.Print(g.stdout, g.Output, v) }

// NewRootCommand builds the cozyctl command tree writing results to stdout
// and progress and errors to stderr.
func NewRootCommand(stdout, stderr io.Writer) *cobra.Command {
	root, _ := newRoot(stdout, stderr)
	return root
}

func newRoot(stdout, stderr io.Writer) (*cobra.Command, *Globals) {
	g := &Globals{
		Output:   output.Table,
		LogLevel: logLevel(slog.LevelInfo),
		stdout:   stdout,
		stderr:   stderr,
	}
	root := &cobra.Command{
		Use:   "cozyctl",
		Short: "Turn a rack of bare-metal servers into a private cloud",
		Long: `cozyctl netboots servers into Talos Linux, bootstraps a Kubernetes cluster
from one rack file, hands it to Flux for the platform layer, and runs a
QEMU lab rack to try all of it on one machine.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)

	pf := root.PersistentFlags()
	pf.StringVar(&g.Kubeconfig, "kubeconfig", "", "path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
	pf.VarP(&g.Output, "output", "o", "output format: table, json or yaml")
	pf.Var(&g.LogLevel, "log-level", "log level on stderr: debug, info, warn or error")
	_ = root.RegisterFlagCompletionFunc("output", fixedCompletion("table", "json", "yaml"))
	_ = root.RegisterFlagCompletionFunc("log-level", fixedCompletion("debug", "info", "warn", "error"))
	_ = root.MarkPersistentFlagFilename("kubeconfig")

	root.AddCommand(newVersionCommand(g))
	root.AddCommand(newPXECommand(g))
	root.AddCommand(newRackCommand(g))
	root.AddCommand(newTalosCommand(g))
	root.AddCommand(newBootstrapCommand(g))
	root.AddCommand(newPlatformCommand(g))
	root.AddCommand(newLabCommand(g))
	root.AddCommand(newTenantCommand(g))
	root.AddCommand(newImagesCommand(g))
	root.AddCommand(newRegistryCommand(g))
	root.AddCommand(newMachineCommand(g))
	root.AddCommand(newEtcdCommand(g))
	root.AddCommand(newNodeCommand(g))
	root.AddCommand(newUpgradeCommand(g))
	return root, g
}

// Execute runs cozyctl with args and returns the process exit code. Errors
// are printed once, to stderr, as "Error: ...".
func Execute(args []string, stdout, stderr io.Writer) int {
	root := NewRootCommand(stdout, stderr)
	root.SetArgs(args)
	if err := root.Execute(); err != nil {
		var code exitCode
		if errors.As(err, &code) {
			return int(code)
		}
		fmt.Fprintf(stderr, "Error: %v\n", err)
		return 1
	}
	return 0
}

// exitCode is the status of a program a command ran for the user (lab
// kubectl), passed on as cozyctl's own: that program said what failed.
type exitCode int

func (c exitCode) Error() string { return fmt.Sprintf("exit status %d", int(c)) }

func fixedCompletion(values ...string) func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return values, cobra.ShellCompDirectiveNoFileComp
	}
}

// logLevel is slog.Level as a pflag.Value.
type logLevel slog.Level

func (l *logLevel) String() string { return strings.ToLower(slog.Level(*l).String()) }

func (l *logLevel) Type() string { return "level" }

func (l *logLevel) Set(s string) error {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(s)); err != nil {
		return fmt.Errorf("unknown log level %q: use debug, info, warn or error", s)
	}
	*l = logLevel(lv)
	return nil
}
