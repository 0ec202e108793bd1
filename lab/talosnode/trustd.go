package talosnode

import (
	"context"
	"crypto/subtle"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/siderolabs/crypto/x509"
	"github.com/siderolabs/talos/pkg/machinery/api/security"
	"github.com/siderolabs/talos/pkg/machinery/config"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// trustd is Talos's certificate service on control planes: it signs the
// API certificate requests of workers that present the machine token.
type trustd struct {
	security.UnimplementedSecurityServiceServer
	ca    *x509.PEMEncodedCertificateAndKey
	token string
	log   *slog.Logger
}

// Certificate signs a CSR with the OS CA, for a caller with the token.
func (t *trustd) Certificate(ctx context.Context, req *security.CertificateRequest) (*security.CertificateResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if got := md.Get("token"); len(got) == 0 || subtle.ConstantTimeCompare([]byte(got[0]), []byte(t.token)) != 1 {
		return nil, status.Error(codes.Unauthenticated, "Unauthenticated")
	}
	crt, err := x509.NewCertificateFromCSRBytes(t.ca.Crt, t.ca.Key, req.GetCsr(),
		x509.NotBefore(time.Now().Add(-clockSkew)),
		x509.NotAfter(time.Now().Add(certLifetime)),
	)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "sign certificate request: %s", err)
	}
	t.log.Info("trustd: issued an API certificate", "names", crt.X509Certificate.DNSNames, "ips", crt.X509Certificate.IPAddresses)
	return &security.CertificateResponse{Ca: t.ca.Crt, Crt: crt.X509CertificatePEM}, nil
}

// trustdTLS serves trustd with the node's API certificate; callers
// authenticate with the token, not a certificate.
func trustdTLS(cert tls.Certificate) *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.NoClientCert, MinVersion: tls.VersionTLS12}
}

// tokenCredentials send the machine token as Talos's workers do.
type tokenCredentials string

func (t tokenCredentials) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"token": string(t)}, nil
}

func (tokenCredentials) RequireTransportSecurity() bool { return true }

// requestCertificate gets a worker's API certificate from trustd on the
// control-plane endpoint's host, retrying until it is given one or ctx
// ends. Talos's workers find trustd the same way before the cluster is
// up; they also learn the other control planes' addresses later.
func requestCertificate(ctx context.Context, mc config.Config, names sans, log *slog.Logger) (*tls.Certificate, error) {
	sec := mc.Machine().Security()
	roots, err := osCAPool(sec)
	if err != nil {
		return nil, err
	}
	csr, identity, err := x509.NewEd25519CSRAndIdentity(names.options()...)
	if err != nil {
		return nil, fmt.Errorf("certificate request: %w", err)
	}
	host := mc.Cluster().Endpoint().Hostname()
	conn, err := grpc.NewClient(net.JoinHostPort(host, strconv.Itoa(TrustdPort)),
		grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12})),
		grpc.WithPerRPCCredentials(tokenCredentials(sec.Token())),
	)
	if err != nil {
		return nil, fmt.Errorf("trustd client: %w", err)
	}
	defer conn.Close()
	client := security.NewSecurityServiceClient(conn)
	for attempt := 0; ; attempt++ {
		callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := client.Certificate(callCtx, &security.CertificateRequest{Csr: csr.X509CertificateRequestPEM})
		cancel()
		if err == nil {
			cert, err := tls.X509KeyPair(resp.GetCrt(), identity.Key)
			if err != nil {
				return nil, fmt.Errorf("certificate from trustd: %w", err)
			}
			return &cert, nil
		}
		if attempt%30 == 0 {
			log.Info("waiting for trustd on the control plane", "endpoint", host, "err", err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}
