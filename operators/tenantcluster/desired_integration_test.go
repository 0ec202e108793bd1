//go:build integration

package tenantcluster

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"cozy.dev/cozy/internal/testing/testenv"
)

// TestServerAcceptsChildren creates every child and add-on against a
// real kube-apiserver with the Cluster API, CAPK, Kamaji and Flux CRDs
// from their modules, with strict field validation: a field the providers do not
// know is an error, not a silent drop.
func TestServerAcceptsChildren(t *testing.T) {
	env := testenv.Start(t, testenv.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	tc := fixture(t)
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tc.Namespace}}); err != nil {
		t.Fatal(err)
	}
	c, err := Desired(tc, tc.Spec.Version, testImages)
	if err != nil {
		t.Fatal(err)
	}
	addons, err := DesiredAddons(tc, DefaultAddonConfig(), "api.acme.example.com", 443)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range append(c.All(), addons...) {
		u = u.DeepCopy()
		// The owner does not exist in this API server; the garbage
		// collector is not running either.
		u.SetOwnerReferences(nil)
		err := env.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(u),
			client.FieldOwner("cozy-operator"), client.ForceOwnership)
		if err != nil {
			t.Errorf("%s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}
	// The check above can fail: a misspelt field is refused.
	bad := c.Groups[0].MachineDeployment.DeepCopy()
	bad.SetOwnerReferences(nil)
	bad.Object["spec"].(map[string]any)["replica"] = int64(1)
	if err := env.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(bad), client.FieldOwner("cozy-operator"), client.ForceOwnership); err == nil {
		t.Error("a MachineDeployment with spec.replica (no s) was accepted")
	}
}
