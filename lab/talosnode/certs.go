package talosnode

import (
	"crypto/tls"
	stdx509 "crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/siderolabs/crypto/x509"
	"github.com/siderolabs/talos/pkg/machinery/config/config"
)

// certLifetime of the certificates the node issues itself. They are
// issued again on every boot, so a year is never reached in practice.
const certLifetime = 365 * 24 * time.Hour

// clockSkew backdates certificates, as Talos does, so a peer whose clock is
// a little behind accepts them.
const clockSkew = 10 * time.Second

// sans are a certificate's subject alternative names.
type sans struct {
	IPs      []net.IP
	DNSNames []string
}

func (s sans) options() []x509.Option {
	return []x509.Option{x509.IPAddresses(s.IPs), x509.DNSNames(s.DNSNames)}
}

// apiSANs are the names of the node's API certificate: its address,
// loopback, its hostname and machine.certSANs, as Talos's API certificate
// has them.
func apiSANs(addr netip.Addr, hostname string, extra []string) sans {
	s := sans{
		IPs:      []net.IP{addr.AsSlice(), net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		DNSNames: []string{hostname, "localhost"},
	}
	for _, e := range extra {
		if ip, err := netip.ParseAddr(e); err == nil {
			s.IPs = append(s.IPs, ip.AsSlice())
		} else if e != "" {
			s.DNSNames = append(s.DNSNames, e)
		}
	}
	return s
}

// maintenanceTLS is what Talos's maintenance service serves with: a
// certificate from a throwaway self-signed CA, and no client certificate
// asked for. Clients connect with --insecure (InsecureSkipVerify).
func maintenanceTLS(names sans) (*tls.Config, error) {
	ca, err := x509.NewSelfSignedCertificateAuthority(x509.ECDSA(true))
	if err != nil {
		return nil, fmt.Errorf("maintenance CA: %w", err)
	}
	kp, err := x509.NewKeyPair(ca, append(names.options(),
		x509.NotBefore(time.Now().Add(-clockSkew)),
		x509.NotAfter(time.Now().Add(certLifetime)),
		x509.ExtKeyUsage([]stdx509.ExtKeyUsage{stdx509.ExtKeyUsageServerAuth}),
	)...)
	if err != nil {
		return nil, fmt.Errorf("maintenance certificate: %w", err)
	}
	return &tls.Config{
		Certificates: []tls.Certificate{*kp.Certificate},
		ClientAuth:   tls.NoClientCert,
		MinVersion:   tls.VersionTLS12,
	}, nil
}

// issue signs a certificate for names with ca.
func issue(ca *x509.PEMEncodedCertificateAndKey, cn string, org []string, names sans, usage ...stdx509.ExtKeyUsage) (*x509.KeyPair, error) {
	authority, err := x509.NewCertificateAuthorityFromCertificateAndKey(ca)
	if err != nil {
		return nil, fmt.Errorf("load CA: %w", err)
	}
	opts := append(names.options(),
		x509.CommonName(cn),
		x509.NotBefore(time.Now().Add(-clockSkew)),
		x509.NotAfter(time.Now().Add(certLifetime)),
		x509.KeyUsage(stdx509.KeyUsageDigitalSignature|stdx509.KeyUsageKeyEncipherment),
		x509.ExtKeyUsage(usage),
	)
	if len(org) > 0 {
		opts = append(opts, x509.Organization(org...))
	}
	return x509.NewKeyPair(authority, opts...)
}

// osCAPool holds the OS CAs a configured node trusts for its API clients:
// machine.ca and machine.acceptedCAs.
func osCAPool(sec config.Security) (*stdx509.CertPool, error) {
	pool := stdx509.NewCertPool()
	n := 0
	add := func(pem []byte) {
		if len(pem) > 0 && pool.AppendCertsFromPEM(pem) {
			n++
		}
	}
	if ca := sec.IssuingCA(); ca != nil {
		add(ca.Crt)
	}
	for _, ca := range sec.AcceptedCAs() {
		add(ca.Crt)
	}
	if n == 0 {
		return nil, errors.New("the machine config has no machine.ca certificate")
	}
	return pool, nil
}

// configuredTLS serves the machine API with mutual TLS: the server
// certificate chains to the OS CA and so must every client's.
func configuredTLS(cert tls.Certificate, clients *stdx509.CertPool) *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    clients,
		MinVersion:   tls.VersionTLS12,
	}
}

// canIssue reports whether the config holds a CA's key, as control-plane
// configs do for machine.ca and worker configs don't.
func canIssue(ca *x509.PEMEncodedCertificateAndKey) bool {
	return ca != nil && len(ca.Crt) > 0 && len(ca.Key) > 0
}
