// Package registry runs an OCI distribution registry that Cozy can start
// itself: the lab runs one on its bridge, and an air-gapped rack can run
// one on the machine that netboots it. It is the CNCF distribution
// registry (github.com/distribution/distribution/v3, the code of the
// registry:3 image) used as a library, with its filesystem storage driver
// under one directory: what was pushed is still there after a restart.
//
// The registry is plain HTTP without authentication, for a private
// network: bind it to that network's address, not to every interface.
//
// Distribution logs through logrus's process-wide logger (its context
// logger is internal to it); the CLI points that logger at stderr.
package registry

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/distribution/distribution/v3/configuration"
	"github.com/distribution/distribution/v3/registry/handlers"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem" // the storage driver
)

// DrainTimeout bounds how long Serve waits for requests in flight (a
// layer upload) once asked to stop.
const DrainTimeout = 10 * time.Second

// Server is a registry listening on one address.
type Server struct {
	ln     net.Listener
	dir    string
	log    *slog.Logger
	server *http.Server
}

// Listen opens the registry's storage under dir (created if missing) and
// binds addr (host:port; port 0 picks one). Nothing is served before
// Serve.
func Listen(addr, dir string, log *slog.Logger) (*Server, error) {
	if dir == "" {
		return nil, errors.New("registry: no storage directory")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("registry storage: %w", err)
	}
	app, err := newApp(dir)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("registry: %w", err)
	}
	return &Server{
		ln:  ln,
		dir: dir,
		log: log,
		server: &http.Server{
			Handler:           app,
			ReadHeaderTimeout: 30 * time.Second,
		},
	}, nil
}

// Addr is the address the registry listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Serve answers requests until ctx ends, then stops taking new ones and
// waits up to DrainTimeout for those in flight. A clean stop returns nil.
func (s *Server) Serve(ctx context.Context) error {
	s.log.Info("registry serving", "addr", s.ln.Addr().String(), "storage", s.dir)
	errc := make(chan error, 1)
	go func() { errc <- s.server.Serve(s.ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("registry: %w", err)
	case <-ctx.Done():
	}
	s.log.Info("registry stopping", "drain", DrainTimeout.String())
	drain, cancel := context.WithTimeout(context.Background(), DrainTimeout)
	defer cancel()
	err := s.server.Shutdown(drain)
	if errors.Is(err, context.DeadlineExceeded) {
		err = s.server.Close()
	}
	if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	if err != nil {
		return fmt.Errorf("registry stop: %w", err)
	}
	s.log.Info("registry stopped")
	return nil
}

// newApp builds distribution's handler. Distribution reports a bad
// configuration by panicking; that becomes an error here.
func newApp(dir string) (app *handlers.App, err error) {
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return nil, err
	}
	cfg := &configuration.Configuration{
		Version: configuration.MajorMinorVersion(0, 1),
		Storage: configuration.Storage{
			"filesystem": configuration.Parameters{"rootdirectory": dir},
			// The purger runs for the life of the process and cannot be
			// stopped with the server; unfinished uploads are few here.
			"maintenance": configuration.Parameters{"uploadpurging": map[any]any{"enabled": false}},
		},
	}
	// Signs upload state between the requests of one upload; one
	// process serves them all, so a fresh secret per start is enough.
	cfg.HTTP.Secret = hex.EncodeToString(secret)
	defer func() {
		if p := recover(); p != nil {
			app, err = nil, fmt.Errorf("registry: %v", p)
		}
	}()
	return handlers.NewApp(context.Background(), cfg), nil
}
