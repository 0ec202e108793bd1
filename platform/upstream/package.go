package upstream

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
)

// Packaged is a chart made from its module.
type Packaged struct {
	Chart *chart.Chart
	// Archive is the chart's .tgz as `helm package` lays it out, with
	// every file time set to the Unix epoch so that it is reproducible.
	Archive []byte
}

// Package cuts the chart out of the module zip (already checked against
// c.Sum by Source.Zip), runs the release's edits and packages it.
func (c Chart) Package(zipFile string) (*Packaged, error) {
	tmp, err := os.MkdirTemp("", "cozy-chart-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	if err := extract(zipFile, c.Module.String(), append([]string{c.Dir}, c.Also...), tmp); err != nil {
		return nil, fmt.Errorf("chart %s: %w", c.Ref(), err)
	}
	if c.release != nil {
		if err := c.release(tmp); err != nil {
			return nil, fmt.Errorf("chart %s: release step: %w", c.Ref(), err)
		}
	}
	ch, err := loader.LoadDir(filepath.Join(tmp, filepath.FromSlash(c.Dir)))
	if err != nil {
		return nil, fmt.Errorf("chart %s: %w", c.Ref(), err)
	}
	if ch.Name() != c.Name {
		return nil, fmt.Errorf("chart %s: %s of %s holds chart %q", c.Ref(), c.Dir, c.Module, ch.Name())
	}
	ch.Metadata.Version = c.Version
	if c.AppVersion != "" {
		ch.Metadata.AppVersion = c.AppVersion
	}
	sortDependencies(ch)
	file, err := chartutil.Save(ch, tmp)
	if err != nil {
		return nil, fmt.Errorf("chart %s: %w", c.Ref(), err)
	}
	archive, err := reproducible(file)
	if err != nil {
		return nil, fmt.Errorf("chart %s: %w", c.Ref(), err)
	}
	return &Packaged{Chart: ch, Archive: archive}, nil
}

// sortDependencies puts subcharts in name order, all the way down: Helm's
// loader collects them through a map, so their order (and the archive's
// bytes) would change from one run to the next.
func sortDependencies(ch *chart.Chart) {
	deps := ch.Dependencies()
	slices.SortFunc(deps, func(a, b *chart.Chart) int { return strings.Compare(a.Name(), b.Name()) })
	for _, d := range deps {
		sortDependencies(d)
	}
	ch.SetDependencies(deps...)
}

// extract writes the files of the module zip below each of dirs into
// root, keeping their paths. The zip's files are "<module>@<version>/...".
func extract(zipFile, mod string, dirs []string, root string) error {
	z, err := zip.OpenReader(zipFile)
	if err != nil {
		return err
	}
	defer z.Close()
	found := map[string]bool{}
	for _, f := range z.File {
		rel, ok := strings.CutPrefix(f.Name, mod+"/")
		if !ok || strings.HasSuffix(f.Name, "/") {
			continue
		}
		var in string
		for _, d := range dirs {
			if strings.HasPrefix(rel, d+"/") {
				in = d
			}
		}
		if in == "" {
			continue
		}
		if rel != path.Clean(rel) || !filepath.IsLocal(rel) {
			return fmt.Errorf("the zip holds %q, a path outside the module", f.Name)
		}
		found[in] = true
		if err := writeZipFile(f, filepath.Join(root, filepath.FromSlash(rel))); err != nil {
			return err
		}
	}
	for _, d := range dirs {
		if !found[d] {
			return fmt.Errorf("module %s has no folder %s", mod, d)
		}
	}
	return nil
}

func writeZipFile(f *zip.File, dst string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	r, err := f.Open()
	if err != nil {
		return err
	}
	defer r.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, r); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// reproducible rewrites Helm's archive with every entry's time at the
// epoch: chartutil.Save stamps each with the time of saving.
func reproducible(file string) ([]byte, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Header.Extra, zw.Header.Comment = zr.Header.Extra, zr.Header.Comment
	tr, tw := tar.NewReader(zr), tar.NewWriter(zw)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		h.ModTime, h.AccessTime, h.ChangeTime = time.Unix(0, 0), time.Time{}, time.Time{}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
