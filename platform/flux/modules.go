package flux

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// ModuleController is one Flux controller and its Go module's directory
// (as `go mod download` extracts it).
type ModuleController struct{ Name, Version, Dir string }

// ModuleManifests builds install manifests like a Flux release's
// install.yaml from the controllers' modules, for a site that cannot
// download the release: the flux-system namespace and, for each
// controller, its CRDs, RBAC, Deployment and Service, kustomized from the
// module's own config/ (the sources the release is built from) into
// flux-system with the release's image names (ghcr.io/fluxcd/NAME:VERSION).
func ModuleManifests(controllers []ModuleController) ([]byte, error) {
	work, err := os.MkdirTemp("", "flux-install-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)

	var resources, images []string
	for _, c := range controllers {
		for _, sub := range []string{"crd", "rbac", "manager"} {
			// kustomize takes only relative paths to other roots.
			rel, err := filepath.Rel(work, filepath.Join(c.Dir, "config", sub))
			if err != nil {
				return nil, err
			}
			resources = append(resources, rel)
		}
		images = append(images, fmt.Sprintf("- name: fluxcd/%s\n  newName: ghcr.io/fluxcd/%s\n  newTag: %s", c.Name, c.Name, c.Version))
	}
	ns := "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: " + Namespace + "\n  labels:\n    app.kubernetes.io/instance: flux-system\n    app.kubernetes.io/part-of: flux\n"
	if err := os.WriteFile(filepath.Join(work, "namespace.yaml"), []byte(ns), 0o644); err != nil {
		return nil, err
	}
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: " + Namespace + "\nresources:\n- namespace.yaml\n- " +
		strings.Join(resources, "\n- ") + "\nimages:\n" + strings.Join(images, "\n") + "\n"
	if err := os.WriteFile(filepath.Join(work, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		return nil, err
	}
	opts := krusty.MakeDefaultOptions()
	opts.LoadRestrictions = types.LoadRestrictionsNone // the module cache is outside work
	m, err := krusty.MakeKustomizer(opts).Run(filesys.MakeFsOnDisk(), work)
	if err != nil {
		return nil, fmt.Errorf("kustomize Flux's config/: %w", err)
	}
	return m.AsYaml()
}
