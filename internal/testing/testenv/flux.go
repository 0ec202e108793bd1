package testenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// FluxController is one Flux controller whose install manifests
// FluxInstallManifests builds from its module.
type FluxController struct{ Name, Version string }

// FluxControllers are the controllers hack/flux-controllers.sh builds, at
// the versions whose CRDs UpstreamCRDs loads.
func FluxControllers() []FluxController {
	return []FluxController{
		{"source-controller", "v1.9.6"},
		{"kustomize-controller", "v1.9.6"},
		{"helm-controller", "v1.6.4"},
	}
}

// FluxInstallManifests writes to file an install.yaml like a Flux
// release's: the flux-system namespace and, for each controller, its CRDs,
// RBAC, Deployment and Service, kustomized from the controller module's
// own config/ (the sources the release is built from) into flux-system
// with the release's image names. The release file itself cannot be
// downloaded here; this stands in for it in tests of the air-gapped path.
func FluxInstallManifests(ctx context.Context, file string) error {
	work, err := os.MkdirTemp("", "flux-install-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)

	var resources, images []string
	for _, c := range FluxControllers() {
		dir, err := ModuleDir(ctx, "github.com/fluxcd/"+c.Name, c.Version)
		if err != nil {
			return err
		}
		for _, sub := range []string{"crd", "rbac", "manager"} {
			// kustomize takes only relative paths to other roots.
			rel, err := filepath.Rel(work, filepath.Join(dir, "config", sub))
			if err != nil {
				return err
			}
			resources = append(resources, rel)
		}
		images = append(images, fmt.Sprintf("- name: fluxcd/%s\n  newName: ghcr.io/fluxcd/%s\n  newTag: %s", c.Name, c.Name, c.Version))
	}
	ns := "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: flux-system\n  labels:\n    app.kubernetes.io/instance: flux-system\n    app.kubernetes.io/part-of: flux\n"
	if err := os.WriteFile(filepath.Join(work, "namespace.yaml"), []byte(ns), 0o644); err != nil {
		return err
	}
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: flux-system\nresources:\n- namespace.yaml\n- " +
		strings.Join(resources, "\n- ") + "\nimages:\n" + strings.Join(images, "\n") + "\n"
	if err := os.WriteFile(filepath.Join(work, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		return err
	}
	opts := krusty.MakeDefaultOptions()
	opts.LoadRestrictions = types.LoadRestrictionsNone // the module cache is outside work
	m, err := krusty.MakeKustomizer(opts).Run(filesys.MakeFsOnDisk(), work)
	if err != nil {
		return fmt.Errorf("kustomize Flux's config/: %w", err)
	}
	out, err := m.AsYaml()
	if err != nil {
		return err
	}
	return os.WriteFile(file, out, 0o644)
}
