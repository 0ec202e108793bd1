package lab

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"cozy.dev/cozy/bmc"
	"cozy.dev/cozy/internal/netns"
	"cozy.dev/cozy/lab/redfishbmc"
)

// BMCCredentialsFile is the lab BMCs' account, in the lab's dir next to
// its rack file (mode 0600): a password made for each lab.
const BMCCredentialsFile = "bmc.yaml"

// bmcPort is where each lab BMC serves Redfish over HTTPS, as real ones.
const bmcPort = 443

// BMCEndpoint is the address of a lab VM's BMC, reachable inside the
// lab's namespace.
func BMCEndpoint(m Machine) string { return net.JoinHostPort(m.BMC.String(), fmt.Sprint(bmcPort)) }

// writeBMCCredentials makes the lab BMCs' account on the first lab up and
// keeps it after.
func (c *Config) writeBMCCredentials() error {
	path := filepath.Join(c.Dir, BMCCredentialsFile)
	if _, err := bmc.LoadCredentials(path); err == nil {
		return nil
	}
	secret := make([]byte, 18)
	if _, err := rand.Read(secret); err != nil {
		return err
	}
	data := fmt.Sprintf("# The account of lab %s's BMCs (cozyctl lab up made it).\nusername: admin\npassword: %s\n", c.Name, base64.RawURLEncoding.EncodeToString(secret))
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		return err
	}
	return os.Chmod(path, 0o600) // also when the file was there, open
}

// vmPower is a lab VM as its BMC sees it: power is its QEMU process.
type vmPower struct {
	c     *Config
	m     Machine
	accel string
}

func (v vmPower) Running(context.Context) (bool, error) { return v.c.vmPID(v.m) != 0, nil }

func (v vmPower) Start(ctx context.Context, netboot bool) error {
	return v.c.startVM(ctx, v.m, v.accel, netboot)
}

func (v vmPower) Stop(_ context.Context, graceful bool) error {
	if graceful {
		// ACPI power button: QEMU exits once the guest has shut down, if
		// it does.
		return qmp(v.c.files(v.m).qmp(), "system_powerdown")
	}
	v.c.stopVM(v.m)
	return nil
}

// Restart resets the VM. QEMU cannot change a running VM's boot order,
// so a reset into a network boot is a power cycle, as the guest sees it
// the same.
func (v vmPower) Restart(ctx context.Context, netboot bool) error {
	if !netboot {
		return qmp(v.c.files(v.m).qmp(), "system_reset")
	}
	v.c.stopVM(v.m)
	return v.c.startVM(ctx, v.m, v.accel, true)
}

// ServeBMCs serves one Redfish BMC per VM, each on its address on the
// lab's management network, until ctx ends. Run it inside the lab's
// namespace (cozyctl lab bmc serve, which lab up starts).
func ServeBMCs(ctx context.Context, c *Config, accel string, log *slog.Logger) error {
	creds, err := bmc.LoadCredentials(filepath.Join(c.Dir, BMCCredentialsFile))
	if err != nil {
		return err
	}
	cert, err := selfSigned()
	if err != nil {
		return err
	}
	errs := make(chan error, c.Nodes)
	var servers []*http.Server
	for _, m := range c.Machines() {
		h := redfishbmc.New(redfishbmc.Credentials(creds), log.With("bmc", m.Name), redfishbmc.System{
			ID: m.UUID, UUID: m.UUID, MAC: m.MACText, CPUs: vmCPUs(m, accel),
			MemoryMiB: c.MemoryMiB, DiskBytes: int64(c.DiskGiB) << 30, Machine: vmPower{c: c, m: m, accel: accel},
		})
		l, err := net.Listen("tcp", BMCEndpoint(m))
		if err != nil {
			return fmt.Errorf("BMC of %s: %w", m.Name, err)
		}
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}}
		servers = append(servers, srv)
		go func() { errs <- srv.ServeTLS(l, "", "") }()
		log.Info("BMC serving", "machine", m.Name, "address", "redfish+https://"+BMCEndpoint(m))
	}
	select {
	case <-ctx.Done():
	case err = <-errs:
	}
	for _, s := range servers {
		_ = s.Close()
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// selfSigned makes the lab BMCs' certificate, new at each start, as a
// BMC's self-signed one: clients check nothing of it but need
// insecureSkipVerify, which the lab's rack sets.
func selfSigned() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: "cozy-lab-bmc"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().AddDate(1, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// startBMCs runs `cozyctl lab bmc serve` in the lab's namespace and waits
// until every BMC answers.
func (c *Config) startBMCs(ctx context.Context, cozyctl, accel string) error {
	creds, err := bmc.LoadCredentials(filepath.Join(c.Dir, BMCCredentialsFile))
	if err != nil {
		return err
	}
	ready := func(ctx context.Context) error {
		for _, m := range c.Machines() {
			addr, _ := bmc.ParseAddress("redfish+https://" + BMCEndpoint(m) + bmc.SystemsPath + "/" + m.UUID)
			ctl, err := bmc.Dial(ctx, bmc.Target{Address: addr, Credentials: creds, InsecureSkipVerify: true,
				Timeout: 2 * time.Second, DialContext: netns.Dialer(Namespace(c.Name))})
			if err != nil {
				return fmt.Errorf("the BMC of %s: %w", m.Name, err)
			}
			ctl.Close()
		}
		return nil
	}
	return c.startDaemon(ctx, "the BMCs", cozyctl, "bmc.log", 0o600, ready, "lab", "bmc", "serve", "--dir", c.Dir, "--accel", accel)
}
