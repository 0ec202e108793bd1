//go:build integration

package pxe_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A rack file alone configures full mode: its pool, its machines (and
// only those), and a fixed address for a machine whose static address is
// on the provisioning network.
func TestServeRack(t *testing.T) {
	r := newRig(t)
	rackFile := filepath.Join(r.dir, "rack.yaml")
	rack := `apiVersion: cozy.dev/v1alpha1
kind: Rack
metadata: {name: t}
network:
  interface: boot0
  subnet: 10.77.0.0/24
  gateway: 10.77.0.1
  dhcp: {mode: full, range: 10.77.0.100-10.77.0.110, leaseTime: 5m}
machines:
  - hostname: cp1
    role: controlplane
    mac: 52:54:00:c0:21:01
    install: {disk: /dev/vda}
    interfaces:
      - {mac: "52:54:00:c0:21:01", addresses: [10.77.0.50/24]}
  - hostname: w1
    mac: 52:54:00:f0:00:07
    install: {disk: /dev/vda}
`
	if err := os.WriteFile(rackFile, []byte(rack), 0o644); err != nil {
		t.Fatal(err)
	}
	r.start(t, "--rack", rackFile)

	l, err := r.lease(t, clientMAC)
	if err != nil {
		t.Fatalf("cp1: %v\n%s", err, r.stderr)
	}
	if got := l.ACK.YourIPAddr.String(); got != "10.77.0.50" {
		t.Errorf("cp1 got %s, want its rack address 10.77.0.50", got)
	}
	if l.ACK.IPAddressLeaseTime(0).String() != "5m0s" {
		t.Errorf("lease time %v, want the rack's 5m", l.ACK.IPAddressLeaseTime(0))
	}
	l, err = r.lease(t, mac(7))
	if err != nil {
		t.Fatalf("w1: %v\n%s", err, r.stderr)
	}
	if ip := l.ACK.YourIPAddr; ip.To4()[3] < 100 || ip.To4()[3] > 110 {
		t.Errorf("w1 got %s, want one from the rack's range", ip)
	}
	if _, err := r.lease(t, mac(9)); err == nil || !strings.Contains(err.Error(), "no matching response") {
		t.Errorf("a MAC that is not in the rack: %v, want no answer", err)
	}
}
