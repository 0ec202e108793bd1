package talosnode

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	stdx509 "crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"text/template"
	"time"

	"github.com/siderolabs/crypto/x509"
	"github.com/siderolabs/talos/pkg/machinery/config/config"
)

// kubeconfigTemplate is Talos's admin kubeconfig, field for field.
var kubeconfigTemplate = template.Must(template.New("kubeconfig").Funcs(template.FuncMap{
	"base64": func(b []byte) string { return base64.StdEncoding.EncodeToString(b) },
}).Parse(`apiVersion: v1
kind: Config
clusters:
- name: {{ .Cluster }}
  cluster:
    server: {{ .Endpoint }}
    certificate-authority-data: {{ base64 .CA }}
users:
- name: admin@{{ .Cluster }}
  user:
    client-certificate-data: {{ base64 .Crt }}
    client-key-data: {{ base64 .Key }}
contexts:
- context:
    cluster: {{ .Cluster }}
    namespace: default
    user: admin@{{ .Cluster }}
  name: admin@{{ .Cluster }}
current-context: admin@{{ .Cluster }}
`))

// adminKubeconfig issues an admin client certificate from the cluster CA
// (CN and O from cluster.adminKubeConfig: admin, system:masters) and
// returns the kubeconfig for the control-plane endpoint, as Talos's
// Kubeconfig API does.
func adminKubeconfig(cl config.ClusterConfig) ([]byte, error) {
	admin := cl.AdminKubeconfig()
	kp, err := clusterClientCert(cl, admin.CommonName(), admin.CertOrganization(), admin.CertLifetime())
	if err != nil {
		return nil, fmt.Errorf("admin certificate: %w", err)
	}
	cas := bytes.Clone(cl.IssuingCA().Crt)
	for _, accepted := range cl.AcceptedCAs() {
		cas = append(cas, accepted.Crt...)
	}
	var out bytes.Buffer
	err = kubeconfigTemplate.Execute(&out, struct {
		Cluster, Endpoint string
		CA, Crt, Key      []byte
	}{cl.Name(), cl.Endpoint().String(), cas, kp.CrtPEM, kp.KeyPEM})
	return out.Bytes(), err
}

// clusterClientCert issues a Kubernetes client certificate from the
// cluster CA, which a control plane's config holds with its key.
func clusterClientCert(cl config.ClusterConfig, cn, org string, lifetime time.Duration) (*x509.KeyPair, error) {
	ca := cl.IssuingCA()
	if !canIssue(ca) {
		return nil, errors.New("the config has no cluster.ca with a key")
	}
	authority, err := x509.NewCertificateAuthorityFromCertificateAndKey(ca)
	if err != nil {
		return nil, fmt.Errorf("cluster CA: %w", err)
	}
	return x509.NewKeyPair(authority,
		x509.CommonName(cn),
		x509.Organization(org),
		x509.NotBefore(time.Now().Add(-clockSkew)),
		x509.NotAfter(time.Now().Add(lifetime)),
		x509.KeyUsage(stdx509.KeyUsageDigitalSignature|stdx509.KeyUsageKeyEncipherment),
		x509.ExtKeyUsage([]stdx509.ExtKeyUsage{stdx509.ExtKeyUsageClientAuth}),
	)
}

// tarGz wraps a kubeconfig as Talos streams it: a gzipped tar holding one
// file named kubeconfig (the client's Copy protocol).
func tarGz(kubeconfig []byte) ([]byte, error) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	if err := tw.WriteHeader(&tar.Header{
		Typeflag: tar.TypeReg,
		Name:     "kubeconfig",
		Size:     int64(len(kubeconfig)),
		ModTime:  time.Now(),
		Mode:     0o600,
	}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(kubeconfig); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
