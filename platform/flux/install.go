package flux

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"path"
	"regexp"
	"slices"
	"strings"
	"time"

	kustomizev1 "github.com/fluxcd/kustomize-controller/api/v1"
	meta "github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Names of what Install creates, the ones `flux bootstrap` uses: the
// rendered platform refers to this GitRepository.
const (
	Namespace  = "flux-system"
	SyncName   = "flux-system"
	FieldOwner = "cozyctl"
)

// Git says which folder of which repository Flux reconciles.
type Git struct {
	// URL of the repository: https://, http:// or ssh:// (what
	// source-controller clones).
	URL string
	// Branch to follow (default main).
	Branch string
	// Path of the cluster's folder in the repository, e.g. clusters/lab.
	Path string
	// SecretRef names a Secret in flux-system with the credentials
	// source-controller uses (username/password, or identity/known_hosts
	// for SSH); empty for a public repository.
	SecretRef string
	// Interval is how often Flux checks the repository (default 1m).
	Interval time.Duration
}

// Options of one Install.
type Options struct {
	// Manifests are Flux's install manifests (Load).
	Manifests []*unstructured.Unstructured
	Git       Git
	// Wait bounds how long Install waits for Flux to reconcile the
	// cluster's folder (its root Kustomization Ready); 0 returns once
	// everything is applied.
	Wait time.Duration
	// ClusterDomain is the cluster's DNS domain (the rack's
	// cluster.dnsDomain); the controllers' in-cluster addresses are
	// rewritten from the manifests' cluster.local to it, as `flux install
	// --cluster-domain` does. Empty keeps cluster.local.
	ClusterDomain string
	// Poll is how often waits look again (default 2s).
	Poll time.Duration
	// Progress, if set, hears each step.
	Progress func(msg string)
	// Ready reports whether the root Kustomization and its source are
	// ready and, if not, why. Install's caller passes the platform's
	// status check; nil skips the wait.
	Ready func(ctx context.Context) (bool, string, error)
}

// Install applies Flux's manifests and the sync objects with server-side
// apply under FieldOwner, so running it again (a newer Flux, another
// branch) updates in place. CRDs go first and must be established before
// anything that needs them.
func Install(ctx context.Context, c client.Client, opts Options) error {
	if err := opts.Git.validate(); err != nil {
		return err
	}
	if err := checkFlux(opts.Manifests); err != nil {
		return err
	}
	if opts.Poll == 0 {
		opts.Poll = 2 * time.Second
	}
	progress := opts.Progress
	if progress == nil {
		progress = func(string) {}
	}

	manifests, err := withClusterDomain(opts.Manifests, opts.ClusterDomain)
	if err != nil {
		return err
	}
	crds, namespaces, rest := split(manifests)
	progress(fmt.Sprintf("applying %d Flux CRDs", len(crds)))
	if err := apply(ctx, c, crds); err != nil {
		return err
	}
	if err := waitEstablished(ctx, c, crds, opts.Poll); err != nil {
		return err
	}
	progress(fmt.Sprintf("applying %d Flux objects", len(namespaces)+len(rest)))
	if err := apply(ctx, c, namespaces); err != nil {
		return err
	}
	if err := apply(ctx, c, rest); err != nil {
		return err
	}

	sync, err := SyncObjects(opts.Git)
	if err != nil {
		return err
	}
	progress(fmt.Sprintf("pointing Flux at %s (branch %s, path %s)", opts.Git.URL, opts.Git.branch(), opts.Git.Path))
	if err := apply(ctx, c, sync); err != nil {
		return err
	}
	if opts.Wait <= 0 || opts.Ready == nil {
		return nil
	}
	progress(fmt.Sprintf("waiting up to %s for Flux to reconcile %s", opts.Wait, opts.Git.Path))
	wctx, cancel := context.WithTimeout(ctx, opts.Wait)
	defer cancel()
	why := "Flux has not reported yet"
	for {
		ok, reason, err := opts.Ready(wctx)
		switch {
		case err != nil && wctx.Err() == nil:
			why = err.Error()
		case ok:
			return nil
		case reason != "":
			why = reason
		}
		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("waited %[2]s for Flux to reconcile %[1]s: %[3]s (are the Flux controllers running? kubectl -n %[4]s get deployments)", opts.Git.Path, opts.Wait, why, Namespace)
		case <-time.After(opts.Poll):
		}
	}
}

