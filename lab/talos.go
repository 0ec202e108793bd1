package lab

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"

	"cozy.dev/cozy/bootstrap/imagefactory"
	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/internal/kernelimage"
)

// TalosImage is the node image of --image talos: the real Talos kernel
// and initramfs for the lab rack's schematic and Talos version, from its
// Image Factory (the schematic registered first, unless the rack names
// an existing one), cached under cacheDir/talos. The netboot server adds
// Talos's kernel arguments, as for any rack. hc nil means
// http.DefaultClient.
func TalosImage(ctx context.Context, c *Config, hc *http.Client, cacheDir string) (kernelimage.Image, error) {
	r, err := rack.Parse(c.Rack(), filepath.Join(c.Dir, RackFile), c.Dir)
	if err != nil {
		return kernelimage.Image{}, fmt.Errorf("the lab's rack: %w", err)
	}
	s := r.Talos.Schematic
	id, err := s.SchematicID()
	if err != nil {
		return kernelimage.Image{}, err
	}
	fc := &imagefactory.Client{URL: r.Talos.Factory, HTTP: hc, Cache: filepath.Join(cacheDir, "talos")}
	if s.ID == "" {
		doc, err := s.SchematicDocument()
		if err != nil {
			return kernelimage.Image{}, err
		}
		if err := fc.Register(ctx, doc, id); err != nil {
			return kernelimage.Image{}, err
		}
	}
	kernel, err := fc.Asset(ctx, id, r.Talos.Version, "kernel-amd64")
	if err != nil {
		return kernelimage.Image{}, err
	}
	initrd, err := fc.Asset(ctx, id, r.Talos.Version, "initramfs-amd64.xz")
	if err != nil {
		return kernelimage.Image{}, err
	}
	return kernelimage.Image{Kernel: kernel, Initrds: []string{initrd}}, nil
}
