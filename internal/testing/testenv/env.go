package testenv

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"cozy.dev/cozy/internal/testing/prereq"
)

// Env is a running kube-apiserver + etcd with CRDs installed.
type Env struct {
	Config *rest.Config
	// Client talks to the API server; it handles the built-in types and
	// unstructured objects of any kind.
	Client client.Client
	// CRDs are the definitions that were installed and are established.
	CRDs []*apiextensionsv1.CustomResourceDefinition
}

// Options change what Start installs.
type Options struct {
	// CRDs to install; nil means UpstreamCRDs(), an empty slice none.
	CRDs []CRDSource
	// CRDFiles are YAML files of this repository's own CRDs to install
	// as well (e.g. charts/cozy-operator/crds/*.yaml).
	CRDFiles []string
	// Scheme for the client; nil means client-go's built-in types.
	Scheme *runtime.Scheme
}

// AssetsDir returns the directory holding kube-apiserver and etcd, from
// KUBEBUILDER_ASSETS. When it is unset or incomplete the test fails under
// CI=true and skips elsewhere.
func AssetsDir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		prereq.Missing(t, "KUBEBUILDER_ASSETS is not set; run `make test`, or export KUBEBUILDER_ASSETS=$(hack/envtest-assets.sh)")
	}
	for _, bin := range []string{"kube-apiserver", "etcd"} {
		if fi, err := os.Stat(filepath.Join(dir, bin)); err != nil || fi.Mode()&0o111 == 0 {
			prereq.Missing(t, "KUBEBUILDER_ASSETS=%s has no executable %s; rebuild with hack/envtest-assets.sh", dir, bin)
		}
	}
	return dir
}

// BuiltDir returns the directory a hack script built, from the
// environment variable make sets to it (COZY_NODE_ASSETS from
// hack/node-assets.sh, …), checking it holds files. When it is unset or
// incomplete the test fails under CI=true and skips elsewhere.
func BuiltDir(t testing.TB, env, script string, files ...string) string {
	t.Helper()
	dir := os.Getenv(env)
	if dir == "" {
		prereq.Missing(t, "%s is not set: run make test, or export %s=$(%s)", env, env, script)
	}
	for _, f := range files {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			prereq.Missing(t, "%s=%s has no %s: rebuild with %s", env, dir, f, script)
		}
	}
	return dir
}

// WriteKubeconfig writes an admin kubeconfig for the API server into the
// test's temporary directory, for programs and CLI commands under test.
func (e *Env) WriteKubeconfig(t testing.TB) string {
	t.Helper()
	rc := e.Config
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["envtest"] = &clientcmdapi.Cluster{Server: rc.Host, CertificateAuthorityData: rc.CAData}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: rc.CertData, ClientKeyData: rc.KeyData, Token: rc.BearerToken}
	cfg.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "admin"}
	cfg.CurrentContext = "envtest"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// Start runs an API server for the test and stops it when the test ends.
func Start(t testing.TB, opts Options) *Env {
	t.Helper()
	assets := AssetsDir(t)

	sources := opts.CRDs
	if sources == nil {
		sources = UpstreamCRDs()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	crds, err := LoadCRDs(ctx, sources)
	if err != nil {
		t.Fatalf("load upstream CRDs: %v", err)
	}
	for _, f := range opts.CRDFiles {
		r, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		own, err := decodeCRDs(r)
		r.Close()
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		crds = append(crds, own...)
	}

	scheme := opts.Scheme
	if scheme == nil {
		scheme = clientgoscheme.Scheme
	}
	te := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDs:                  crds,
		Scheme:                scheme,
		// A busy 2-core CI machine can be slow to start etcd.
		ControlPlaneStartTimeout: 2 * time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
	}
	cfg, err := te.Start()
	if err != nil {
		t.Fatalf("start kube-apiserver and etcd from %s: %v", assets, err)
	}
	t.Cleanup(func() {
		if err := te.Stop(); err != nil {
			t.Errorf("stop envtest: %v", err)
		}
	})

	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatalf("client for envtest: %v", err)
	}
	return &Env{Config: cfg, Client: c, CRDs: crds}
}
