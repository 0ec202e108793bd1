// Package imagefactory fetches a rack's Talos boot assets from the Talos
// Image Factory (factory.talos.dev or a mirror of its API): it registers
// the rack's schematic (POST /schematics) and downloads the kernel and
// initramfs of that schematic and Talos version
// (GET /image/<schematic>/<version>/<asset>) into a cache, where they
// stay: under one schematic and version the factory's assets never change.
//
// Nothing here is used unless a user asks for real Talos images
// (`cozyctl lab up --image talos`); the tests run it against a local
// server that speaks the factory's protocol.
package imagefactory

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"cozy.dev/cozy/internal/kernelimage"
)

// Client talks to one Image Factory.
type Client struct {
	// URL is the factory's base URL, e.g. https://factory.talos.dev.
	URL string
	// HTTP is the client to use; nil means http.DefaultClient.
	HTTP *http.Client
	// Cache is the directory assets are kept in, by schematic and version.
	Cache string
}

// maxAsset bounds a download: Talos's initramfs is about 100 MB.
const maxAsset = 1 << 30

var (
	schematicID = regexp.MustCompile(`^[0-9a-f]{64}$`)
	version     = regexp.MustCompile(`^v\d+\.\d+\.\d+(-[0-9A-Za-z.]+)?$`)
	assetName   = regexp.MustCompile(`^(kernel-(amd64|arm64)|initramfs-(amd64|arm64)\.xz)$`)
)

// Register posts a schematic document and returns the ID the factory
// gives it, which must be want (the SHA-256 of the document, as the rack
// computes it): another ID means the factory and Cozy disagree on what
// the nodes will run.
func (c *Client) Register(ctx context.Context, doc []byte, want string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(c.URL, "/")+"/schematics", bytes.NewReader(doc))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/yaml")
	resp, err := c.http().Do(req)
	if err != nil {
		return fmt.Errorf("register the schematic with %s: %w", c.URL, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return fmt.Errorf("register the schematic with %s: %w", c.URL, err)
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("register the schematic with %s: %s: %s", c.URL, resp.Status, snippet(body))
	}
	var out struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(body, &out); err != nil {
		return fmt.Errorf("register the schematic with %s: reply %q: %w", c.URL, snippet(body), err)
	}
	if out.ID != want {
		return fmt.Errorf("the factory %s gave the schematic ID %q, Cozy computed %s: the nodes would not run what the rack says", c.URL, out.ID, want)
	}
	return nil
}

// Asset returns the path of a boot asset (kernel-amd64,
// initramfs-amd64.xz, or the arm64 ones) of schematic id at Talos
// version v, downloading it into the cache first if it is not there.
// A download is checked to be what its name says (a Linux kernel, an xz
// archive) before it is kept, so an error page never poses as a kernel.
func (c *Client) Asset(ctx context.Context, id, v, asset string) (string, error) {
	switch {
	case !schematicID.MatchString(id):
		return "", fmt.Errorf("schematic ID %q: want 64 hex digits", id)
	case !version.MatchString(v):
		return "", fmt.Errorf("version %q of Talos: want vX.Y.Z", v)
	case !assetName.MatchString(asset):
		return "", fmt.Errorf("boot asset %q: want kernel-amd64, initramfs-amd64.xz or their arm64 twins", asset)
	}
	dir := filepath.Join(c.Cache, id, v)
	path := filepath.Join(dir, asset)
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	url := fmt.Sprintf("%s/image/%s/%s/%s", strings.TrimSuffix(c.URL, "/"), id, v, asset)
	if err := c.download(ctx, url, path, asset); err != nil {
		return "", fmt.Errorf("%s: %w", url, err)
	}
	return path, nil
}

// download writes url to path through a temporary file renamed into
// place once complete and checked, so the cache never holds a partial
// or wrong asset.
func (c *Client) download(ctx context.Context, url, path, asset string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.http().Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%s: %s", resp.Status, snippet(body))
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+asset+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	n, err := io.Copy(tmp, io.LimitReader(resp.Body, maxAsset+1))
	if err == nil && n > maxAsset {
		err = fmt.Errorf("larger than %d bytes", maxAsset)
	}
	if err == nil && resp.ContentLength >= 0 && n != resp.ContentLength {
		err = fmt.Errorf("got %d of %d bytes", n, resp.ContentLength)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := checkAsset(tmp.Name(), asset); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// checkAsset reads the magic numbers of a downloaded asset: a kernel of
// the asset's architecture (kernelimage), or xz, which starts with FD 37
// 7A 58 5A 00.
func checkAsset(path, asset string) error {
	var ok bool
	switch asset {
	case "kernel-amd64", "kernel-arm64":
		arch, err := kernelimage.Arch(path)
		if err != nil {
			return err
		}
		ok = "kernel-"+arch == asset
	default:
		ok = bytes.HasPrefix(fileStart(path), []byte("\xfd7zXZ\x00"))
	}
	if !ok {
		return fmt.Errorf("the download is not a %s (it starts %s)", asset, hex.EncodeToString(fileStart(path)))
	}
	return nil
}

// fileStart is the first 16 bytes of a file, for an error message.
func fileStart(path string) []byte {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	head := make([]byte, 16)
	n, _ := io.ReadFull(f, head)
	return head[:n]
}

func (c *Client) http() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return http.DefaultClient
}

// snippet is the start of a reply, for an error message.
func snippet(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}
