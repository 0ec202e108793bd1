package dhcp

import (
	"bytes"
	"net"
	"strings"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"
)

func TestAppendPacketIsToBytes(t *testing.T) {
	long := bytes.Repeat([]byte("x"), 600) // split into three options
	for name, m := range map[string]*dhcpv4.DHCPv4{
		"discover": request(t, dhcpv4.MessageTypeDiscover),
		"pxe":      request(t, dhcpv4.MessageTypeRequest, pxe(iana.EFI_X86_64)...),
		"relayed":  request(t, dhcpv4.MessageTypeDiscover, dhcpv4.WithRelay(relayIP), dhcpv4.WithGeneric(dhcpv4.OptionRelayAgentInformation, circuitID)),
		"long":     request(t, dhcpv4.MessageTypeOffer, dhcpv4.WithGeneric(dhcpv4.OptionVendorSpecificInformation, long), dhcpv4.WithGeneric(dhcpv4.OptionDomainName, nil)),
		"long name": request(t, dhcpv4.MessageTypeOffer, func(d *dhcpv4.DHCPv4) {
			d.BootFileName = strings.Repeat("f", 200)
			d.ServerHostName = strings.Repeat("s", 80)
		}),
		"nil ips": {OpCode: dhcpv4.OpcodeBootReply, ClientHWAddr: net.HardwareAddr{1, 2, 3, 4, 5, 6}, Options: dhcpv4.Options{}},
	} {
		want := m.ToBytes()
		if got := AppendPacket([]byte("prefix"), m); !bytes.Equal(got[6:], want) || string(got[:6]) != "prefix" {
			t.Errorf("%s: AppendPacket differs from ToBytes:\n got %x\nwant %x", name, got[6:], want)
		}
	}
}
