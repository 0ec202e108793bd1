package testenv

import (
	"context"
	"os"

	"cozy.dev/cozy/platform/flux"
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

// FluxInstallManifests writes to file the install manifests
// flux.ModuleManifests builds from the controllers' modules, which stand
// in for a release's install.yaml in tests of the air-gapped path.
func FluxInstallManifests(ctx context.Context, file string) error {
	var cs []flux.ModuleController
	for _, c := range FluxControllers() {
		dir, err := ModuleDir(ctx, "github.com/fluxcd/"+c.Name, c.Version)
		if err != nil {
			return err
		}
		cs = append(cs, flux.ModuleController{Name: c.Name, Version: c.Version, Dir: dir})
	}
	out, err := flux.ModuleManifests(cs)
	if err != nil {
		return err
	}
	return os.WriteFile(file, out, 0o644)
}
