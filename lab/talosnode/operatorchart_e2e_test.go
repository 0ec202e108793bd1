//go:build integration && (e2e || bench)

package talosnode_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"cozy.dev/cozy/charts"
	"cozy.dev/cozy/images"
	"cozy.dev/cozy/internal/testing/poll"
	"cozy.dev/cozy/internal/testing/prereq"
	"cozy.dev/cozy/platform/render"
)

// operatorNamespace is where the platform installs cozy-operator.
const operatorNamespace = "cozy-system"

// deployOperator runs cozy-operator as the platform deploys it, as a pod:
//   - its image is the one `make image` builds (COZY_OPERATOR_IMAGE),
//     pushed to the rack's mirror from that archive as `cozyctl images
//     mirror --from` pushes it, under the name its chart renders, which
//     the nodes pull through the mirror;
//   - its chart is rendered with the values the platform's cozy-operator
//     HelmRelease gives it for this rack (`platform render`: the workers'
//     images and mirror from the rack's registries.mirror, no
//     load-balancer pool) and applied as helm-controller applies a
//     release. That is the one stand-in: Flux cannot install the
//     component here, as it depends on cert-manager and the Cluster API
//     operator, which do not run here.
//
// So the chart's RBAC, arguments, probes and security context, and the
// image's user and entrypoint, are what run. It returns once the
// manager's pod is ready; at the test's end the manager must not have
// restarted, and its log is logged if the test failed.
func deployOperator(ctx context.Context, t *testing.T, c *procCluster, mgmt client.Client) {
	t.Helper()
	archive := os.Getenv("COZY_OPERATOR_IMAGE")
	if archive == "" {
		prereq.Missing(t, "COZY_OPERATOR_IMAGE is not set: run make e2e, or make image and export COZY_OPERATOR_IMAGE=$PWD/bin/cozy-operator-image.tar")
	}
	objs := operatorRelease(t, c)

	// The image the chart's Deployment names, from the archive.
	var ref string
	for _, o := range objs {
		if o.GetKind() == "Deployment" {
			for _, ct := range render.Containers(o.Object) {
				ref = ct.Image
			}
		}
	}
	if ref == "" {
		t.Fatal("cozy-operator's chart renders no Deployment with a container")
	}
	// As `cozyctl images mirror --from bin/cozy-operator-image.tar` pushes
	// it: the archive must name the image as the chart renders it.
	src, err := images.OpenArchive(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if _, err := images.Mirror(ctx, images.MirrorOptions{
		Registry: mirrorAddr, Insecure: true, Source: src, Refs: []string{ref},
		Transport: &http.Transport{DialContext: c.sw.DialContext},
	}); err != nil {
		t.Fatalf("mirror %s: %v", ref, err)
	}

	// The release, as helm-controller applies it into the component's
	// namespace (the platform renders that Namespace beside it).
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: operatorNamespace}}
	if err := mgmt.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		namespaced, err := mgmt.IsObjectNamespaced(o)
		if err != nil {
			t.Fatalf("cozy-operator's %s %s: %v", o.GetKind(), o.GetName(), err)
		}
		if namespaced && o.GetNamespace() == "" {
			o.SetNamespace(operatorNamespace) // as Helm places it
		}
		if err := mgmt.Apply(ctx, client.ApplyConfigurationFromUnstructured(o), client.FieldOwner("helm-controller"), client.ForceOwnership); err != nil {
			t.Fatalf("cozy-operator's %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
	t.Cleanup(func() {
		// A manager that crashed and came back would still look ready.
		if out, err := c.kubectl("-n", operatorNamespace, "get", "pods", "-o", "jsonpath={.items[*].status.containerStatuses[*].restartCount}"); err != nil || strings.Trim(out, "0 ") != "" {
			t.Errorf("cozy-operator's restarts: %q %v, want none", out, err)
		}
		if t.Failed() {
			for _, args := range [][]string{{"-n", operatorNamespace, "get", "pods", "-o", "wide"},
				{"-n", operatorNamespace, "logs", "deploy/cozy-operator", "--tail=60"}} {
				out, err := c.kubectl(args...)
				t.Logf("kubectl %s:\n%s%v", strings.Join(args, " "), out, err)
			}
		}
	})
	start := time.Now()
	poll.Within(t, 5*time.Minute, time.Second, "cozy-operator's Deployment available", func() error {
		var d appsv1.Deployment
		if err := mgmt.Get(ctx, client.ObjectKey{Namespace: operatorNamespace, Name: "cozy-operator"}, &d); err != nil {
			return err
		}
		if d.Status.AvailableReplicas < 1 || d.Status.UpdatedReplicas < 1 {
			return fmt.Errorf("%d available, %d updated", d.Status.AvailableReplicas, d.Status.UpdatedReplicas)
		}
		return nil
	})
	out, err := c.kubectl("-n", operatorNamespace, "get", "pods", "-o",
		`jsonpath={range .items[*]}{.spec.nodeName} {.status.containerStatuses[0].image} {.status.containerStatuses[0].restartCount}{"\n"}{end}`)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cozy-operator's pod ready %s after its release was applied: %s", time.Since(start).Round(time.Second), strings.TrimSpace(out))
}

// operatorRelease renders the platform for the cluster's rack and, from
// its cozy-operator HelmRelease, the operator's chart with the values
// that release gives it, for the cluster's Kubernetes version.
func operatorRelease(t *testing.T, c *procCluster) []*unstructured.Unstructured {
	t.Helper()
	platform, err := render.Render(c.rack)
	if err != nil {
		t.Fatal(err)
	}
	rendered, err := platform.Objects()
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(rendered, func(o render.Object) bool {
		return o.GetKind() == "HelmRelease" && o.GetName() == charts.CozyOperator
	})
	if i < 0 {
		t.Fatal("the platform renders no cozy-operator HelmRelease")
	}
	release, namespace, values, err := render.ReleaseInputs(rendered[i].Unstructured)
	if err != nil {
		t.Fatal(err)
	}
	if namespace != operatorNamespace {
		t.Fatalf("the platform installs cozy-operator into %q, want %q", namespace, operatorNamespace)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(restConfig(t, c))
	if err != nil {
		t.Fatal(err)
	}
	server, err := dc.ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	chart, err := render.LoadChart(charts.CozyOperator)
	if err != nil {
		t.Fatal(err)
	}
	files, err := render.Chart(chart, values, release, namespace, server.GitVersion)
	if err != nil {
		t.Fatalf("cozy-operator's chart with the platform's values: %v", err)
	}
	objs, err := render.DecodeChart(files)
	if err != nil {
		t.Fatalf("cozy-operator's chart: %v", err)
	}
	return objs
}
