package netboot

import (
	"net/netip"
	"strings"
	"testing"

	"cozy.dev/cozy/bootstrap/rack"
)

func TestConfigFromRack(t *testing.T) {
	r, err := rack.Parse([]byte(`apiVersion: cozy.dev/v1alpha1
kind: Rack
metadata: {name: t}
network:
  interface: br0
  subnet: 10.8.0.0/24
  gateway: 10.8.0.1
  dns: [10.8.0.1]
  dhcp: {mode: full, range: 10.8.0.100-10.8.0.150, leaseTime: 30m}
machines:
  - hostname: cp1
    role: controlplane
    mac: 52:54:00:00:00:01
    install: {disk: /dev/vda}
    interfaces:
      - {mac: 52:54:00:00:00:01, addresses: [10.8.0.11/24]}
  - hostname: w1
    mac: 52:54:00:00:00:02
    install: {disk: /dev/vda}
    interfaces:
      - name: bond0
        bond: {macs: [52:54:00:00:00:02, 52:54:00:00:00:03]}
        addresses: [10.8.0.21/24]
  - hostname: w2
    uuid: 4c4c4544-0042-3510-8052-b4c04f333432
    install: {disk: /dev/vda}
  - hostname: w3
    mac: 52:54:00:00:00:04
    install: {disk: /dev/vda}
    interfaces:
      - {mac: 52:54:00:00:00:04, addresses: [192.168.1.5/24]}
`), "t.yaml", ".")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := Config(r)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Interface != "br0" || cfg.Mode != "full" || !cfg.Talos || cfg.LeaseTime.String() != "30m0s" {
		t.Errorf("basics: %+v", cfg)
	}
	if cfg.Subnet.String() != "10.8.0.0/24" || cfg.Gateway.String() != "10.8.0.1" || len(cfg.DNS) != 1 {
		t.Errorf("network: subnet %v gateway %v dns %v", cfg.Subnet, cfg.Gateway, cfg.DNS)
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
}
