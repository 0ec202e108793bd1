package dhcp

import (
	"bytes"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"
)

// FuzzReply feeds arbitrary datagrams through parsing and the proxy: no
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
	f.Fuzz(func(t *testing.T, datagram []byte) {
		req, err := dhcpv4.FromBytes(datagram)
		if err != nil {
			return
		}
		for _, port := range []int{PortDHCP, PortPXE} {
			reply, outcome, err := p.Reply(req, port)
			if reply == nil {
				if (outcome == Offered || outcome == Acked) || (outcome == Rejected) != (err != nil) {
					t.Fatalf("outcome %s with err %v and no reply", outcome, err)
				}
				continue
			}
			got, err := dhcpv4.FromBytes(reply.ToBytes())
			if err != nil {
				t.Fatalf("reply (%s) does not parse: %v", outcome, err)
			}
			if got.TransactionID != req.TransactionID || !bytes.Equal(got.ClientHWAddr, req.ClientHWAddr) {
				t.Fatalf("reply answers someone else: %s", got.Summary())
			}
			if !got.YourIPAddr.IsUnspecified() {
				t.Fatalf("proxy handed out %v", got.YourIPAddr)
			}
		}
	})
}
