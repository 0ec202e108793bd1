package testenv

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"cozy.dev/cozy/internal/testing/netnstest"
	"cozy.dev/cozy/internal/testing/poll"
	"cozy.dev/cozy/internal/testing/prereq"
)

// CAPIManager returns the Cluster API core manager that
// hack/capi-controllers.sh built, from COZY_CAPI_BIN. When it is unset or
// holds no manager the test fails under CI=true and skips elsewhere.
func CAPIManager(t testing.TB) string { return capiBinary(t, "cluster-api-manager") }

// KubeadmBootstrapManager returns the Cluster API kubeadm bootstrap
// provider's manager that hack/capi-controllers.sh built, as CAPIManager.
func KubeadmBootstrapManager(t testing.TB) string { return capiBinary(t, "kubeadm-bootstrap-manager") }

func capiBinary(t testing.TB, name string) string {
	t.Helper()
	dir := os.Getenv("COZY_CAPI_BIN")
	if dir == "" {
		prereq.Missing(t, "COZY_CAPI_BIN is not set; run `make test`, or export COZY_CAPI_BIN=$(hack/capi-controllers.sh)")
	}
	bin := filepath.Join(dir, name)
	if fi, err := os.Stat(bin); err != nil || fi.Mode()&0o111 == 0 {
		prereq.Missing(t, "COZY_CAPI_BIN=%s has no executable %s; rebuild with hack/capi-controllers.sh", dir, name)
	}
	return bin
}

