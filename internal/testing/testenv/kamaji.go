package testenv

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// KamajiVersion is the Kamaji hack/kamaji.sh builds: the only one the
// module proxy serves (docs/images.md).
const KamajiVersion = "v1.0.0"

// KamajiImage is the image hack/kamaji.sh packs Kamaji's manager into.
const KamajiImage = "docker.io/clastix/kamaji:" + KamajiVersion

// KamajiCRDs is where Kamaji keeps its CRDs (DataStore,
// TenantControlPlane), without the conversion-webhook patch: v1alpha1 is
// their only version.
var KamajiCRDs = CRDSource{Module: "github.com/clastix/kamaji", Version: KamajiVersion, Dir: "config/crd"}

// Kamaji returns the directory hack/kamaji.sh built (COZY_KAMAJI): the
// DataStore's etcd (etcd) and the images Kamaji, its tenant control
// planes and the Cluster API managers that drive it run (images/, an OCI
// layout).
func Kamaji(t testing.TB) string {
	return BuiltDir(t, "COZY_KAMAJI", "hack/kamaji.sh", "etcd", "images/index.json")
}

// KamajiWebhooks returns Kamaji's admission webhook configurations, read
// from its module, pointed at the Service namespace/service (port 443)
// in front of its manager and trusting caPEM, where its chart would use
// cert-manager's CA.
func KamajiWebhooks(ctx context.Context, namespace, service string, caPEM []byte) ([]client.Object, error) {
	return moduleWebhooks(ctx, KamajiCRDs.Module, KamajiCRDs.Version, "config/webhook/manifests.yaml", "kamaji-", func(path string) map[string]any {
		return map[string]any{
			"service":  map[string]any{"namespace": namespace, "name": service, "path": path, "port": int64(443)},
			"caBundle": base64.StdEncoding.EncodeToString(caPEM),
		}
	})
}

// KamajiClusterRole returns the ClusterRole Kamaji's manager needs, read
// from its module (config/rbac/role.yaml, which controller-gen makes
// from its RBAC markers), named name.
func KamajiClusterRole(ctx context.Context, name string) (*rbacv1.ClusterRole, error) {
	return ModuleClusterRole(ctx, KamajiCRDs.Module, KamajiCRDs.Version, name, "config/rbac/role.yaml")
}

// ModuleClusterRole returns one ClusterRole named name holding the rules
// of the ClusterRoles in files (slash-separated, each one ClusterRole, as
// controller-gen writes config/rbac/role.yaml) of module@version: what a
// manager's release binds its ServiceAccount to.
func ModuleClusterRole(ctx context.Context, module, version, name string, files ...string) (*rbacv1.ClusterRole, error) {
	dir, err := ModuleDir(ctx, module, version)
	if err != nil {
		return nil, err
	}
	out := &rbacv1.ClusterRole{TypeMeta: metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole"}, ObjectMeta: metav1.ObjectMeta{Name: name}}
	for _, f := range files {
		file := filepath.Join(dir, filepath.FromSlash(f))
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, err
		}
		var role rbacv1.ClusterRole
		if err := yaml.UnmarshalStrict(data, &role); err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		if role.Kind != "ClusterRole" || len(role.Rules) == 0 {
			return nil, fmt.Errorf("%s: a %s with %d rules, want a ClusterRole", file, role.Kind, len(role.Rules))
		}
		out.Rules = append(out.Rules, role.Rules...)
	}
	return out, nil
}

// KamajiWebhookPort is where Kamaji's manager serves its webhooks (fixed
// in its code).
const KamajiWebhookPort = 9443