// defaultDomain is the cluster domain Flux's release manifests name.
const defaultDomain = "cluster.local"

var dnsName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$`)

// withClusterDomain returns copies of the manifests whose Deployments'
// container arguments name domain instead of cluster.local in service
// addresses (source-controller's --storage-adv-addr, which the other
// controllers fetch artifacts from; --events-addr): what `flux install
// --cluster-domain` templates. Without it, on a cluster whose domain is
// not cluster.local, kustomize- and helm-controller never get an artifact.
func withClusterDomain(objs []*unstructured.Unstructured, domain string) ([]*unstructured.Unstructured, error) {
	if domain == "" || domain == defaultDomain {
		return objs, nil
	}
	if !dnsName.MatchString(domain) {
		return nil, fmt.Errorf("cluster domain %q is not a DNS name", domain)
	}
	out := make([]*unstructured.Unstructured, 0, len(objs))
	for _, u := range objs {
		if u.GetKind() != "Deployment" {
			out = append(out, u)
			continue
		}
		u = u.DeepCopy()
		containers, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "containers")
		for _, ct := range containers {
			m, _ := ct.(map[string]any)
			args, _ := m["args"].([]any)
			for i, a := range args {
				if s, ok := a.(string); ok {
					args[i] = strings.ReplaceAll(s, ".svc."+defaultDomain, ".svc."+domain)
				}
			}
		}
		if err := unstructured.SetNestedSlice(u.Object, containers, "spec", "template", "spec", "containers"); err != nil {
			return nil, fmt.Errorf("deployment %s: %w", objectName(u), err)
		}
		out = append(out, u)
	}
	return out, nil
}

// split orders the manifests: CRDs, then namespaces, then the rest.
func split(objs []*unstructured.Unstructured) (crds, namespaces, rest []*unstructured.Unstructured) {
	for _, u := range objs {
		switch {
		case u.GetKind() == "CustomResourceDefinition":
			crds = append(crds, u)
		case u.GetKind() == "Namespace" && u.GetAPIVersion() == "v1":
			namespaces = append(namespaces, u)
		default:
			rest = append(rest, u)
		}
	}
	return crds, namespaces, rest
}

func apply(ctx context.Context, c client.Client, objs []*unstructured.Unstructured) error {
	for _, u := range objs {
		ac := client.ApplyConfigurationFromUnstructured(u.DeepCopy())
		if err := c.Apply(ctx, ac, client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
			return fmt.Errorf("apply %s %s: %w", u.GetKind(), objectName(u), err)
		}
	}
	return nil
}

func objectName(u *unstructured.Unstructured) string {
	if ns := u.GetNamespace(); ns != "" {
		return ns + "/" + u.GetName()
	}
	return u.GetName()
}

func waitEstablished(ctx context.Context, c client.Client, crds []*unstructured.Unstructured, poll time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for _, u := range crds {
		for {
			var crd apiextensionsv1.CustomResourceDefinition
			err := c.Get(ctx, client.ObjectKey{Name: u.GetName()}, &crd)
			if err == nil && established(&crd) {
				break
			}
			select {
			case <-ctx.Done():
				if err == nil {
					err = errors.New("not established")
				}
				return fmt.Errorf("CRD %s: %w", u.GetName(), err)
			case <-time.After(poll):
			}
		}
	}
	return nil
}

func established(crd *apiextensionsv1.CustomResourceDefinition) bool {
	return slices.ContainsFunc(crd.Status.Conditions, func(c apiextensionsv1.CustomResourceDefinitionCondition) bool {
		return c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue
	})
}

