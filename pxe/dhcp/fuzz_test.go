package dhcp

import (
	"bytes"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"

	"cozy.dev/cozy/pxe/lease"
)

// FuzzReply feeds arbitrary datagrams through parsing, the proxy and full
// mode (with a real lease store): no
// input may panic, and any reply must be a well-formed answer to its request.
func FuzzReply(f *testing.F) {
	seeds := [][]dhcpv4.Modifier{
		pxe(iana.INTEL_X86PC),
		pxe(iana.EFI_X86_64),
		pxe(iana.EFI_ARM64),
		with(pxe(iana.INTEL_X86PC), dhcpv4.WithGeneric(dhcpv4.OptionUserClassInformation, []byte("iPXE"))),
		with(pxe(iana.EFI_X86_64), dhcpv4.WithRelay(relayIP), dhcpv4.WithGeneric(dhcpv4.OptionRelayAgentInformation, circuitID)),
		{dhcpv4.WithOption(dhcpv4.OptClassIdentifier("HTTPClient:Arch:00016")), dhcpv4.WithOption(dhcpv4.OptClientArch(iana.EFI_X86_64_HTTP))},
		nil,
	}
	for _, mods := range seeds {
		for _, mt := range []dhcpv4.MessageType{dhcpv4.MessageTypeDiscover, dhcpv4.MessageTypeRequest} {
			f.Add(request(f, mt, mods...).ToBytes())
		}
	}
	f.Add([]byte{})
	f.Add(make([]byte, 240))

	cfg := testConfig()
	cfg.Allow = func(Client) bool { return true }
	p, err := NewProxy(cfg)
	if err != nil {
		f.Fatal(err)
	}
	pool, _ := lease.ParsePool("10.8.0.100-10.8.0.199")
	store, err := lease.Open(f.TempDir(), []lease.Network{{Pool: pool}}, nil)
	if err != nil {
		f.Fatal(err)
	}
	full, err := NewFull(FullConfig{
		Boot: cfg, AllowAddress: func(net.HardwareAddr) bool { return true }, LeaseTime: time.Hour,
		Networks: []Network{{Subnet: netip.MustParsePrefix("10.8.0.0/24"), Leases: store.Network(0)}},
	})
	if err != nil {
		f.Fatal(err)
	}
	type replier interface {
		Reply(*dhcpv4.DHCPv4, int) (*dhcpv4.DHCPv4, Outcome, error)
	}
	f.Fuzz(func(t *testing.T, datagram []byte) {
		req, err := dhcpv4.FromBytes(datagram)
		if err != nil {
			return
		}
		if d, _ := p.Decide(req, PortPXE); d.RequestType != req.MessageType() {
			t.Fatalf("decision says type %v, request has %v", d.RequestType, req.MessageType())
		}
		for i, port := range []int{PortDHCP, PortPXE, PortDHCP, PortPXE} {
			var r replier = p
			if i >= 2 {
				r = full
			}
			reply, outcome, err := r.Reply(req, port)
			if reply == nil {
				if (outcome == Offered || outcome == Acked) || (outcome == Rejected) != (err != nil) {
					t.Fatalf("outcome %s with err %v and no reply", outcome, err)
				}
				continue
			}
			wire := reply.ToBytes()
			if !bytes.Equal(AppendPacket(nil, reply), wire) {
				t.Fatalf("AppendPacket differs from ToBytes for %s", reply.Summary())
			}
			got, err := dhcpv4.FromBytes(wire)
			if err != nil {
				t.Fatalf("reply (%s) does not parse: %v", outcome, err)
			}
			if got.TransactionID != req.TransactionID || !bytes.Equal(got.ClientHWAddr, req.ClientHWAddr) {
				t.Fatalf("reply answers someone else: %s", got.Summary())
			}
			yi := addrOf(got.YourIPAddr)
			if r == p && yi.IsValid() {
				t.Fatalf("proxy handed out %v", yi)
			}
			if r == full && yi.IsValid() && !pool.Contains(yi) {
				t.Fatalf("full mode handed out %v, outside the pool", yi)
			}
		}
	})
}
