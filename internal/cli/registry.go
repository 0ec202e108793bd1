package cli

import (
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/sirupsen/logrus"
	"github.com/spf13/cobra"

	"cozy.dev/cozy/images/registry"
)

func newRegistryCommand(g *Globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "registry",
		Short: "Run a container image registry for a rack's images",
	}
	cmd.AddCommand(newRegistryServeCommand(g))
	return cmd
}

func newRegistryServeCommand(g *Globals) *cobra.Command {
	var listen, dir string
	cmd := &cobra.Command{
		Use:   "serve --listen ADDR --dir DIR",
		Short: "Serve an OCI registry from a directory, for registries.mirror",
		Long: `Serve an OCI distribution registry (the CNCF distribution registry, the
code of the registry:3 image) on ADDR, storing images under DIR: what was
pushed is there again after a restart. Fill it with 'cozyctl images mirror
--to ADDR --insecure' and point the rack at it with registries.mirror:
http://ADDR.

It speaks plain HTTP without authentication, for a private network (the
lab's bridge, a rack's provisioning network): listen on that network's
address, not on every interface. Logs go to stderr; SIGTERM or SIGINT
stops it after the requests in flight (at most 10s).`,
		Example: `  cozyctl registry serve --listen 10.0.0.1:5000 --dir /var/lib/cozy/registry`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Distribution logs through logrus's process-wide logger.
			logrus.SetOutput(g.stderr)
			logrus.SetLevel(logrusLevel(slog.Level(g.LogLevel)))
			s, err := registry.Listen(listen, dir, g.Logger())
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return s.Serve(ctx)
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "", "address to listen on, HOST:PORT (required)")
	cmd.Flags().StringVar(&dir, "dir", "", "directory the images are stored in, created if missing (required)")
	_ = cmd.MarkFlagRequired("listen")
	_ = cmd.MarkFlagRequired("dir")
	_ = cmd.MarkFlagDirname("dir")
	return cmd
}

func logrusLevel(l slog.Level) logrus.Level {
	switch {
	case l <= slog.LevelDebug:
		return logrus.DebugLevel
	case l <= slog.LevelInfo:
		return logrus.InfoLevel
	case l <= slog.LevelWarn:
		return logrus.WarnLevel
	}
	return logrus.ErrorLevel
}
