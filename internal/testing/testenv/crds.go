// Package testenv runs a real kube-apiserver and etcd for integration tests
// (controller-runtime's envtest) with the upstream CRDs Cozy builds on:
// Cluster API core and kubeadm bootstrap, the KubeVirt infrastructure
// provider (CAPK), the Kamaji control-plane provider and Flux's source,
// kustomize and helm controllers.
//
// The CRDs are read from the Go module cache at the pinned versions, never
// copied into this repository; modules that go.mod does not require are
// fetched with `go mod download`. The binaries come from
// hack/envtest-assets.sh through KUBEBUILDER_ASSETS.
package testenv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/mod/module"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// CRDSource is where an upstream Go module keeps CRDs, e.g.
// sigs.k8s.io/cluster-api@v1.14.2 core/config/crd.
type CRDSource struct {
	Module  string
	Version string
	// Dir is a directory holding a kustomization.yaml whose resources are
	// the CRD files, a YAML file of CRDs, or a Go file whose string
	// literals hold CRDs as YAML (CDI generates its CRDs that way).
	Dir string
}

func (s CRDSource) String() string { return s.Module + "@" + s.Version + "/" + s.Dir }

// UpstreamCRDs returns the CRD sources integration tests load by default, at
// the versions DESIGN.md pins.
func UpstreamCRDs() []CRDSource {
	return []CRDSource{
		{"sigs.k8s.io/cluster-api", "v1.14.2", "core/config/crd"},
		{"sigs.k8s.io/cluster-api", "v1.14.2", "bootstrap/kubeadm/config/crd"},
		{"sigs.k8s.io/cluster-api-provider-kubevirt", "v0.11.2", "config/crd"},
		{"github.com/clastix/cluster-api-control-plane-provider-kamaji", "v0.20.0", "config/crd"},
		{"github.com/fluxcd/source-controller", "v1.9.6", "config/crd"},
		{"github.com/fluxcd/kustomize-controller", "v1.9.6", "config/crd"},
		{"github.com/fluxcd/helm-controller", "v1.6.4", "config/crd"},
	}
}

// PlatformCRDs returns the CRD sources of the kinds the platform's own
// components install (MetalLB, the Cluster API operator, KubeVirt, CDI,
// the CSI snapshot API),
// at the versions charts/platform/values.yaml pins
// (TestPlatformCRDsMatchThePins keeps the two together).
func PlatformCRDs() []CRDSource {
	return []CRDSource{
		{"go.universe.tf/metallb", "v0.15.2", "config/crd"},
		{"sigs.k8s.io/cluster-api-operator", "v0.29.0", "config/crd"},
		{KubeVirtModule, KubeVirtVersion, "manifests/generated/kv-resource.yaml"},
		{"kubevirt.io/containerized-data-importer", "v1.64.0", "pkg/operator/resources/crds_generated.go"},
		{SnapshotterClientModule, "v8.6.0", "config/crd"},
	}
}

// SnapshotterClientModule is external-snapshotter's API module: the
// snapshot CRDs the platform's snapshot-controller component installs
// (its client/config/crd, at the same tag).
const SnapshotterClientModule = "github.com/kubernetes-csi/external-snapshotter/client/v8"

// noSumDB lists the modules whose checksums the checksum database, as
// reached from here, does not serve (it answers 404); they are fetched
// from the module proxy unverified. Only tests read them, for CRDs.
var noSumDB = map[string]bool{"kubevirt.io/containerized-data-importer": true}

// ModuleDir returns the module cache directory of module@version,
// downloading it through the Go module proxy if needed. It works for
// modules go.mod does not require because it runs outside any module.
func ModuleDir(ctx context.Context, module, version string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", module+"@"+version)
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), "GOWORK=off", "GO111MODULE=on", "GOFLAGS=-mod=mod")
	if noSumDB[module] {
		cmd.Env = append(cmd.Env, "GONOSUMDB="+module)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	// go mod download reports per-module failures in the JSON, with exit 1.
	var res struct{ Dir, Error string }
	if jerr := json.Unmarshal(out, &res); jerr == nil && res.Error != "" {
		return "", fmt.Errorf("go mod download %s@%s: %s", module, version, res.Error)
	}
	if err != nil {
		return "", fmt.Errorf("go mod download %s@%s: %w: %s", module, version, err, bytes.TrimSpace(stderr.Bytes()))
	}
	if res.Dir == "" {
		return "", fmt.Errorf("go mod download %s@%s: no directory in %q", module, version, out)
	}
	return res.Dir, nil
}

// kustomization is the part of kustomize's file format that CRD
// directories use: which files, and which labels to stamp on them. The
// labels matter: Cluster API finds a provider's contract version through
// labels like cluster.x-k8s.io/v1beta2: v1alpha2 that only kustomize adds.
// Patches are left out on purpose: upstream's only add conversion webhooks
// and CA injection, which need a webhook server tests do not run.
type kustomization struct {
	Resources    []string          `json:"resources"`
	CommonLabels map[string]string `json:"commonLabels"`
	Labels       []struct {
		Pairs map[string]string `json:"pairs"`
	} `json:"labels"`
}

