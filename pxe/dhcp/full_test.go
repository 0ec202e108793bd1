package dhcp

import (
	"bytes"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"

	"cozy.dev/cozy/pxe/lease"
)

var (
	ordinaryMAC = net.HardwareAddr{0x52, 0x54, 0x00, 0x00, 0x00, 0x01}
	strangerMAC = net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x00, 0x99}
)

func newFull(t *testing.T, pool string) (*Full, *lease.Store) {
	t.Helper()
	p, err := lease.ParsePool(pool)
	if err != nil {
		t.Fatal(err)
	}
	store, err := lease.Open(t.TempDir(), []lease.Network{{Pool: p}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	f, err := NewFull(FullConfig{
		Boot:         testConfig(),
		AllowAddress: func(mac net.HardwareAddr) bool { return !bytes.Equal(mac, strangerMAC) },
		Networks: []Network{{
			Subnet:  netip.MustParsePrefix("10.8.0.0/24"),
			Routers: []netip.Addr{netip.MustParseAddr("10.8.0.254")},
			DNS:     []netip.Addr{netip.MustParseAddr("10.8.0.53")},
			Leases:  store.Network(0),
		}},
		LeaseTime: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	return f, store
}

func reply(t *testing.T, f *Full, mt dhcpv4.MessageType, mac net.HardwareAddr, mods ...dhcpv4.Modifier) (*dhcpv4.DHCPv4, Outcome, error) {
	t.Helper()
	r, o, err := f.Reply(request(t, mt, append([]dhcpv4.Modifier{dhcpv4.WithHwAddr(mac)}, mods...)...), PortDHCP)
	if r != nil {
		if r, err = dhcpv4.FromBytes(r.ToBytes()); err != nil {
			t.Fatalf("reply does not parse: %v", err)
		}
	}
	return r, o, err
}

var server = dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.IP(serverIP.AsSlice())))

func requested(ip string) dhcpv4.Modifier {
	return dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.ParseIP(ip)))
}

func TestFullDORA(t *testing.T) {
	f, store := newFull(t, "10.8.0.100-10.8.0.101")

	offer, o, err := reply(t, f, dhcpv4.MessageTypeDiscover, ordinaryMAC)
	if err != nil || o != Offered {
		t.Fatalf("discover: %s %v", o, err)
	}
	if offer.YourIPAddr.String() != "10.8.0.100" || offer.BootFileName != "" {
		t.Errorf("offer yiaddr %v file %q: want 10.8.0.100 and no boot file for a non-PXE client", offer.YourIPAddr, offer.BootFileName)
	}
	if offer.IPAddressLeaseTime(0) != time.Hour || offer.SubnetMask().String() != "ffffff00" ||
		offer.Router()[0].String() != "10.8.0.254" || offer.DNS()[0].String() != "10.8.0.53" {
		t.Errorf("offer options: %s", offer.Summary())
	}
	if _, ok := store.Lookup(ordinaryMAC.String()); ok {
		t.Error("an offer must not create a lease")
	}

	ack, o, err := reply(t, f, dhcpv4.MessageTypeRequest, ordinaryMAC, server, requested("10.8.0.100"))
	if err != nil || o != Acked || ack.YourIPAddr.String() != "10.8.0.100" {
		t.Fatalf("request: %s %v %v", o, err, ack)
	}
	if l, ok := store.Lookup(ordinaryMAC.String()); !ok || l.IP.String() != "10.8.0.100" {
		t.Errorf("ACK sent but lease not stored: %v %v", l, ok)
	}

	// A PXE client gets an address and its boot file in one offer.
	pxeOffer, o, err := reply(t, f, dhcpv4.MessageTypeDiscover, knownMAC, pxe(iana.EFI_X86_64)...)
	if err != nil || o != Offered || pxeOffer.YourIPAddr.String() != "10.8.0.101" || pxeOffer.BootFileName != "ipxe.efi" ||
		!pxeOffer.ServerIPAddr.Equal(net.IP(serverIP.AsSlice())) {
		t.Fatalf("PXE discover: %s %v %v", o, err, pxeOffer)
	}
	// iPXE gets its script URL, and no PXEClient vendor class: it would
	// take this server for a ProxyDHCP one and wait for it on port 4011.
	ipxeMods := append(pxe(iana.EFI_X86_64), dhcpv4.WithGeneric(dhcpv4.OptionUserClassInformation, []byte("iPXE")))
	ipxeAck, o, err := reply(t, f, dhcpv4.MessageTypeRequest, knownMAC, append(ipxeMods, requested("10.8.0.101"))...)
	if err != nil || o != Acked || !strings.HasSuffix(ipxeAck.BootFileName, ".ipxe") || ipxeAck.ClassIdentifier() != "" {
		t.Errorf("iPXE request: %s %v file %q vendor class %q", o, err, ipxeAck.BootFileName, ipxeAck.ClassIdentifier())
	}
	if pxeOffer.ClassIdentifier() != "PXEClient" {
		t.Errorf("firmware PXE offer: vendor class %q, want PXEClient", pxeOffer.ClassIdentifier())
	}
	// The pool (two addresses) is now exhausted for a third client.
	if _, o, err := reply(t, f, dhcpv4.MessageTypeDiscover, otherMAC); o != Rejected || err == nil {
		t.Errorf("third client: %s %v, want rejected: pool exhausted", o, err)
	}
}

