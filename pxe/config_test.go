package pxe

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"cozy.dev/cozy/pxe/lease"
)

func TestResolveNetworks(t *testing.T) {
	pool := func(s string) lease.Pool {
		p, err := lease.ParsePool(s)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	prefix := netip.MustParsePrefix
	local := Network{Pool: pool("10.8.0.100-10.8.0.199"), Subnet: prefix("10.8.0.0/24"), Gateway: netip.MustParseAddr("10.8.0.1")}
	relayed := []Network{
		{Subnet: prefix("10.80.1.0/24"), Pool: pool("10.80.1.100-10.80.1.199")},
		{Subnet: prefix("10.80.2.7/24"), Pool: pool("10.80.2.100-10.80.2.199")}, // not masked: fine
	}
	full := func(nets ...Network) func(*Config) {
		return func(c *Config) { c.Mode, c.Networks = "full", nets }
	}
	tests := []struct {
		name    string
		cfg     func(*Config)
		want    []string // pools, in order
		wantErr string
	}{
		{"one pool", full(local), []string{"10.8.0.0/24 10.8.0.100-10.8.0.199"}, ""},
		{"a pool without its network is on the interface's", func(c *Config) {
			c.Interface = "lo" // only its address is read
			full(Network{Pool: pool("127.0.0.100-127.0.0.199")})(c)
		}, []string{"127.0.0.0/8 127.0.0.100-127.0.0.199"}, ""},
		{"the local pool and relayed pools", full(append([]Network{local}, relayed...)...),
			[]string{"10.8.0.0/24 10.8.0.100-10.8.0.199", "10.80.1.0/24 10.80.1.100-10.80.1.199", "10.80.2.0/24 10.80.2.100-10.80.2.199"}, ""},
		{"relayed pools only", full(relayed...),
			[]string{"10.80.1.0/24 10.80.1.100-10.80.1.199", "10.80.2.0/24 10.80.2.100-10.80.2.199"}, ""},
		{"reservations on any pool's network", func(c *Config) {
			full(append([]Network{local}, relayed...)...)(c)
			c.Reservations = map[string]netip.Addr{"52:54:00:00:00:01": netip.MustParseAddr("10.80.2.5"), "52:54:00:00:00:02": netip.MustParseAddr("10.8.0.5")}
		}, []string{"10.8.0.0/24 10.8.0.100-10.8.0.199", "10.80.1.0/24 10.80.1.100-10.80.1.199", "10.80.2.0/24 10.80.2.100-10.80.2.199"}, ""},
		{"a reservation on no pool's network", func(c *Config) {
			full(local)(c)
			c.Reservations = map[string]netip.Addr{"52:54:00:00:00:01": netip.MustParseAddr("10.9.0.5")}
		}, nil, "on none of the pools' networks"},
		{"overlapping networks", full(local, Network{Subnet: prefix("10.8.0.0/16"), Pool: pool("10.8.9.1-10.8.9.9")}), nil, "overlap"},
		{"a range outside its network", full(Network{Subnet: prefix("10.80.1.0/24"), Pool: pool("10.80.2.1-10.80.2.9")}), nil, "not inside"},
		{"a gateway without a range", full(Network{Subnet: prefix("10.80.1.0/24"), Gateway: netip.MustParseAddr("10.80.1.1")}), nil, "no address range"},
		{"two pools without their networks", full(Network{Pool: pool("10.8.0.100-10.8.0.109")}, Network{Pool: pool("10.8.0.110-10.8.0.119")}), nil, "more than one pool without its network"},
		{"an IPv6 network", full(Network{Subnet: prefix("fd00::/64"), Pool: pool("10.8.0.100-10.8.0.109")}), nil, "not an IPv4 network"},
		{"full mode without a pool", full(), nil, "full mode needs an address pool"},
		{"pools in proxy mode", func(c *Config) { c.Networks = []Network{local} }, nil, "add --mode full"},
		{"fixed addresses in proxy mode", func(c *Config) {
			c.Reservations = map[string]netip.Addr{"52:54:00:00:00:01": netip.MustParseAddr("10.8.0.5")}
		}, nil, "add --mode full"},
		{"an unknown mode", func(c *Config) { c.Mode = "relay" }, nil, `mode "relay"`},
	}
	dir := bootFiles(t)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := archConfig(dir)
			tc.cfg(&cfg)
			p, err := cfg.resolve()
			if failed(t, err, tc.wantErr) {
				return
			}
			var got []string
			for _, n := range p.Networks {
				got = append(got, n.String())
			}
			if strings.Join(got, "; ") != strings.Join(tc.want, "; ") {
				t.Errorf("pools %q, want %q", got, tc.want)
			}
		})
	}
}

// TestResolveLeavesConfigAlone: resolving fills in the plan, never the
// caller's Config (whose slices it might otherwise share).
func TestResolveLeavesConfigAlone(t *testing.T) {
	dir := bootFiles(t)
	cfgFile := filepath.Join(dir, "cp.yaml")
	if err := os.WriteFile(cfgFile, []byte("machine: {}"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := archConfig(dir)
	cfg.AllowUnknown = false
	cfg.AllowMACs = make([]net.HardwareAddr, 1, 4) // room to append into
	cfg.AllowMACs[0] = net.HardwareAddr{0x52, 0x54, 0, 0, 0, 1}
	cfg.MachineConfigs = map[string]string{"52:54:00:00:00:02": cfgFile}
	before := fmt.Sprintf("%+v", cfg)
	p, err := cfg.resolve()
	if err != nil {
		t.Fatal(err)
	}
	if after := fmt.Sprintf("%+v", cfg); after != before {
		t.Errorf("resolve changed its Config:\n%s\nto\n%s", before, after)
	}
	if extra := cfg.AllowMACs[:2][1]; extra != nil {
		t.Errorf("resolve wrote %v into the caller's AllowMACs array", extra)
	}
	if len(p.AllowMACs) != 2 || !p.Talos || p.HTTPPort != 8080 || p.Mode != "proxy" {
		t.Errorf("plan: allowed %v, talos %v, HTTP port %d, mode %q; want both MACs, Talos, 8080, proxy", p.AllowMACs, p.Talos, p.HTTPPort, p.Mode)
	}

	// Nor the caller's pools, whose networks the plan masks.
	full := archConfig(dir)
	full.Mode = "full"
	pool, _ := lease.ParsePool("10.80.1.100-10.80.1.199")
	full.Networks = []Network{{Subnet: netip.MustParsePrefix("10.80.1.7/24"), Pool: pool}}
	before = fmt.Sprintf("%+v", full)
	if p, err = full.resolve(); err != nil {
		t.Fatal(err)
	}
	if after := fmt.Sprintf("%+v", full); after != before {
		t.Errorf("resolve changed its Config's pools:\n%s\nto\n%s", before, after)
	}
	if got := p.Networks[0].Subnet.String(); got != "10.80.1.0/24" {
		t.Errorf("plan's network %s, want 10.80.1.0/24", got)
	}
}

// failed checks err against wantErr (a part of the message; "" for no
// error) and reports whether there was an error.
func failed(t *testing.T, err error, wantErr string) bool {
	t.Helper()
	switch {
	case wantErr == "" && err != nil:
		t.Fatal(err)
	case wantErr != "" && (err == nil || !strings.Contains(err.Error(), wantErr)):
		t.Fatalf("error %v, want %q", err, wantErr)
	}
	return err != nil
}
