// Package platform installs the Flux-reconciled platform layer on a
// cluster: Flux itself, then a GitRepository and a root Kustomization for
// the cluster's folder of the platform repository (the layout
// platform/render writes). `cozyctl platform install` and `cozyctl
// bootstrap` both call Install; platform/status follows what Flux then
// reconciles.
package platform

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/platform/flux"
	"cozy.dev/cozy/platform/status"
)

// InstallOptions say what to install and how long to wait for it.
type InstallOptions struct {
	Git flux.Git
	// Manifests are Flux's install manifests (see flux.Load): "" for the
	// pinned release's.
	Manifests string
	// ClusterDomain is the cluster's DNS domain (rack cluster.dnsDomain),
	// which Flux's controllers address each other in; "" is cluster.local.
	ClusterDomain string
	// Wait is how long to wait for Flux to apply the cluster's folder;
	// 0 does not wait.
	Wait time.Duration
	Log  *slog.Logger // progress; default: discard
}

// Install loads Flux's manifests, server-side applies them and the sync
// objects, and waits for the root Kustomization. Running it again
// updates in place.
func Install(ctx context.Context, cfg *rest.Config, opts InstallOptions) error {
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	objs, err := flux.Load(ctx, opts.Manifests)
	if err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return fmt.Errorf("connect to %s: %w", cfg.Host, err)
	}
	return flux.Install(ctx, c, flux.Options{
		Manifests:     objs,
		Git:           opts.Git,
		ClusterDomain: opts.ClusterDomain,
		Wait:          opts.Wait,
		Progress:      func(msg string) { log.Info(msg) },
		Ready: func(ctx context.Context) (bool, string, error) {
			return status.RootReady(ctx, c, flux.Namespace, flux.SyncName)
		},
	})
}

// GitFromRack is the rack's platform.git (its defaults applied when the
// rack was loaded).
func GitFromRack(r *rack.Rack) flux.Git {
	return flux.Git{URL: r.Platform.Git.URL, Branch: r.Platform.Git.Branch, Path: r.Platform.Git.Path}
}
