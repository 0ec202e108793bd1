// Package httpboot serves what iPXE and UEFI HTTP-boot firmware fetch over
// HTTP: a per-machine iPXE script, the kernel and initramfs (with Range
// requests, so interrupted downloads resume), and the iPXE binaries.
package httpboot

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"time"
)

// Server is the netboot HTTP server's handler.
type Server struct {
	// Script returns the iPXE script for a machine, or false if this server
	// does not boot it (the request gets 404).
	Script func(mac net.HardwareAddr) (string, bool)
	// Assets are kernels and initramfs images by URL name, under /assets/.
	Assets map[string]string
	// BootFiles are iPXE binaries by name, under /boot/ (UEFI HTTP boot).
	BootFiles map[string]string
	// Log receives one line per request; nil discards.
	Log *slog.Logger
	// OnFetch, if set, hears of every file served in full, for the
	// machine inventory.
	OnFetch func(Fetch)
	// OnRequest, if set, hears of every request when it is answered.
	OnRequest func(path string, status int, bytes int64)
	// MachineConfig answers GET /config/{mac}/{token}.yaml: the config
	// with 200, or 403/404 and no body. Nil: every config is 404. Configs
	// hold cluster keys: neither they nor their tokens are logged.
	MachineConfig func(ConfigRequest) ([]byte, int)
}

// ConfigRequest is a machine asking for its config.
type ConfigRequest struct {
	MAC    net.HardwareAddr
	Token  string
	Remote netip.Addr
}

// Fetch is one successful download.
type Fetch struct {
	Kind   string           // "script", "asset" or "boot"
	Name   string           // asset or boot file name; empty for scripts
	MAC    net.HardwareAddr // scripts only: whose script
	Remote netip.Addr
}

func (s *Server) fetched(r *http.Request, f Fetch) {
	if s.OnFetch == nil {
		return
	}
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		f.Remote = ap.Addr().Unmap()
	}
	s.OnFetch(f)
}

// Handler returns the routes:
//
//	GET /ipxe/{mac}.ipxe   iPXE script (mac as 52-54-00-12-34-56)
//	GET /assets/{name}     kernel, initramfs
//	GET /boot/{name}       iPXE binaries
//	GET /config/{mac}/{token}.yaml  a machine's config (see MachineConfig)
//	GET /healthz           liveness
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ipxe/{file}", s.script)
	mux.HandleFunc("GET /assets/{name}", s.files("asset", s.Assets))
	mux.HandleFunc("GET /boot/{name}", s.files("boot", s.BootFiles))
	mux.HandleFunc("GET /config/{mac}/{file}", s.config)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	return s.logged(mux)
}

func (s *Server) logger() *slog.Logger {
	if s.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Log
}

func (s *Server) script(w http.ResponseWriter, r *http.Request) {
	name, ok := strings.CutSuffix(r.PathValue("file"), ".ipxe")
	if !ok {
		http.NotFound(w, r)
		return
	}
	mac, ok := parseMAC(name)
	if !ok {
		http.Error(w, "not a MAC address", http.StatusBadRequest)
		return
	}
	script, ok := s.Script(mac)
	if !ok {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if _, err := w.Write([]byte(script)); err == nil {
		s.fetched(r, Fetch{Kind: "script", MAC: mac})
	}
}

func (s *Server) config(w http.ResponseWriter, r *http.Request) {
	tok, ok := strings.CutSuffix(r.PathValue("file"), ".yaml")
	mac, macOK := parseMAC(r.PathValue("mac"))
	if !ok || !macOK || s.MachineConfig == nil {
		http.NotFound(w, r)
		return
	}
	req := ConfigRequest{MAC: mac, Token: tok}
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		req.Remote = ap.Addr().Unmap()
	}
	data, status := s.MachineConfig(req)
	if status != http.StatusOK {
		http.Error(w, http.StatusText(status), status)
		return
	}
	w.Header().Set("Content-Type", "application/yaml")
	w.Header().Set("Cache-Control", "no-store")
	if _, err := w.Write(data); err == nil {
		s.fetched(r, Fetch{Kind: "config", MAC: mac})
	}
}

// files serves a fixed set of files by name; names outside the set are 404
// whatever they contain, so there is no path to traverse.
func (s *Server) files(kind string, set map[string]string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, ok := set[r.PathValue("name")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		f, err := os.Open(p)
		if err != nil {
			s.logger().Error("open boot asset", "name", r.PathValue("name"), "err", err)
			http.Error(w, "asset unavailable", http.StatusInternalServerError)
			return
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			http.Error(w, "asset unavailable", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		// ServeContent answers Range and If-Range, so a client can resume.
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		http.ServeContent(rec, r, "", fi.ModTime(), f)
		// The download is complete when the last byte went out (a resumed
		// download ends with a Range request reaching the end).
		if (rec.status == http.StatusOK || rec.status == http.StatusPartialContent) && r.Method == http.MethodGet &&
			endsAt(rec, fi.Size()) {
			s.fetched(r, Fetch{Kind: kind, Name: r.PathValue("name")})
		}
	}
}

// endsAt reports whether a response carried a file's last byte.
func endsAt(rec *statusRecorder, size int64) bool {
	if rec.status == http.StatusOK {
		return rec.bytes == size
	}
	var first, last, total int64
	if _, err := fmt.Sscanf(rec.Header().Get("Content-Range"), "bytes %d-%d/%d", &first, &last, &total); err != nil {
		return false
	}
	return last == total-1
}

type statusRecorder struct {
	http.ResponseWriter
	status int
	bytes  int64
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	n, err := r.ResponseWriter.Write(b)
	r.bytes += int64(n)
	return n, err
}

// ReadFrom keeps net/http's sendfile path for files: without it, wrapping
// the ResponseWriter would copy every kernel and initramfs byte through
// user space.
func (r *statusRecorder) ReadFrom(src io.Reader) (int64, error) {
	rf, ok := r.ResponseWriter.(io.ReaderFrom)
	if !ok {
		return io.Copy(struct{ io.Writer }{r}, src)
	}
	n, err := rf.ReadFrom(src)
	r.bytes += n
	return n, err
}

func (s *Server) logged(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(rec, r)
		s.logger().Info("http", "method", r.Method, "path", redact(r.URL.Path), "client", r.RemoteAddr, "agent", r.UserAgent(),
			"status", rec.status, "bytes", rec.bytes, "duration", time.Since(start))
		if s.OnRequest != nil {
			s.OnRequest(r.URL.Path, rec.status, rec.bytes)
		}
	})
}

// parseMAC reads a MAC as URLs carry it: 52-54-00-12-34-56.
func parseMAC(s string) (net.HardwareAddr, bool) {
	mac, err := net.ParseMAC(strings.ReplaceAll(s, "-", ":"))
	return mac, err == nil && len(mac) == 6
}

// redact hides the token in a config path: a token in a log is a config
// anyone with the log can fetch.
func redact(path string) string {
	if rest, ok := strings.CutPrefix(path, "/config/"); ok {
		if mac, _, ok := strings.Cut(rest, "/"); ok {
			return "/config/" + mac + "/REDACTED"
		}
	}
	return path
}
