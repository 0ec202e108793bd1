package dhcp

import (
	"bytes"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"

	"cozy.dev/cozy/pxe/lease"
)

// BenchmarkFullDORA is one client's DISCOVER and REQUEST through full mode
// with a real lease store on disk (one fdatasync per lease), wire format
// both ways (replies encoded into one reused buffer, as the server does):
// the server's cost per lease without sockets. The clients'
// packets are templates with the MAC and address patched in, so their
// making costs next to nothing.
func BenchmarkFullDORA(b *testing.B) {
	f, dora := benchFull(b)
	var wire []byte
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		disc, req := dora(i)
		offer, _, err := f.Reply(parse(b, disc), PortDHCP)
		if err != nil {
			b.Fatal(err)
		}
		wire = AppendPacket(wire[:0], offer)
		copy(req[reqIPAt:], offer.YourIPAddr.To4())
		ack, o, err := f.Reply(parse(b, req), PortDHCP)
		if err != nil || o != Acked {
			b.Fatal(o, err)
		}
		wire = AppendPacket(wire[:0], ack)
	}
}

// BenchmarkFullDORABatch is the same answered as the server answers a
// burst: 64 DISCOVERs, their 64 REQUESTs, one Sync for the batch. An op
// is still one lease.
func BenchmarkFullDORABatch(b *testing.B) {
	const batch = 64
	f, dora := benchFull(b)
	store := f.cfg.Networks[0].Leases
	var wire []byte
	b.ReportAllocs()
	var reqs [][]byte
	for i := 0; b.Loop(); i++ {
		disc, req := dora(i)
		d, err := f.Decide(parse(b, disc), PortDHCP)
		if err != nil {
			b.Fatal(err)
		}
		wire = AppendPacket(wire[:0], d.Reply)
		copy(req[reqIPAt:], d.Reply.YourIPAddr.To4())
		if reqs = append(reqs, req); len(reqs) < batch {
			continue
		}
		var commit lease.Seq
		for _, req := range reqs {
			d, err := f.Decide(parse(b, req), PortDHCP)
			if err != nil || d.Outcome != Acked {
				b.Fatal(d.Outcome, err)
			}
			wire = AppendPacket(wire[:0], d.Reply)
			commit = d.Commit
		}
		if err := store.Sync(commit); err != nil {
			b.Fatal(err)
		}
		reqs = reqs[:0]
	}
}

// reqIPAt is where the requested address (option 50) sits in the REQUEST
// template.
var reqIPAt int

func benchFull(b *testing.B) (*Full, func(i int) (disc, req []byte)) {
	pool, _ := lease.ParsePool("10.0.0.1-10.255.255.254")
	store, err := lease.Open(b.TempDir(), []lease.Network{{Pool: pool}}, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { store.Close() })
	f, err := NewFull(FullConfig{
		Boot: testConfig(), AllowAddress: func(net.HardwareAddr) bool { return true }, LeaseTime: time.Hour,
		Networks: []Network{{Subnet: netip.MustParsePrefix("10.0.0.0/8"), Leases: store.Network(0),
			Routers: []netip.Addr{netip.MustParseAddr("10.8.0.254")}, DNS: []netip.Addr{netip.MustParseAddr("10.8.0.53")}}},
	})
	if err != nil {
		b.Fatal(err)
	}
	mac := net.HardwareAddr{0x52, 0x54, 0, 0, 0, 0}
	marker := net.IPv4(10, 99, 99, 99).To4()
	discT := request(b, dhcpv4.MessageTypeDiscover, dhcpv4.WithHwAddr(mac)).ToBytes()
	reqT := request(b, dhcpv4.MessageTypeRequest, dhcpv4.WithHwAddr(mac),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.IP(serverIP.AsSlice()))),
		dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(marker))).ToBytes()
	reqIPAt = bytes.Index(reqT, append([]byte{50, 4}, marker...)) + 2
	const chaddr = 28
	return f, func(i int) ([]byte, []byte) {
		disc, req := bytes.Clone(discT), bytes.Clone(reqT)
		for _, p := range [][]byte{disc, req} {
			p[chaddr+3], p[chaddr+4], p[chaddr+5] = byte(i>>16), byte(i>>8), byte(i)
		}
		return disc, req
	}
}

func parse(b *testing.B, p []byte) *dhcpv4.DHCPv4 {
	m, err := dhcpv4.FromBytes(p)
	if err != nil {
		b.Fatal(err)
	}
	return m
}
