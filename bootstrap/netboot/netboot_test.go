package netboot

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"cozy.dev/cozy/bootstrap/rack"
)

func TestConfigFromRack(t *testing.T) {
	r := parseRack(t, `
  gateway: 10.8.0.1
  dns: [10.8.0.1]
  dhcp: {mode: full, range: 10.8.0.100-10.8.0.150, leaseTime: 30m}
machines:
`+cp1+`  - hostname: w1
    mac: 52:54:00:00:00:02
    install: {disk: /dev/vda}
    interfaces:
      - name: bond0
        bond: {macs: [52:54:00:00:00:02, 52:54:00:00:00:03]}
        addresses: [10.8.0.21/24]
  - hostname: w2
    uuid: 4c4c4544-0042-3510-8052-b4c04f333432
    ipxe: snponly
    install: {disk: /dev/vda}
  - hostname: w3
    mac: 52:54:00:00:00:04
    ipxe: snponly
    install: {disk: /dev/vda}
    interfaces:
      - {mac: 52:54:00:00:00:04, addresses: [192.168.1.5/24]}
`)
	cfg, err := Config(r)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Interface != "br0" || cfg.Mode != "full" || !cfg.Talos || cfg.LeaseTime.String() != "30m0s" {
		t.Errorf("basics: %+v", cfg)
	}
	if local := cfg.Networks[0]; local.Subnet.String() != "10.8.0.0/24" || local.Gateway.String() != "10.8.0.1" || len(local.DNS) != 1 {
		t.Errorf("network: subnet %v gateway %v dns %v", local.Subnet, local.Gateway, local.DNS)
	}
	var macs []string
	for _, m := range cfg.AllowMACs {
		macs = append(macs, m.String())
	}
	if got := strings.Join(macs, " "); got != "52:54:00:00:00:01 52:54:00:00:00:02 52:54:00:00:00:04" {
		t.Errorf("allowed MACs %s", got)
	}
	want := map[string]netip.Addr{
		"52:54:00:00:00:01": netip.MustParseAddr("10.8.0.11"),
		"52:54:00:00:00:02": netip.MustParseAddr("10.8.0.21"),
	}
	if len(cfg.Reservations) != len(want) {
		t.Errorf("reservations %v, want %v (w3's address is not on the provisioning network)", cfg.Reservations, want)
	}
	for mac, ip := range want {
		if cfg.Reservations[mac] != ip {
			t.Errorf("reservation of %s = %v, want %v", mac, cfg.Reservations[mac], ip)
		}
	}
	if !NeedsUnknown(r) {
		t.Error("w2 has only a UUID: the server must boot unknown MACs")
	}
	if got := strings.Join(cfg.SNPOnly, " "); got != "4c4c4544-0042-3510-8052-b4c04f333432 52:54:00:00:00:04" {
		t.Errorf("snponly.efi for %q, want w2 by its UUID and w3 by its MAC", got)
	}
}

// Pools behind relays: each becomes a network of the server's, and a
// machine whose address is on one gets it reserved there.
func TestConfigRelayedPools(t *testing.T) {
	r := parseRack(t, `
  dhcp:
    mode: full
    range: 10.8.0.100-10.8.0.150
    relayed:
      - {subnet: 10.80.1.0/24, range: 10.80.1.100-10.80.1.199, gateway: 10.80.1.1, dns: [10.8.0.1]}
      - {subnet: 10.80.2.0/24, range: 10.80.2.100-10.80.2.199}
machines:
`+cp1+`  - hostname: w1
    mac: 52:54:00:00:00:02
    install: {disk: /dev/vda}
    interfaces:
      - {mac: 52:54:00:00:00:02, addresses: [10.80.2.21/24], gateway: 10.80.2.1}
`)
	cfg, err := Config(r)
	if err != nil {
		t.Fatal(err)
	}
	var nets []string
	for _, n := range cfg.Networks {
		nets = append(nets, fmt.Sprintf("%s %s gw=%v dns=%v", n.Subnet, n.Pool, n.Gateway, n.DNS))
	}
	want := "10.8.0.0/24 10.8.0.100-10.8.0.150 gw=invalid IP dns=[]; " + // the provisioning network's own
		"10.80.1.0/24 10.80.1.100-10.80.1.199 gw=10.80.1.1 dns=[10.8.0.1]; 10.80.2.0/24 10.80.2.100-10.80.2.199 gw=invalid IP dns=[]"
	if got := strings.Join(nets, "; "); got != want {
		t.Errorf("networks:\n got %s\nwant %s", got, want)
	}
	if got := cfg.Reservations["52:54:00:00:00:02"]; got != netip.MustParseAddr("10.80.2.21") {
		t.Errorf("w1 behind a relay: reservation %v, want 10.80.2.21", got)
	}
}

// cp1 is the control plane of the test racks, on 10.8.0.0/24.
const cp1 = `  - hostname: cp1
    role: controlplane
    mac: 52:54:00:00:00:01
    install: {disk: /dev/vda}
    interfaces:
      - {mac: 52:54:00:00:00:01, addresses: [10.8.0.11/24]}
`

// parseRack parses a rack on br0, 10.8.0.0/24, whose network section
// continues with rest (and its machines follow).
func parseRack(t *testing.T, rest string) *rack.Rack {
	t.Helper()
	r, err := rack.Parse([]byte(`apiVersion: cozy.dev/v1alpha1
kind: Rack
metadata: {name: t}
network:
  interface: br0
  subnet: 10.8.0.0/24`+rest), "t.yaml", ".")
	if err != nil {
		t.Fatal(err)
	}
	return r
}
