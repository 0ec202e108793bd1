package images

import (
	"context"
	"sync"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// blobHomes remembers, for one Mirror run, a repository of the target
// registry that holds each blob, so that an image sharing layers with
// one copied or found before mounts them (the distribution API's
// cross-repository mount, no bytes sent) instead of uploading them
// again into its own repository. A registry answers "do you have this
// blob" per repository, so without it every image would upload the base
// layers it shares with the others. It also knows which blobs an image
// is uploading now: a second image that needs one waits for it and then
// mounts it.
type blobHomes struct {
	mu   sync.Mutex
	home map[v1.Hash]name.Repository
	busy map[v1.Hash]chan struct{} // closed when its upload ends
}

func newBlobHomes() *blobHomes {
	return &blobHomes{home: map[v1.Hash]name.Repository{}, busy: map[v1.Hash]chan struct{}{}}
}

// reserve is called before an artifact whose blobs are blobs is written
// to repo. It waits while another image uploads one of them, then
// returns those with a home in another repository, to be mounted from
// there, and claims the rest for this upload; done(ok) makes repo their
// home if the write succeeded and frees them either way.
func (b *blobHomes) reserve(ctx context.Context, repo name.Repository, blobs []v1.Hash) (map[v1.Hash]name.Repository, func(ok bool), error) {
	for {
		b.mu.Lock()
		var wait chan struct{}
		for _, d := range blobs {
			if _, ok := b.home[d]; !ok && b.busy[d] != nil {
				wait = b.busy[d]
				break
			}
		}
		if wait != nil {
			b.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			}
		}
		mounts := map[v1.Hash]name.Repository{}
		var claimed []v1.Hash
		for _, d := range blobs {
			if h, ok := b.home[d]; ok {
				if h.String() != repo.String() {
					mounts[d] = h
				}
				continue
			}
			if b.busy[d] == nil { // listed twice in blobs: claimed above
				b.busy[d] = make(chan struct{})
				claimed = append(claimed, d)
			}
		}
		b.mu.Unlock()
		return mounts, func(ok bool) {
			b.mu.Lock()
			defer b.mu.Unlock()
			for _, d := range claimed {
				if ok {
					b.home[d] = repo
				}
				close(b.busy[d])
				delete(b.busy, d)
			}
		}, nil
	}
}

// found records repo as the home of blobs that have none: an artifact
// the registry already had there.
func (b *blobHomes) found(repo name.Repository, blobs []v1.Hash) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, d := range blobs {
		if _, ok := b.home[d]; !ok {
			b.home[d] = repo
		}
	}
}

// blobsOf lists the blobs an artifact's manifests name: every layer and
// config, of every image of an index.
func blobsOf(a *Artifact) ([]v1.Hash, error) {
	if a.Index != nil {
		return indexBlobs(a.Index)
	}
	return imageBlobs(a.Image)
}

func imageBlobs(img v1.Image) ([]v1.Hash, error) {
	m, err := img.Manifest()
	if err != nil {
		return nil, err
	}
	out := []v1.Hash{m.Config.Digest}
	for _, l := range m.Layers {
		out = append(out, l.Digest)
	}
	return out, nil
}

func indexBlobs(idx v1.ImageIndex) ([]v1.Hash, error) {
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	var out []v1.Hash
	for _, desc := range m.Manifests {
		var blobs []v1.Hash
		switch {
		case desc.MediaType.IsIndex():
			child, err := idx.ImageIndex(desc.Digest)
			if err != nil {
				return nil, err
			}
			blobs, err = indexBlobs(child)
			if err != nil {
				return nil, err
			}
		case desc.MediaType.IsImage():
			img, err := idx.Image(desc.Digest)
			if err != nil {
				return nil, err
			}
			if blobs, err = imageBlobs(img); err != nil {
				return nil, err
			}
		}
		out = append(out, blobs...)
	}
	return out, nil
}

// mountImage is an image whose layers and config found in mounts are
// remote.MountableLayers of their home, which go-containerregistry
// mounts from there rather than uploading. Its manifest, and so its
// digest, is the image's own.
type mountImage struct {
	v1.Image
	mounts map[v1.Hash]name.Repository
}

func (m mountImage) wrap(l v1.Layer) v1.Layer {
	d, err := l.Digest()
	if err != nil {
		return l
	}
	if repo, ok := m.mounts[d]; ok {
		return &remote.MountableLayer{Layer: l, Reference: repo.Digest(d.String())}
	}
	return l
}

func (m mountImage) Layers() ([]v1.Layer, error) {
	ls, err := m.Image.Layers()
	if err != nil {
		return nil, err
	}
	out := make([]v1.Layer, len(ls))
	for i, l := range ls {
		out[i] = m.wrap(l)
	}
	return out, nil
}

func (m mountImage) LayerByDigest(d v1.Hash) (v1.Layer, error) {
	l, err := m.Image.LayerByDigest(d)
	if err != nil {
		return nil, err
	}
	return m.wrap(l), nil
}

// ConfigLayer is what go-containerregistry uploads as the config blob.
func (m mountImage) ConfigLayer() (v1.Layer, error) {
	l, err := partial.ConfigLayer(m.Image)
	if err != nil {
		return nil, err
	}
	return m.wrap(l), nil
}

// Descriptor keeps the descriptor an index gave the image.
func (m mountImage) Descriptor() (*v1.Descriptor, error) { return partial.Descriptor(m.Image) }

// mountIndex is an index whose images are mountImages.
type mountIndex struct {
	idx    v1.ImageIndex
	mounts map[v1.Hash]name.Repository
}

func (m mountIndex) MediaType() (types.MediaType, error)       { return m.idx.MediaType() }
func (m mountIndex) Digest() (v1.Hash, error)                  { return m.idx.Digest() }
func (m mountIndex) Size() (int64, error)                      { return m.idx.Size() }
func (m mountIndex) IndexManifest() (*v1.IndexManifest, error) { return m.idx.IndexManifest() }
func (m mountIndex) RawManifest() ([]byte, error)              { return m.idx.RawManifest() }

func (m mountIndex) Image(d v1.Hash) (v1.Image, error) {
	img, err := m.idx.Image(d)
	if err != nil {
		return nil, err
	}
	return mountImage{img, m.mounts}, nil
}

func (m mountIndex) ImageIndex(d v1.Hash) (v1.ImageIndex, error) {
	idx, err := m.idx.ImageIndex(d)
	if err != nil {
		return nil, err
	}
	return mountIndex{idx, m.mounts}, nil
}

// Descriptor keeps the descriptor a parent index gave the index.
func (m mountIndex) Descriptor() (*v1.Descriptor, error) { return partial.Descriptor(m.idx) }
