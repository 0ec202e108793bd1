package upstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/mod/module"
	"golang.org/x/mod/sumdb/dirhash"
)

// DefaultProxy is where module zips come from when GOPROXY names none.
const DefaultProxy = "https://proxy.golang.org"

// Proxies reads a GOPROXY value ("https://a,https://b|direct") into the
// proxy URLs it lists, in order. "direct" and "off" are left out: Cozy
// fetches zips from a proxy only, and checks each against its pin.
func Proxies(goproxy string) []string {
	var out []string
	for _, p := range strings.FieldsFunc(goproxy, func(r rune) bool { return r == ',' || r == '|' }) {
		if p = strings.TrimSpace(p); p != "" && p != "direct" && p != "off" {
			out = append(out, strings.TrimRight(p, "/"))
		}
	}
	if len(out) == 0 {
		out = []string{DefaultProxy}
	}
	return out
}

// Source fetches module zips from Go module proxies into a cache laid out
// as the go command's download cache (CACHE/<escaped path>/@v/<version>.zip),
// so a GOMODCACHE's cache/download works as either.
type Source struct {
	// Proxies are tried in order; a proxy that does not have the module
	// (404, 410) passes to the next, as the go command does. http(s):// and
	// file:// URLs.
	Proxies []string
	// Cache is where zips are kept once checked. Required.
	Cache string
	// Client defaults to http.DefaultClient.
	Client *http.Client
}

// Zip returns the path of the module's zip in the cache, fetching it
// first if needed; the zip's hash must be sum.
func (s Source) Zip(ctx context.Context, m module.Version, sum string) (string, error) {
	if s.Cache == "" {
		return "", errors.New("upstream: no cache directory")
	}
	rel, err := zipPath(m)
	if err != nil {
		return "", err
	}
	cached := filepath.Join(s.Cache, rel)
	if err := checkZip(cached, m, sum); err == nil {
		return cached, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		// A damaged or foreign file: fetch it again rather than fail.
		_ = os.Remove(cached)
	}
	var tried []string
	for _, p := range s.Proxies {
		data, err := s.get(ctx, p, rel)
		if errors.Is(err, errNotFound) {
			tried = append(tried, p+": not found")
			continue
		}
		if err != nil {
			return "", fmt.Errorf("fetch %s: %w", m, err)
		}
		if err := os.MkdirAll(filepath.Dir(cached), 0o755); err != nil {
			return "", err
		}
		tmp := cached + ".partial"
		if err := os.WriteFile(tmp, data, 0o644); err != nil {
			return "", err
		}
		if err := checkZip(tmp, m, sum); err != nil {
			_ = os.Remove(tmp)
			return "", fmt.Errorf("fetch %s from %s: %w", m, p, err)
		}
		if err := os.Rename(tmp, cached); err != nil {
			return "", err
		}
		return cached, nil
	}
	return "", fmt.Errorf("fetch %s: no proxy has it (%s)", m, strings.Join(tried, "; "))
}

var errNotFound = errors.New("not found")

func (s Source) get(ctx context.Context, proxy, rel string) ([]byte, error) {
	u, err := url.Parse(proxy)
	if err != nil {
		return nil, fmt.Errorf("proxy %q: %w", proxy, err)
	}
	switch u.Scheme {
	case "file":
		data, err := os.ReadFile(filepath.Join(filepath.FromSlash(u.Path), rel))
		if errors.Is(err, os.ErrNotExist) {
			return nil, errNotFound
		}
		return data, err
	case "http", "https":
	default:
		return nil, fmt.Errorf("proxy %q: only http, https and file URLs", proxy)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, proxy+"/"+filepath.ToSlash(rel), nil)
	if err != nil {
		return nil, err
	}
	c := s.Client
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusGone:
		return nil, errNotFound
	case resp.StatusCode != http.StatusOK:
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("%s answered %s: %s", req.URL, resp.Status, strings.TrimSpace(string(body)))
	}
	return io.ReadAll(resp.Body)
}

// zipPath is the module zip's path in a proxy or download cache.
func zipPath(m module.Version) (string, error) {
	p, err := module.EscapePath(m.Path)
	if err != nil {
		return "", err
	}
	v, err := module.EscapeVersion(m.Version)
	if err != nil {
		return "", err
	}
	return filepath.Join(filepath.FromSlash(p), "@v", v+".zip"), nil
}

// checkZip fails unless file is the module's zip with hash sum.
func checkZip(file string, m module.Version, sum string) error {
	got, err := dirhash.HashZip(file, dirhash.Hash1)
	if err != nil {
		return err
	}
	if got != sum {
		return fmt.Errorf("module %s: the zip's hash is %s, Cozy pins %s", m, got, sum)
	}
	return nil
}