func TestFullRequests(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(t *testing.T, f *Full) // leases granted before
		mt      dhcpv4.MessageType
		mac     net.HardwareAddr
		mods    []dhcpv4.Modifier
		want    Outcome
		wantYI  string
		wantErr bool
	}{
		{name: "selecting another server's offer", mt: dhcpv4.MessageTypeRequest, mac: ordinaryMAC,
			mods: []dhcpv4.Modifier{dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.IPv4(10, 8, 0, 2))), requested("10.8.0.100")},
			want: IgnoredOtherHost},
		{name: "init-reboot on another network", mt: dhcpv4.MessageTypeRequest, mac: ordinaryMAC,
			mods: []dhcpv4.Modifier{requested("192.168.1.5")}, want: Nacked},
		{name: "init-reboot for a free pool address", mt: dhcpv4.MessageTypeRequest, mac: ordinaryMAC,
			mods: []dhcpv4.Modifier{requested("10.8.0.105")}, want: Acked, wantYI: "10.8.0.105"},
		{name: "init-reboot for someone else's address", mt: dhcpv4.MessageTypeRequest, mac: ordinaryMAC,
			setup: grant(otherMAC, "10.8.0.105"),
			mods:  []dhcpv4.Modifier{requested("10.8.0.105")}, want: Nacked},
		{name: "renewing", mt: dhcpv4.MessageTypeRequest, mac: ordinaryMAC, setup: grant(ordinaryMAC, "10.8.0.103"),
			mods: []dhcpv4.Modifier{dhcpv4.WithClientIP(net.ParseIP("10.8.0.103"))}, want: Acked, wantYI: "10.8.0.103"},
		{name: "request naming no address", mt: dhcpv4.MessageTypeRequest, mac: ordinaryMAC, want: Rejected, wantErr: true},
		{name: "release", mt: dhcpv4.MessageTypeRelease, mac: ordinaryMAC, setup: grant(ordinaryMAC, "10.8.0.103"),
			mods: []dhcpv4.Modifier{server, dhcpv4.WithClientIP(net.ParseIP("10.8.0.103"))}, want: Released},
		{name: "decline", mt: dhcpv4.MessageTypeDecline, mac: ordinaryMAC,
			mods: []dhcpv4.Modifier{server, requested("10.8.0.100")}, want: Declined},
		{name: "inform", mt: dhcpv4.MessageTypeInform, mac: ordinaryMAC,
			mods: []dhcpv4.Modifier{dhcpv4.WithClientIP(net.ParseIP("10.8.0.77"))}, want: Informed, wantYI: "0.0.0.0"},
		{name: "client not allowed an address", mt: dhcpv4.MessageTypeDiscover, mac: strangerMAC, want: IgnoredUnknown},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, _ := newFull(t, "10.8.0.100-10.8.0.110")
			if tc.setup != nil {
				tc.setup(t, f)
			}
			r, o, err := reply(t, f, tc.mt, tc.mac, tc.mods...)
			if o != tc.want || (err != nil) != tc.wantErr {
				t.Fatalf("outcome %s err %v, want %s (error: %v)", o, err, tc.want, tc.wantErr)
			}
			switch o {
			case Acked, Offered, Informed:
				if r.YourIPAddr.String() != tc.wantYI {
					t.Errorf("yiaddr %v, want %s", r.YourIPAddr, tc.wantYI)
				}
				if o == Informed && (r.IPAddressLeaseTime(0) != 0 || !r.ClientIPAddr.Equal(net.ParseIP("10.8.0.77"))) {
					t.Errorf("inform ACK must carry no lease and echo ciaddr: %s", r.Summary())
				}
			case Nacked:
				if r.MessageType() != dhcpv4.MessageTypeNak || !r.YourIPAddr.IsUnspecified() {
					t.Errorf("not a NAK: %s", r.Summary())
				}
			default:
				if r != nil {
					t.Errorf("outcome %s with a reply: %s", o, r.Summary())
				}
			}
		})
	}
}