func (g Git) branch() string {
	if g.Branch == "" {
		return "main"
	}
	return g.Branch
}

// fluxPath is the folder as Flux wants it: relative, starting with ./.
func (g Git) fluxPath() string { return "./" + path.Clean(strings.TrimPrefix(g.Path, "./")) }

func (g Git) validate() error {
	u, err := url.Parse(g.URL)
	switch {
	case g.URL == "":
		return errors.New("no Git URL: say where the platform repository is (--git-url, or platform.git.url in the rack)")
	case !strings.Contains(g.URL, "://"):
		return fmt.Errorf("Git URL %q: Flux clones https://, http:// and ssh:// URLs (write git@host:repo as ssh://git@host/repo)", g.URL)
	case err != nil:
		return fmt.Errorf("Git URL %q: %w", g.URL, err)
	case u.Scheme != "https" && u.Scheme != "http" && u.Scheme != "ssh":
		return fmt.Errorf("Git URL %q: Flux clones https://, http:// and ssh:// URLs (write git@host:repo as ssh://git@host/repo)", g.URL)
	case u.Host == "":
		return fmt.Errorf("Git URL %q has no host", g.URL)
	}
	p := strings.TrimPrefix(g.Path, "./")
	if p == "" || path.IsAbs(p) || path.Clean(p) == "." || strings.HasPrefix(path.Clean(p), "..") {
		return fmt.Errorf("Git path %q: want the cluster's folder relative to the repository root, e.g. clusters/lab", g.Path)
	}
	if strings.ContainsAny(g.branch(), " ~^:?*[\\") {
		return fmt.Errorf("Git branch %q is not a valid branch name", g.Branch)
	}
	return nil
}

// SyncObjects are the GitRepository and the root Kustomization that make
// Flux reconcile the cluster's folder.
func SyncObjects(g Git) ([]*unstructured.Unstructured, error) {
	if err := g.validate(); err != nil {
		return nil, err
	}
	interval := g.Interval
	if interval == 0 {
		interval = time.Minute
	}
	labels := map[string]string{"app.kubernetes.io/managed-by": FieldOwner}
	repo := &sourcev1.GitRepository{
		TypeMeta:   metav1.TypeMeta{APIVersion: sourcev1.GroupVersion.String(), Kind: sourcev1.GitRepositoryKind},
		ObjectMeta: metav1.ObjectMeta{Name: SyncName, Namespace: Namespace, Labels: labels},
		Spec: sourcev1.GitRepositorySpec{
			URL:       g.URL,
			Reference: &sourcev1.GitRepositoryRef{Branch: g.branch()},
			Interval:  metav1.Duration{Duration: interval},
		},
	}
	if g.SecretRef != "" {
		repo.Spec.SecretRef = &meta.LocalObjectReference{Name: g.SecretRef}
	}
	// The root only applies the folder's platform.yaml, the components'
	// own Kustomizations; they wait for their objects, so the root does
	// not (a wait here would hold it on the slowest component).
	root := &kustomizev1.Kustomization{
		TypeMeta:   metav1.TypeMeta{APIVersion: kustomizev1.GroupVersion.String(), Kind: kustomizev1.KustomizationKind},
		ObjectMeta: metav1.ObjectMeta{Name: SyncName, Namespace: Namespace, Labels: labels},
		Spec: kustomizev1.KustomizationSpec{
			Interval: metav1.Duration{Duration: 10 * time.Minute},
			Path:     g.fluxPath(),
			Prune:    true,
			SourceRef: kustomizev1.CrossNamespaceSourceReference{
				Kind: sourcev1.GitRepositoryKind,
				Name: SyncName,
			},
		},
	}
	var out []*unstructured.Unstructured
	for _, o := range []runtime.Object{repo, root} {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
		if err != nil {
			return nil, err
		}
		delete(m, "status")
		unstructured.RemoveNestedField(m, "metadata", "creationTimestamp")
		out = append(out, &unstructured.Unstructured{Object: m})
	}
	return out, nil
}
