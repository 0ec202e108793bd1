package imagefactory

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"cozy.dev/cozy/bootstrap/imagefactory/factorytest"
)

const doc = "customization:\n  systemExtensions:\n    officialExtensions:\n      - siderolabs/drbd\n"

func docID() string {
	sum := sha256.Sum256([]byte(doc))
	return hex.EncodeToString(sum[:])
}

func start(t *testing.T) (*factorytest.Factory, *Client) {
	f := factorytest.Start(t)
	return f, &Client{URL: f.URL + "/", HTTP: f.HTTP, Cache: t.TempDir()}
}

func TestRegisterAndFetch(t *testing.T) {
	f, c := start(t)
	ctx := context.Background()
	if err := c.Register(ctx, []byte(doc), docID()); err != nil {
		t.Fatal(err)
	}
	for _, asset := range []string{"kernel-amd64", "initramfs-amd64.xz"} {
		path, err := c.Asset(ctx, docID(), "v1.11.5", asset)
		if err != nil {
			t.Fatalf("%s: %v", asset, err)
		}
		if want := filepath.Join(c.Cache, docID(), "v1.11.5", asset); path != want {
			t.Errorf("%s kept at %s, want %s", asset, path, want)
		}
	}
	// Cached: no more requests.
	n := f.Requests.Load()
	if _, err := c.Asset(ctx, docID(), "v1.11.5", "kernel-amd64"); err != nil || f.Requests.Load() != n {
		t.Errorf("a cached asset was fetched again (%d requests, then %d), %v", n, f.Requests.Load(), err)
	}
}

func TestRegisterRejects(t *testing.T) {
	_, c := start(t)
	err := c.Register(context.Background(), []byte(doc), strings.Repeat("0", 64))
	if err == nil || !strings.Contains(err.Error(), "Cozy computed") {
		t.Errorf("a factory giving another ID: %v", err)
	}
	c.URL = "http://127.0.0.1:1"
	if err := c.Register(context.Background(), []byte(doc), docID()); err == nil || !strings.Contains(err.Error(), "register the schematic with http://127.0.0.1:1") {
		t.Errorf("an unreachable factory: %v", err)
	}
}

// A bad download never lands in the cache.
func TestAssetRejects(t *testing.T) {
	ctx := context.Background()
	for _, tt := range []struct {
		name, id, version, asset string
		serve                    func(w http.ResponseWriter, asset string) bool
		want                     string
	}{
		{name: "bad schematic ID", id: "abc", version: "v1.11.5", asset: "kernel-amd64", want: "want 64 hex digits"},
		{name: "bad version", id: docID(), version: "1.11", asset: "kernel-amd64", want: "want vX.Y.Z"},
		{name: "unknown asset", id: docID(), version: "v1.11.5", asset: "../../etc/passwd", want: "boot asset"},
		{name: "unregistered schematic", id: strings.Repeat("a", 64), version: "v1.11.5", asset: "kernel-amd64", want: "404 Not Found: schematic not found"},
		{name: "an error page with 200", id: docID(), version: "v1.11.5", asset: "kernel-amd64",
			serve: func(w http.ResponseWriter, _ string) bool { io.WriteString(w, "<html>maintenance</html>"); return true },
			want:  "is not a kernel-amd64"},
		{name: "a kernel posing as the initramfs", id: docID(), version: "v1.11.5", asset: "initramfs-amd64.xz",
			serve: func(w http.ResponseWriter, _ string) bool { _, _ = w.Write(factorytest.Kernel()); return true },
			want:  "is not a initramfs-amd64.xz"},
		{name: "cut short", id: docID(), version: "v1.11.5", asset: "kernel-amd64",
			serve: func(w http.ResponseWriter, _ string) bool {
				w.Header().Set("Content-Length", "100000")
				_, _ = w.Write(factorytest.Kernel())
				return true
			},
			want: "unexpected EOF"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f, c := start(t)
			if err := c.Register(ctx, []byte(doc), docID()); err != nil {
				t.Fatal(err)
			}
			f.Serve = tt.serve
			_, err := c.Asset(ctx, tt.id, tt.version, tt.asset)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error saying %q", err, tt.want)
			}
			var files []string
			filepath.WalkDir(c.Cache, func(p string, d os.DirEntry, err error) error {
				if err == nil && !d.IsDir() {
					files = append(files, p)
				}
				return nil
			})
			if len(files) != 0 {
				t.Errorf("the cache holds %v after a failed download", files)
			}
		})
	}
}
