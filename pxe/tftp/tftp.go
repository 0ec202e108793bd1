// Package tftp serves iPXE binaries to firmware PXE clients: read-only, and
// only the files it was given by name, so no request can reach anything else
// on disk. Transfers negotiate blksize and tsize (RFC 2348, 2349) through
// github.com/pin/tftp/v3; that library does not implement RFC 7440
// windowsize, so transfers are lock-step.
package tftp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path"
	"strings"
	"time"

	"github.com/pin/tftp/v3"
)

// Server is a read-only TFTP server over a fixed set of files.
type Server struct {
	// Files maps the name a client asks for (e.g. "undionly.kpxe") to the
	// file on disk.
	Files map[string]string
	// Log receives one line per transfer; nil discards.
	Log *slog.Logger
	// Timeout is the per-packet retransmission timeout (default 2s: PXE
	// ROMs give up after a few seconds, so waiting longer helps nobody).
	Timeout time.Duration
	// OnSent, if set, hears of every completed transfer; OnFailed of
	// every transfer that did not complete.
	OnSent   func(file string, client netip.Addr)
	OnFailed func()
}

// Errors the read handler returns; the client sees them as TFTP errors.
var (
	ErrBadName  = errors.New("invalid file name")
	ErrNotFound = errors.New("file not found")
)

// CleanName turns a requested file name into the key of Files, rejecting
// anything that tries to leave the served set: "..", NUL, backslashes and
// names longer than a TFTP packet allows.
func CleanName(name string) (string, error) {
	if name == "" || len(name) > 255 || strings.ContainsAny(name, "\x00\\") {
		return "", fmt.Errorf("%w %q", ErrBadName, name)
	}
	for _, seg := range strings.Split(name, "/") {
		if seg == ".." {
			return "", fmt.Errorf("%w %q: path traversal", ErrBadName, name)
		}
	}
	clean := strings.TrimPrefix(path.Clean("/"+name), "/")
	if clean == "" {
		return "", fmt.Errorf("%w %q", ErrBadName, name)
	}
	return clean, nil
}

// Serve answers read requests on conn until ctx ends; write requests are
// refused. It returns nil after a clean shutdown, in which transfers in
// flight are allowed to finish.
func (s *Server) Serve(ctx context.Context, conn net.PacketConn) error {
	srv := tftp.NewServer(s.read, nil)
	timeout := s.Timeout
	if timeout == 0 {
		timeout = 2 * time.Second
	}
	srv.SetTimeout(timeout)
	srv.SetHook(hook{s.logger(), s.OnSent, s.OnFailed})
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			srv.Shutdown()
		case <-done:
		}
	}()
	err := srv.Serve(conn)
	close(done)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

func (s *Server) logger() *slog.Logger {
	if s.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Log
}

func (s *Server) read(name string, rf io.ReaderFrom) error {
	key, err := CleanName(name)
	if err != nil {
		s.logger().Warn("tftp request refused", "file", name, "err", err)
		return err
	}
	p, ok := s.Files[key]
	if !ok {
		s.logger().Info("tftp file not found", "file", key)
		return fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	f, err := os.Open(p)
	if err != nil {
		s.logger().Error("tftp open", "file", key, "err", err)
		return fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil {
		// tsize: PXE ROMs ask for the size before they allocate memory.
		if ot, ok := rf.(tftp.OutgoingTransfer); ok {
			ot.SetSize(fi.Size())
		}
	}
	_, err = rf.ReadFrom(f)
	return err
}

type hook struct {
	log      *slog.Logger
	onSent   func(string, netip.Addr)
	onFailed func()
}

func (h hook) OnSuccess(st tftp.TransferStats) {
	h.log.Info("tftp sent", "file", st.Filename, "client", st.RemoteAddr, "duration", st.Duration, "datagrams", st.DatagramsSent)
	if ip, ok := netip.AddrFromSlice(st.RemoteAddr); ok && h.onSent != nil {
		name, _ := CleanName(st.Filename)
		h.onSent(name, ip.Unmap())
	}
}

func (h hook) OnFailure(st tftp.TransferStats, err error) {
	h.log.Warn("tftp transfer failed", "file", st.Filename, "client", st.RemoteAddr, "err", err)
	if h.onFailed != nil {
		h.onFailed()
	}
}
