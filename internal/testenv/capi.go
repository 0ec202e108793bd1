package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"cozy.dev/cozy/internal/prereq"
)

// CAPIManager returns the Cluster API core manager that
// hack/capi-controllers.sh built, from COZY_CAPI_BIN. When it is unset or
// holds no manager the test fails under CI=true and skips elsewhere.
func CAPIManager(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("COZY_CAPI_BIN")
	if dir == "" {
		prereq.Missing(t, "COZY_CAPI_BIN is not set; run `make test`, or export COZY_CAPI_BIN=$(hack/capi-controllers.sh)")
	}
	bin := filepath.Join(dir, "cluster-api-manager")
	if fi, err := os.Stat(bin); err != nil || fi.Mode()&0o111 == 0 {
		prereq.Missing(t, "COZY_CAPI_BIN=%s has no executable cluster-api-manager; rebuild with hack/capi-controllers.sh", dir)
	}
	return bin
}

// WebhookCertDir writes a throwaway self-signed serving certificate for
// localhost as tls.crt and tls.key into a directory of the test's, for
// managers (like Cluster API's) whose webhook server cannot be turned off
// and will not start without one.
func WebhookCertDir(t testing.TB) string {
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
		"tls.key": {Type: "PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}
