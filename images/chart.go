package images

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"helm.sh/helm/v3/pkg/chart"
)

// The media types of a Helm chart stored in an OCI registry, as `helm
// push` writes it and Helm's and Flux's OCI clients read it.
const (
	HelmConfigMediaType = "application/vnd.cncf.helm.config.v1+json"
	HelmChartMediaType  = "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
)

// ChartTag is the tag of a chart version in a registry: OCI tags cannot
// hold "+", which Helm writes as "_".
func ChartTag(version string) string { return strings.ReplaceAll(version, "+", "_") }

// ChartImage is a packaged chart (archive, a .tgz) as the OCI artifact
// `helm push` makes: the chart's metadata as the config, the archive as
// the one layer. Unlike helm push it writes no creation time, so the same
// archive is always the same digest.
func ChartImage(meta *chart.Metadata, archive []byte) (v1.Image, error) {
	config, err := json.Marshal(meta)
	if err != nil {
		return nil, err
	}
	c := &chartArtifact{config: config, layer: archive}
	m := v1.Manifest{
		SchemaVersion: 2,
		MediaType:     types.OCIManifestSchema1,
		Config:        descriptor(HelmConfigMediaType, config),
		Layers:        []v1.Descriptor{descriptor(HelmChartMediaType, archive)},
		Annotations: map[string]string{
			"org.opencontainers.image.title":   meta.Name,
			"org.opencontainers.image.version": meta.Version,
		},
	}
	if c.manifest, err = json.Marshal(m); err != nil {
		return nil, err
	}
	return partial.CompressedToImage(c)
}

func descriptor(mt string, data []byte) v1.Descriptor {
	h, _, _ := v1.SHA256(bytes.NewReader(data))
	return v1.Descriptor{MediaType: types.MediaType(mt), Size: int64(len(data)), Digest: h}
}

// chartArtifact is the partial.CompressedImageCore of a chart: a raw
// config and one blob, stored as they are.
type chartArtifact struct{ config, layer, manifest []byte }

func (c *chartArtifact) RawConfigFile() ([]byte, error)      { return c.config, nil }
func (c *chartArtifact) MediaType() (types.MediaType, error) { return types.OCIManifestSchema1, nil }
func (c *chartArtifact) RawManifest() ([]byte, error)        { return c.manifest, nil }

func (c *chartArtifact) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	if d := descriptor(HelmChartMediaType, c.layer); d.Digest == h {
		return blob{d: d, data: c.layer}, nil
	}
	if d := descriptor(HelmConfigMediaType, c.config); d.Digest == h {
		return blob{d: d, data: c.config}, nil
	}
	return nil, fmt.Errorf("chart artifact has no blob %s", h)
}

// blob is one stored blob, as partial.CompressedLayer.
type blob struct {
	d    v1.Descriptor
	data []byte
}

func (b blob) Digest() (v1.Hash, error)            { return b.d.Digest, nil }
func (b blob) Compressed() (io.ReadCloser, error)  { return io.NopCloser(bytes.NewReader(b.data)), nil }
func (b blob) Size() (int64, error)                { return b.d.Size, nil }
func (b blob) MediaType() (types.MediaType, error) { return b.d.MediaType, nil }