// WebhookCertDir writes a throwaway self-signed serving certificate for
// localhost and hosts (addresses or DNS names) as tls.crt and tls.key,
// and as ca.crt (it is its own CA), into a directory of the test's, for
// managers (like Cluster API's) whose webhook server cannot be turned
// off and will not start without one.
func WebhookCertDir(t testing.TB, hosts ...string) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "localhost"},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for name, block := range map[string]*pem.Block{
		"tls.crt": {Type: "CERTIFICATE", Bytes: der},
		"ca.crt":  {Type: "CERTIFICATE", Bytes: der},
		"tls.key": {Type: "PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// CAPIWebhooks returns Cluster API core's admission webhook
// configurations, read from its module (config/webhook/manifests.yaml at
// the version the CRDs come from), pointed at a manager's webhook server
// at baseURL (https://HOST:PORT) and trusting caPEM, where a cluster would
// use the webhook Service and cert-manager's CA.
func CAPIWebhooks(ctx context.Context, baseURL string, caPEM []byte) ([]client.Object, error) {
	return capiCoreWebhooks(ctx, caPEM, func(path string) map[string]any {
		return map[string]any{"url": baseURL + path}
	})
}

// CAPIServiceWebhooks are Cluster API core's webhook configurations
// (CAPIWebhooks') pointed at the Service namespace/service (port 443) in
// front of its manager, as its release points them, trusting caPEM.
func CAPIServiceWebhooks(ctx context.Context, namespace, service string, caPEM []byte) ([]client.Object, error) {
	return capiCoreWebhooks(ctx, caPEM, func(path string) map[string]any {
		return map[string]any{"service": map[string]any{"namespace": namespace, "name": service, "path": path, "port": int64(443)}}
	})
}

// ConvertThrough sets crd's conversion to Cluster API core's conversion
// webhook (/convert) behind the Service namespace/service (port 443),
// trusting caPEM: what core's kustomize patches (config/crd/patches)
// and cert-manager's CA injection give its CRDs in a release. Without
// it the API server serves a v1beta2 object as v1beta1 unconverted, and
// a v1beta1 reader (CAPK v0.11) misses what moved.
func ConvertThrough(crd *apiextensionsv1.CustomResourceDefinition, namespace, service string, caPEM []byte) {
	crd.Spec.Conversion = &apiextensionsv1.CustomResourceConversion{
		Strategy: apiextensionsv1.WebhookConverter,
		Webhook: &apiextensionsv1.WebhookConversion{
			ConversionReviewVersions: []string{"v1"},
			ClientConfig: &apiextensionsv1.WebhookClientConfig{
				Service:  &apiextensionsv1.ServiceReference{Namespace: namespace, Name: service, Path: ptr.To("/convert"), Port: ptr.To(int32(443))},
				CABundle: caPEM,
			},
		},
	}
}

// capiCoreWebhooks are Cluster API core's webhook configurations, read
// from its module at the version its CRDs come from, each reached where
// at(path) says and trusting caPEM.
func capiCoreWebhooks(ctx context.Context, caPEM []byte, at func(path string) map[string]any) ([]client.Object, error) {
	var src CRDSource
	for _, s := range UpstreamCRDs() {
		if s.Module == "sigs.k8s.io/cluster-api" && strings.HasPrefix(s.Dir, "core/") {
			src = s
		}
	}
	return moduleWebhooks(ctx, src.Module, src.Version, "core/config/webhook/manifests.yaml", "capi-core-", func(path string) map[string]any {
		cfg := at(path)
		cfg["caBundle"] = base64.StdEncoding.EncodeToString(caPEM)
		return cfg
	})
}

// RegisterCAPIWebhooks waits until a core manager's webhook server at
// addr (HOST:PORT) answers TLS with certDir's certificate for HOST, then
// registers Cluster API core's webhook configurations there
// (CAPIWebhooks), failing closed as on a real cluster.
func RegisterCAPIWebhooks(ctx context.Context, t testing.TB, c client.Client, addr, certDir string) {
	t.Helper()
	ca, err := os.ReadFile(filepath.Join(certDir, "tls.crt"))
	if err != nil {
		t.Fatal(err)
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	poll.Until(t, ctx, 250*time.Millisecond, "the Cluster API webhook server", func() error {
		raw, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		conn := tls.Client(raw, &tls.Config{RootCAs: pool, ServerName: host})
		defer conn.Close()
		return conn.HandshakeContext(ctx)
	})
	configs, err := CAPIWebhooks(ctx, "https://"+addr, ca)
	if err != nil {
		t.Fatal(err)
	}
	for _, obj := range configs {
		if err := c.Create(ctx, obj); err != nil {
			t.Fatalf("register %s: %v", obj.GetName(), err)
		}
	}
}

// moduleWebhooks reads the mutating and validating webhook
// configurations of file in module@version, renamed with prefix, each
// webhook's clientConfig made by clientConfig from the path upstream's
// service reference names.
func moduleWebhooks(ctx context.Context, module, version, file, prefix string, clientConfig func(path string) map[string]any) ([]client.Object, error) {
	dir, err := ModuleDir(ctx, module, version)
	if err != nil {
		return nil, err
	}
	file = filepath.Join(dir, filepath.FromSlash(file))
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []client.Object
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		switch u.GetKind() {
		case "":
			continue
		case "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration":
		default:
			return nil, fmt.Errorf("%s: unexpected %s", file, u.GetKind())
		}
		u.SetName(prefix + u.GetName())
		hooks, _, _ := unstructured.NestedSlice(u.Object, "webhooks")
		for _, h := range hooks {
			hook, _ := h.(map[string]any)
			path, ok, _ := unstructured.NestedString(hook, "clientConfig", "service", "path")
			if !ok {
				return nil, fmt.Errorf("%s: webhook %v has no service path", file, hook["name"])
			}
			hook["clientConfig"] = clientConfig(path)
		}
		if err := unstructured.SetNestedSlice(u.Object, hooks, "webhooks"); err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	if len(out) != 2 {
		return nil, fmt.Errorf("%s: %d webhook configurations, want a mutating and a validating one", file, len(out))
	}
	return out, nil
}

// CAPIWebhookPort is where StartCAPIManager's manager serves its
// webhooks, inside its namespace.
const CAPIWebhookPort = 9443

// StartCAPIManager runs a Cluster API manager (CAPIManager's or
// KubeadmBootstrapManager's) in ns until the test ends, against the API
// server of kubeconfig, with its webhook server (which cannot be turned
// off, and binds every interface: hence the namespace) on
// CAPIWebhookPort with certDir's certificate, and its health and
// diagnostics servers off. If it exits before, exited is called with
// why; if the test fails, the tail of its log is logged.
func StartCAPIManager(t testing.TB, ns *netnstest.NS, bin, kubeconfig, certDir string, exited context.CancelCauseFunc) {
	t.Helper()
	StartProcess(t, ns, bin, []string{
		"--kubeconfig=" + kubeconfig,
		"--webhook-cert-dir=" + certDir,
		"--webhook-port=" + strconv.Itoa(CAPIWebhookPort),
		// 0 turns off the health and diagnostics (metrics) servers.
		"--health-addr=0",
		"--diagnostics-address=0",
		"--leader-elect=false",
	}, nil, exited)
}

// StartProcess runs bin with args (and env added to the test's) in ns
// until the test ends. If it exits before, exited is called with why;
// if the test fails, the tail of its log is logged. The whole log is
// kept in $COZY_TEST_ARTIFACTS when that is set.
func StartProcess(t testing.TB, ns *netnstest.NS, bin string, args, env []string, exited context.CancelCauseFunc) {
	t.Helper()
	logDir := os.Getenv("COZY_TEST_ARTIFACTS")
	if logDir == "" {
		logDir = t.TempDir()
	} else if err := os.MkdirAll(logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(logDir, strings.ReplaceAll(t.Name(), "/", "_")+"-"+filepath.Base(bin)+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := ns.Command(ctx, bin, args...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("start %s: %v", bin, err)
	}
	done := make(chan struct{})
	go func() {
		err := cmd.Wait()
		exited(fmt.Errorf("%s exited: %v", filepath.Base(bin), err))
		close(done)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		logFile.Close()
		if t.Failed() {
			log, _ := os.ReadFile(logPath)
			lines := strings.Split(strings.TrimRight(string(log), "\n"), "\n")
			t.Logf("%s log (tail of %s):\n%s", filepath.Base(bin), logPath, strings.Join(lines[max(0, len(lines)-60):], "\n"))
		}
	})
}
