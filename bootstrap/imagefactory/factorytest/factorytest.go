// Package factorytest is a local stand-in for the Talos Image Factory,
// speaking the two parts of its protocol Cozy uses: POST /schematics (a
// schematic's ID is the SHA-256 of its document) and
// GET /image/<schematic>/<version>/<asset> for registered schematics. Its
// assets are not Talos: only their first bytes are what a Linux kernel
// and an xz archive start with.
package factorytest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// Factory is a running stand-in, on loopback, stopped when the test ends.
type Factory struct {
	URL  string
	HTTP *http.Client
	// Requests counts every request served.
	Requests atomic.Int32
	// Serve, if set, may answer an asset request itself (returning true).
	Serve func(w http.ResponseWriter, asset string) bool

	mu         sync.Mutex
	schematics map[string]bool
}

// Start runs a Factory for t.
func Start(t testing.TB) *Factory {
	f := &Factory{schematics: map[string]bool{}}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	f.URL, f.HTTP = srv.URL, srv.Client()
	return f
}

// Kernel is the start of an x86 Linux kernel: "HdrS" at 0x202.
func Kernel() []byte {
	b := make([]byte, 4096)
	copy(b[0x202:], "HdrS")
	return b
}

// XZ is the start of an xz archive.
func XZ() []byte { return append([]byte("\xfd7zXZ\x00"), make([]byte, 4096)...) }

func (f *Factory) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.Requests.Add(1)
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/schematics":
		body, _ := io.ReadAll(r.Body)
		sum := sha256.Sum256(body)
		id := hex.EncodeToString(sum[:])
		f.mu.Lock()
		f.schematics[id] = true
		f.mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%q}`, id)
	case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/image/"):
		parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/image/"), "/")
		f.mu.Lock()
		known := len(parts) == 3 && f.schematics[parts[0]]
		f.mu.Unlock()
		if !known {
			http.Error(w, "schematic not found", http.StatusNotFound)
			return
		}
		if f.Serve != nil && f.Serve(w, parts[2]) {
			return
		}
		if strings.HasPrefix(parts[2], "kernel-") {
			_, _ = w.Write(Kernel())
		} else {
			_, _ = w.Write(XZ())
		}
	default:
		http.NotFound(w, r)
	}
}
