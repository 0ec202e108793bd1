package dhcp

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"

	"cozy.dev/cozy/pxe/lease"
)

// BenchmarkFullDORA is one client's DISCOVER and REQUEST through full mode
// with a real lease store on disk (one fsync per lease), wire format
// included: the server's cost per lease without sockets.
func BenchmarkFullDORA(b *testing.B) {
	pool, _ := lease.ParsePool("10.8.0.1-10.8.255.254")
	store, err := lease.Open(b.TempDir(), pool, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	f, err := NewFull(FullConfig{
		Boot: testConfig(), AllowAddress: func(net.HardwareAddr) bool { return true }, Leases: store,
		Subnet: netip.MustParsePrefix("10.8.0.0/16"), LeaseTime: time.Hour,
	})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		mac := net.HardwareAddr{0x52, 0x54, 0, byte(i >> 16), byte(i >> 8), byte(i)}
		disc, _ := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeDiscover), dhcpv4.WithHwAddr(mac))
		req, _ := dhcpv4.FromBytes(disc.ToBytes())
		offer, _, err := f.Reply(req, PortDHCP)
		if err != nil {
			b.Fatal(err)
		}
		_ = offer.ToBytes()
		r, _ := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest), dhcpv4.WithHwAddr(mac),
			dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.IP(serverIP.AsSlice()))),
			dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(offer.YourIPAddr)))
		req, _ = dhcpv4.FromBytes(r.ToBytes())
		ack, o, err := f.Reply(req, PortDHCP)
		if err != nil || o != Acked {
			b.Fatal(o, err)
		}
		_ = ack.ToBytes()
	}
}
