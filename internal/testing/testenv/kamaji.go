package testenv

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"cozy.dev/cozy/internal/testing/netnstest"
)

// KamajiVersion is the Kamaji hack/kamaji.sh builds: the only one the
// module proxy serves (docs/images.md).
const KamajiVersion = "v1.0.0"

// KamajiCRDs is where Kamaji keeps its CRDs (DataStore,
// TenantControlPlane), without the conversion-webhook patch: v1alpha1 is
// their only version.
var KamajiCRDs = CRDSource{Module: "github.com/clastix/kamaji", Version: KamajiVersion, Dir: "config/crd"}

// Kamaji returns the directory hack/kamaji.sh built (COZY_KAMAJI): the
// manager (kamaji), the DataStore's etcd (etcd) and the images Kamaji
// and its tenant control planes run (images/, an OCI layout).
func Kamaji(t testing.TB) string {
	return BuiltDir(t, "COZY_KAMAJI", "hack/kamaji.sh", "kamaji", "etcd", "images/index.json")
}

// KamajiWebhooks returns Kamaji's admission webhook configurations, read
// from its module, pointed at a manager's webhook server at baseURL
// (https://HOST:9443) and trusting caPEM, where a cluster would use the
// webhook Service and cert-manager's CA.
func KamajiWebhooks(ctx context.Context, baseURL string, caPEM []byte) ([]client.Object, error) {
	return moduleWebhooks(ctx, KamajiCRDs.Module, KamajiCRDs.Version, "config/webhook/manifests.yaml", "kamaji-", baseURL, caPEM)
}

// KamajiWebhookPort is where Kamaji serves its webhooks (fixed in its
// manager).
const KamajiWebhookPort = 9443

// StartKamaji runs Kamaji's manager from dir (Kamaji's) in ns until the
// test ends, against the API server of kubeconfig, with datastore as
// its default DataStore (which must exist: Kamaji checks before it
// starts), its webhook server on KamajiWebhookPort with certDir's
// certificate (WebhookCertDir's), telemetry, metrics, health probes and
// leader election off. If it exits before, exited is called with why.
func StartKamaji(t testing.TB, ns *netnstest.NS, dir, kubeconfig, certDir, datastore string, exited context.CancelCauseFunc) {
	t.Helper()
	// controller-runtime's webhook server reads its certificate from
	// $TMPDIR/k8s-webhook-server/serving-certs, which Kamaji gives no
	// flag for.
	tmp := t.TempDir()
	serving := filepath.Join(tmp, "k8s-webhook-server", "serving-certs")
	if err := os.MkdirAll(filepath.Dir(serving), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(certDir, serving); err != nil {
		t.Fatal(err)
	}
	StartProcess(t, ns, filepath.Join(dir, "kamaji"), []string{"manager",
		"--datastore=" + datastore,
		"--disable-telemetry",
		"--metrics-bind-address=0",
		"--health-probe-bind-address=0",
		"--leader-elect=false",
		"--tmp-directory=" + filepath.Join(tmp, "kamaji"),
		"--webhook-ca-path=" + filepath.Join(certDir, "ca.crt"),
		"--pod-namespace=kamaji-system",
		"--serviceaccount-name=kamaji",
		"--migrate-image=docker.io/clastix/kamaji:" + KamajiVersion,
	}, []string{"KUBECONFIG=" + kubeconfig, "TMPDIR=" + tmp}, exited)
}