// LoadCRDs reads the CRDs of each source from the module cache, with the
// labels their kustomization declares.
func LoadCRDs(ctx context.Context, sources []CRDSource) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, src := range sources {
		modDir, err := ModuleDir(ctx, src.Module, src.Version)
		if err != nil {
			return nil, err
		}
		got, err := readCRDs(filepath.Join(modDir, src.Dir))
		if err != nil {
			return nil, fmt.Errorf("load CRDs from %s: %w", src, err)
		}
		crds = append(crds, got...)
	}
	return crds, nil
}

// readCRDs reads the CRDs at path: a kustomization directory, a YAML
// file, or a Go file of string literals.
func readCRDs(path string) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	switch filepath.Ext(path) {
	case ".yaml", ".yml":
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		return decodeCRDs(f)
	case ".go":
		return readGoCRDs(path)
	}
	return readKustomizedCRDs(path)
}

// readGoCRDs parses a Go file (without compiling or importing it) and
// decodes every string constant in it that is a CRD's YAML: a literal, or
// literals joined with + (a raw string cannot hold a backquote, so
// generators write "`" apart).
func readGoCRDs(path string) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	file, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	var crds []*apiextensionsv1.CustomResourceDefinition
	var derr error
	ast.Inspect(file, func(n ast.Node) bool {
		e, ok := n.(ast.Expr)
		if !ok || derr != nil {
			return derr == nil
		}
		text, ok := stringConstant(e)
		if !ok {
			return true
		}
		if strings.Contains(text, "kind: CustomResourceDefinition") {
			got, err := decodeCRDs(strings.NewReader(text))
			if err != nil {
				derr = fmt.Errorf("%s: %w", filepath.Base(path), err)
			}
			crds = append(crds, got...)
		}
		return false // its parts are not CRDs by themselves
	})
	if derr == nil && len(crds) == 0 {
		derr = fmt.Errorf("%s holds no CRD", filepath.Base(path))
	}
	return crds, derr
}

// stringConstant is the value of a string literal, or of string literals
// joined with +.
func stringConstant(e ast.Expr) (string, bool) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(e.Value)
		return s, err == nil
	case *ast.BinaryExpr:
		if e.Op != token.ADD {
			return "", false
		}
		x, ok := stringConstant(e.X)
		if !ok {
			return "", false
		}
		y, ok := stringConstant(e.Y)
		return x + y, ok
	case *ast.ParenExpr:
		return stringConstant(e.X)
	}
	return "", false
}

func readKustomizedCRDs(dir string) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		return nil, err
	}
	var k kustomization
	if err := yaml.Unmarshal(raw, &k); err != nil {
		return nil, fmt.Errorf("parse kustomization.yaml: %w", err)
	}
	if len(k.Resources) == 0 {
		return nil, errors.New("kustomization.yaml lists no resources")
	}
	labels := map[string]string{}
	for key, v := range k.CommonLabels {
		labels[key] = v
	}
	for _, l := range k.Labels {
		for key, v := range l.Pairs {
			labels[key] = v
		}
	}

	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, res := range k.Resources {
		f, err := os.Open(filepath.Join(dir, res))
		if err != nil {
			return nil, err
		}
		got, err := decodeCRDs(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", res, err)
		}
		for _, crd := range got {
			if len(labels) > 0 && crd.Labels == nil {
				crd.Labels = map[string]string{}
			}
			for key, v := range labels {
				crd.Labels[key] = v
			}
		}
		crds = append(crds, got...)
	}
	return crds, nil
}

// decodeCRDs reads every CustomResourceDefinition of a multi-document YAML
// stream; any other kind is an error, since a CRD directory holds only CRDs.
func decodeCRDs(r io.Reader) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(r, 4096)
	var crds []*apiextensionsv1.CustomResourceDefinition
	for {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := dec.Decode(crd); err != nil {
			if errors.Is(err, io.EOF) {
				return crds, nil
			}
			return nil, err
		}
		if crd.Kind == "" && crd.Name == "" {
			continue // an empty document between separators
		}
		if crd.Kind != "CustomResourceDefinition" {
			return nil, fmt.Errorf("expected a CustomResourceDefinition, found %s %q", crd.Kind, crd.Name)
		}
		crds = append(crds, crd)
	}
}

// ModuleProxy downloads each module (as ModuleDir does, so the go
// command checks it against the checksum database) and returns the go
// command's download cache as a file:// module proxy URL, for code that
// fetches module zips from a proxy (platform/upstream) to read offline.
func ModuleProxy(ctx context.Context, mods ...module.Version) (string, error) {
	for _, m := range mods {
		if _, err := ModuleDir(ctx, m.Path, m.Version); err != nil {
			return "", err
		}
	}
	out, err := exec.CommandContext(ctx, "go", "env", "GOMODCACHE").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMODCACHE: %w", err)
	}
	return "file://" + filepath.Join(strings.TrimSpace(string(out)), "cache", "download"), nil
}
