package pxe

import (
	"net/netip"
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
	local := Config{Pool: pool("10.8.0.100-10.8.0.199"), Subnet: prefix("10.8.0.0/24"), Gateway: netip.MustParseAddr("10.8.0.1")}
	relayed := []Network{
		{Subnet: prefix("10.80.1.0/24"), Pool: pool("10.80.1.100-10.80.1.199")},
		{Subnet: prefix("10.80.2.7/24"), Pool: pool("10.80.2.100-10.80.2.199")}, // not masked: fine
	}
	tests := []struct {
		name    string
		cfg     Config
		want    []string // pools, in order
		wantErr string
	}{
		{"one pool, the shorthand", local, []string{"10.8.0.0/24 10.8.0.100-10.8.0.199"}, ""},
		{"the shorthand and relayed pools", with(local, func(c *Config) { c.Networks = relayed }),
			[]string{"10.8.0.0/24 10.8.0.100-10.8.0.199", "10.80.1.0/24 10.80.1.100-10.80.1.199", "10.80.2.0/24 10.80.2.100-10.80.2.199"}, ""},
		{"relayed pools only", Config{Networks: relayed},
			[]string{"10.80.1.0/24 10.80.1.100-10.80.1.199", "10.80.2.0/24 10.80.2.100-10.80.2.199"}, ""},
		{"reservations on any pool's network", with(local, func(c *Config) {
			c.Networks = relayed
			c.Reservations = map[string]netip.Addr{"52:54:00:00:00:01": netip.MustParseAddr("10.80.2.5"), "52:54:00:00:00:02": netip.MustParseAddr("10.8.0.5")}
		}), []string{"10.8.0.0/24 10.8.0.100-10.8.0.199", "10.80.1.0/24 10.80.1.100-10.80.1.199", "10.80.2.0/24 10.80.2.100-10.80.2.199"}, ""},
		{"a reservation on no pool's network", with(local, func(c *Config) {
			c.Reservations = map[string]netip.Addr{"52:54:00:00:00:01": netip.MustParseAddr("10.9.0.5")}
		}), nil, "on none of the pools' networks"},
		{"overlapping networks", with(local, func(c *Config) {
			c.Networks = []Network{{Subnet: prefix("10.8.0.0/16"), Pool: pool("10.8.9.1-10.8.9.9")}}
		}), nil, "overlap"},
		{"a range outside its network", Config{Networks: []Network{{Subnet: prefix("10.80.1.0/24"), Pool: pool("10.80.2.1-10.80.2.9")}}}, nil, "not inside"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			if failed(t, cfg.resolveNetworks(), tc.wantErr) {
				return
			}
			var got []string
			for _, n := range cfg.networks {
				got = append(got, n.String())
			}
			if strings.Join(got, "; ") != strings.Join(tc.want, "; ") {
				t.Errorf("pools %q, want %q", got, tc.want)
			}
		})
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

func with(c Config, f func(*Config)) Config {
	f(&c)
	return c
}