func grant(mac net.HardwareAddr, ip string) func(*testing.T, *Full) {
	return func(t *testing.T, f *Full) {
		t.Helper()
		_, seq, err := f.cfg.Networks[0].Leases.GrantBuffered(mac.String(), netip.MustParseAddr(ip), time.Hour)
		if err == nil {
			err = f.cfg.Networks[0].Leases.Sync(seq)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestFullDeclineAndRelease(t *testing.T) {
	f, _ := newFull(t, "10.8.0.100-10.8.0.101")
	if _, o, _ := reply(t, f, dhcpv4.MessageTypeDecline, ordinaryMAC, server, requested("10.8.0.100")); o != Declined {
		t.Fatalf("decline: %s", o)
	}
	if offer, _, _ := reply(t, f, dhcpv4.MessageTypeDiscover, otherMAC); offer.YourIPAddr.String() != "10.8.0.101" {
		t.Errorf("declined address offered again at once: %v", offer.YourIPAddr)
	}
}

func TestFullRelay(t *testing.T) {
	f := remoteFull(t)
	relayed := []dhcpv4.Modifier{dhcpv4.WithRelay(relayIP), dhcpv4.WithGeneric(dhcpv4.OptionRelayAgentInformation, circuitID)}
	offer, _, err := reply(t, f, dhcpv4.MessageTypeDiscover, ordinaryMAC, relayed...)
	if err != nil || !offer.GatewayIPAddr.Equal(relayIP) || !bytes.Equal(offer.GetOneOption(dhcpv4.OptionRelayAgentInformation), circuitID) {
		t.Fatalf("relayed offer: %v %v", err, offer)
	}
	nak, o, _ := reply(t, f, dhcpv4.MessageTypeRequest, ordinaryMAC, append(relayed, requested("192.168.0.1"))...)
	if o != Nacked || !nak.IsBroadcast() || !bytes.Equal(nak.GetOneOption(dhcpv4.OptionRelayAgentInformation), circuitID) {
		t.Errorf("relayed NAK must set the broadcast flag and keep option 82: %s %v", o, nak)
	}
	if d := Destination(request(t, dhcpv4.MessageTypeDiscover, relayed...), offer, PortDHCP, nil); d.String() != "10.9.0.1:67" {
		t.Errorf("relayed reply goes to %v, want the relay's port 67", d)
	}
}

func TestDestination(t *testing.T) {
	peer := &net.UDPAddr{IP: net.IPv4(10, 8, 0, 5), Port: 4011}
	ack := request(t, dhcpv4.MessageTypeAck)
	nak := request(t, dhcpv4.MessageTypeNak)
	renew := request(t, dhcpv4.MessageTypeRequest, dhcpv4.WithClientIP(net.IPv4(10, 8, 0, 5)))
	fresh := request(t, dhcpv4.MessageTypeDiscover)
	tests := []struct {
		name       string
		req, reply *dhcpv4.DHCPv4
		port       int
		want       string
	}{
		{"client without an address: broadcast", fresh, ack, PortDHCP, "255.255.255.255:68"},
		{"renewing client: unicast", renew, ack, PortDHCP, "10.8.0.5:68"},
		{"NAK: always broadcast", renew, nak, PortDHCP, "255.255.255.255:68"},
		{"boot-server port: back to the sender", renew, ack, PortPXE, "10.8.0.5:4011"},
	}
	for _, tc := range tests {
		if got := Destination(tc.req, tc.reply, tc.port, peer).String(); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}

// A server whose pool is on its own link does not answer relays from
// other networks, and one whose pool is behind a relay answers only that
// relay.
func TestFullNetworks(t *testing.T) {
	tests := []struct {
		name   string
		full   func(*testing.T) *Full
		mods   []dhcpv4.Modifier
		want   Outcome
		wantYI string
	}{
		{"local pool, relay from elsewhere", func(t *testing.T) *Full { f, _ := newFull(t, "10.8.0.100-10.8.0.110"); return f },
			[]dhcpv4.Modifier{dhcpv4.WithRelay(net.IPv4(192, 168, 7, 1))}, IgnoredOtherNetwork, ""},
		{"remote pool, its relay", remoteFull, []dhcpv4.Modifier{dhcpv4.WithRelay(relayIP)}, Offered, "10.9.0.100"},
		{"remote pool, a local client", remoteFull, nil, IgnoredOtherNetwork, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, o, err := reply(t, tc.full(t), dhcpv4.MessageTypeDiscover, ordinaryMAC, tc.mods...)
			if err != nil || o != tc.want {
				t.Fatalf("outcome %s %v, want %s", o, err, tc.want)
			}
			if tc.wantYI != "" && r.YourIPAddr.String() != tc.wantYI {
				t.Errorf("yiaddr %v, want %s", r.YourIPAddr, tc.wantYI)
			}
		})
	}
}

// remoteFull is a server whose pool, 10.9.0.100-110, is on the network of
// the relay at relayIP (10.9.0.1).
func remoteFull(t *testing.T) *Full {
	t.Helper()
	p, _ := lease.ParsePool("10.9.0.100-10.9.0.110")
	store, err := lease.Open(t.TempDir(), []lease.Network{{Pool: p}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	f, err := NewFull(FullConfig{Boot: testConfig(), AllowAddress: func(net.HardwareAddr) bool { return true },
		Networks: []Network{{Subnet: netip.MustParsePrefix("10.9.0.0/24"), Leases: store.Network(0)}}, LeaseTime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// multiFull serves three networks from one store: the server's own link
// 10.8.0.0/24 and, behind relays, 10.9.0.0/24 (reserving 10.9.0.50 for
// knownMAC) and 10.10.0.0/16.
func multiFull(t *testing.T) (*Full, *lease.Store) {
	t.Helper()
	pool := func(s string) lease.Pool { p, _ := lease.ParsePool(s); return p }
	nets := []lease.Network{
		{Subnet: netip.MustParsePrefix("10.8.0.0/24"), Pool: pool("10.8.0.100-10.8.0.110")},
		{Subnet: netip.MustParsePrefix("10.9.0.0/24"), Pool: pool("10.9.0.100-10.9.0.110"),
			Reservations: map[string]netip.Addr{knownMAC.String(): netip.MustParseAddr("10.9.0.50")}},
		{Subnet: netip.MustParsePrefix("10.10.0.0/16"), Pool: pool("10.10.7.1-10.10.7.9")},
	}
	store, err := lease.Open(t.TempDir(), nets, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	cfg := FullConfig{Boot: testConfig(), AllowAddress: func(net.HardwareAddr) bool { return true }, LeaseTime: time.Hour}
	for i, n := range nets {
		cfg.Networks = append(cfg.Networks, Network{Subnet: n.Subnet, Leases: store.Network(i),
			Routers: []netip.Addr{n.Subnet.Addr().Next()}})
	}
	f, err := NewFull(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return f, store
}

// With several pools, a relayed request is answered from the pool of the
// relay's network, a local one from the pool of the server's link, and a
// relay from anywhere else is ignored.
func TestFullPools(t *testing.T) {
	relay := func(a, b, c, d byte) dhcpv4.Modifier { return dhcpv4.WithRelay(net.IPv4(a, b, c, d)) }
	tests := []struct {
		name       string
		mt         dhcpv4.MessageType
		mac        net.HardwareAddr
		mods       []dhcpv4.Modifier
		want       Outcome
		wantYI     string
		wantMask   string
		wantRouter string
	}{
		{"local", dhcpv4.MessageTypeDiscover, ordinaryMAC, nil, Offered, "10.8.0.100", "ffffff00", "10.8.0.1"},
		{"relay on the second network", dhcpv4.MessageTypeDiscover, ordinaryMAC, []dhcpv4.Modifier{relay(10, 9, 0, 1)}, Offered, "10.9.0.100", "ffffff00", "10.9.0.1"},
		{"relay on the third network", dhcpv4.MessageTypeDiscover, ordinaryMAC, []dhcpv4.Modifier{relay(10, 10, 200, 1)}, Offered, "10.10.7.1", "ffff0000", "10.10.0.1"},
		{"relay from an unknown network", dhcpv4.MessageTypeDiscover, ordinaryMAC, []dhcpv4.Modifier{relay(192, 168, 7, 1)}, IgnoredOtherNetwork, "", "", ""},
		{"reservation on its network", dhcpv4.MessageTypeDiscover, knownMAC, []dhcpv4.Modifier{relay(10, 9, 0, 1)}, Offered, "10.9.0.50", "ffffff00", "10.9.0.1"},
		{"reservation elsewhere does not count", dhcpv4.MessageTypeDiscover, knownMAC, nil, Offered, "10.8.0.100", "ffffff00", "10.8.0.1"},
		{"request for another network's address", dhcpv4.MessageTypeRequest, ordinaryMAC, []dhcpv4.Modifier{relay(10, 9, 0, 1), requested("10.8.0.105")}, Nacked, "", "", ""},
		{"request for its network's address", dhcpv4.MessageTypeRequest, ordinaryMAC, []dhcpv4.Modifier{relay(10, 10, 0, 9), requested("10.10.7.5")}, Acked, "10.10.7.5", "ffff0000", "10.10.0.1"},
		{"request for the pool of the link, relayed from elsewhere", dhcpv4.MessageTypeRequest, ordinaryMAC, []dhcpv4.Modifier{relay(10, 10, 0, 9), requested("10.8.0.105")}, Nacked, "", "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, _ := multiFull(t)
			r, o, err := reply(t, f, tc.mt, tc.mac, tc.mods...)
			if err != nil || o != tc.want {
				t.Fatalf("outcome %s %v, want %s", o, err, tc.want)
			}
			if tc.wantYI == "" {
				return
			}
			if r.YourIPAddr.String() != tc.wantYI || r.SubnetMask().String() != tc.wantMask || r.Router()[0].String() != tc.wantRouter {
				t.Errorf("yiaddr %v mask %v router %v, want %s %s %s", r.YourIPAddr, r.SubnetMask(), r.Router(), tc.wantYI, tc.wantMask, tc.wantRouter)
			}
		})
	}
}

// One client, three networks: a lease on each, in one journal.
func TestFullPoolsLeasesPerNetwork(t *testing.T) {
	f, store := multiFull(t)
	for _, gi := range []net.IP{nil, net.IPv4(10, 9, 0, 1), net.IPv4(10, 10, 0, 1)} {
		var mods []dhcpv4.Modifier
		if gi != nil {
			mods = append(mods, dhcpv4.WithRelay(gi))
		}
		offer, _, err := reply(t, f, dhcpv4.MessageTypeDiscover, ordinaryMAC, mods...)
		if err != nil {
			t.Fatal(err)
		}
		if _, o, err := reply(t, f, dhcpv4.MessageTypeRequest, ordinaryMAC, append(mods, server, requested(offer.YourIPAddr.String()))...); o != Acked {
			t.Fatalf("via %v: %s %v", gi, o, err)
		}
	}
	if got := len(store.Leases()); got != 3 {
		t.Errorf("%d leases, want one per network", got)
	}
}

// RFC 6842: a reply carries the client identifier the request had.
func TestReplyEchoesClientIdentifier(t *testing.T) {
	f, _ := newFull(t, "10.8.0.100-10.8.0.110")
	id := []byte{1, 0x52, 0x54, 0, 0, 0, 1}
	offer, _, err := reply(t, f, dhcpv4.MessageTypeDiscover, ordinaryMAC, dhcpv4.WithOption(dhcpv4.OptClientIdentifier(id)))
	if err != nil || !bytes.Equal(offer.GetOneOption(dhcpv4.OptionClientIdentifier), id) {
		t.Fatalf("offer %v (%v) does not echo option 61", offer, err)
	}
	if offer.OpCode != dhcpv4.OpcodeBootReply || offer.HWType != 1 || !offer.GatewayIPAddr.IsUnspecified() {
		t.Errorf("reply header: %s", offer.Summary())
	}
}

// Decide applies a grant at once but leaves it to the caller to make it
// durable before the ACK leaves: Reply does, a server answering a batch
// does it once for the batch.
func TestDecideCommit(t *testing.T) {
	dir := t.TempDir()
	pool, _ := lease.ParsePool("10.8.0.100-10.8.0.110")
	store, err := lease.Open(dir, []lease.Network{{Pool: pool}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	f, err := NewFull(FullConfig{Boot: testConfig(), AllowAddress: func(net.HardwareAddr) bool { return true },
		Networks: []Network{{Subnet: netip.MustParsePrefix("10.8.0.0/24"), Leases: store.Network(0)}}, LeaseTime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	durable := func(mac net.HardwareAddr) bool {
		t.Helper()
		// What a restart would read: a copy of the journal as it is now.
		data, _ := os.ReadFile(filepath.Join(dir, "leases.jsonl"))
		copyDir := t.TempDir()
		if err := os.WriteFile(filepath.Join(copyDir, "leases.jsonl"), data, 0o600); err != nil {
			t.Fatal(err)
		}
		r, err := lease.Open(copyDir, []lease.Network{{Pool: pool}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		_, ok := r.Lookup(mac.String())
		return ok
	}

	d, err := f.Decide(request(t, dhcpv4.MessageTypeDiscover, append(pxe(iana.EFI_X86_64), dhcpv4.WithHwAddr(knownMAC))...), PortDHCP)
	if err != nil || d.Outcome != Offered || d.Commit != 0 || !d.Netboot || d.Client.Firmware != UEFI {
		t.Fatalf("offer: %+v %v: want an offer to a UEFI netboot client that waits for nothing", d, err)
	}
	d, err = f.Decide(request(t, dhcpv4.MessageTypeRequest, dhcpv4.WithHwAddr(ordinaryMAC), server, requested("10.8.0.105")), PortDHCP)
	if err != nil || d.Outcome != Acked || d.Commit == 0 || d.Netboot {
		t.Fatalf("request: %+v %v: want an ACK to a plain client that waits for a commit", d, err)
	}
	if _, ok := store.Lookup(ordinaryMAC.String()); !ok {
		t.Error("grant not applied before its commit")
	}
	if durable(ordinaryMAC) {
		t.Error("grant durable before Sync: the test cannot tell Decide from Reply")
	}
	if err := store.Sync(d.Commit); err != nil {
		t.Fatal(err)
	}
	if !durable(ordinaryMAC) {
		t.Error("grant not durable after Sync(d.Commit)")
	}
}
