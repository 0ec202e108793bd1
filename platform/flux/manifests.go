// Package flux installs Flux on a cluster and points it at the platform's
// Git repository, as `flux install` plus `flux bootstrap`'s sync objects do:
// it applies Flux's install manifests (the pinned release's install.yaml,
// or a local copy for air-gapped sites), then a GitRepository and a root
// Kustomization for the cluster's folder. `cozyctl platform install` and
// `cozyctl bootstrap` both call Install.
package flux

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// Version is the Flux release whose install manifests Install applies by
// default. Its controllers (source-controller v1.9.5, kustomize-controller
// v1.9.5, helm-controller v1.6.4) serve the API versions of the Flux API
// modules in go.mod (source v1, kustomize v1, helm v2).
const Version = "v2.9.5"

// ReleaseURL is where Flux publishes the install manifests of a release.
func ReleaseURL(version string) string {
	return "https://github.com/fluxcd/flux2/releases/download/" + version + "/install.yaml"
}

// maxManifestBytes bounds what Load reads: Flux's install.yaml is about
// 1 MiB; anything far larger is not it.
const maxManifestBytes = 64 << 20

// requiredCRDs are the Flux APIs the platform uses. Manifests without them
// are not Flux's.
var requiredCRDs = []string{
	"gitrepositories.source.toolkit.fluxcd.io",
	"helmrepositories.source.toolkit.fluxcd.io",
	"ocirepositories.source.toolkit.fluxcd.io",
	"helmcharts.source.toolkit.fluxcd.io",
	"kustomizations.kustomize.toolkit.fluxcd.io",
	"helmreleases.helm.toolkit.fluxcd.io",
}

// Load reads Flux's install manifests from src:
//   - "" : the pinned release (ReleaseURL(Version)), over HTTPS;
//   - an http(s) URL;
//   - a file of YAML documents (a release's install.yaml);
//   - a directory: built with kustomize if it has a kustomization.yaml
//     (so a site can patch images to its registry mirror), otherwise
//     every *.yaml and *.yml file in it, in lexical order.
//
// It fails unless the result holds the Flux CRDs the platform needs.
func Load(ctx context.Context, src string) ([]*unstructured.Unstructured, error) {
	if src == "" {
		src = ReleaseURL(Version)
	}
	objs, err := load(ctx, src)
	if err != nil {
		return nil, fmt.Errorf("read Flux manifests from %s: %w", src, err)
	}
	if err := checkFlux(objs); err != nil {
		return nil, fmt.Errorf("the Flux manifests from %s: %w", src, err)
	}
	return objs, nil
}

func load(ctx context.Context, src string) ([]*unstructured.Unstructured, error) {
	if strings.HasPrefix(src, "https://") || strings.HasPrefix(src, "http://") {
		data, err := download(ctx, src)
		if err != nil {
			return nil, err
		}
		return Decode(data, src)
	}
	fi, err := os.Stat(src)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		data, err := readFile(src)
		if err != nil {
			return nil, err
		}
		return Decode(data, src)
	}
	if _, err := os.Stat(filepath.Join(src, "kustomization.yaml")); err == nil {
		return kustomizeBuild(src)
	}
	var files []string
	err = filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if ext := filepath.Ext(path); !d.IsDir() && (ext == ".yaml" || ext == ".yml") {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, errors.New("the directory has no *.yaml files")
	}
	slices.Sort(files)
	var objs []*unstructured.Unstructured
	for _, f := range files {
		data, err := readFile(f)
		if err != nil {
			return nil, err
		}
		o, err := Decode(data, f)
		if err != nil {
			return nil, err
		}
		objs = append(objs, o...)
	}
	return objs, nil
}

func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readLimited(f)
}

func readLimited(r io.Reader) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxManifestBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxManifestBytes {
		return nil, fmt.Errorf("larger than %d MiB: not Flux's install manifests", maxManifestBytes>>20)
	}
	return data, nil
}

func download(ctx context.Context, url string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w (on a machine without internet, pass a local copy with --flux-manifests)", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return readLimited(resp.Body)
}

func kustomizeBuild(dir string) ([]*unstructured.Unstructured, error) {
	opts := krusty.MakeDefaultOptions()
	opts.LoadRestrictions = types.LoadRestrictionsRootOnly
	m, err := krusty.MakeKustomizer(opts).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build: %w", err)
	}
	data, err := m.AsYaml()
	if err != nil {
		return nil, err
	}
	return Decode(data, filepath.Join(dir, "kustomization.yaml"))
}

// Decode splits YAML or JSON documents into objects; List kinds are
// flattened. name is used in errors.
func Decode(data []byte, name string) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var objs []*unstructured.Unstructured
	for doc := 1; ; doc++ {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, fmt.Errorf("%s: document %d: %w", name, doc, err)
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		if u.IsList() {
			list, err := u.ToList()
			if err != nil {
				return nil, fmt.Errorf("%s: document %d: %w", name, doc, err)
			}
			for i := range list.Items {
				objs = append(objs, &list.Items[i])
			}
			continue
		}
		objs = append(objs, u)
	}
	for i, u := range objs {
		if u.GetAPIVersion() == "" || u.GetKind() == "" || u.GetName() == "" {
			return nil, fmt.Errorf("%s: object %d has no apiVersion, kind or metadata.name", name, i+1)
		}
	}
	if len(objs) == 0 {
		return nil, fmt.Errorf("%s: no objects", name)
	}
	return objs, nil
}

func checkFlux(objs []*unstructured.Unstructured) error {
	have := map[string]bool{}
	for _, u := range objs {
		if u.GetKind() == "CustomResourceDefinition" {
			have[u.GetName()] = true
		}
	}
	var missing []string
	for _, crd := range requiredCRDs {
		if !have[crd] {
			missing = append(missing, crd)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("no CustomResourceDefinition %s: these are not Flux's install manifests", strings.Join(missing, ", "))
	}
	return nil
}
