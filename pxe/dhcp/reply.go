package dhcp

import (
	"net"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// newReply starts a reply to req as dhcpv4.NewReplyFromRequest does: same
// transaction, client and flags; giaddr kept and option 82 echoed
// unchanged (RFC 3046 2.2); the client identifier copied (RFC 6842). It
// skips the random transaction ID that function draws only to overwrite
// it, which costs a system call per packet.
func newReply(req *dhcpv4.DHCPv4, mods ...dhcpv4.Modifier) *dhcpv4.DHCPv4 {
	giaddr := req.GatewayIPAddr
	if giaddr == nil {
		giaddr = net.IPv4zero
	}
	d := &dhcpv4.DHCPv4{
		OpCode:        dhcpv4.OpcodeBootReply,
		HWType:        req.HWType,
		ClientHWAddr:  req.ClientHWAddr,
		TransactionID: req.TransactionID,
		Flags:         req.Flags,
		ClientIPAddr:  net.IPv4zero,
		YourIPAddr:    net.IPv4zero,
		ServerIPAddr:  net.IPv4zero,
		GatewayIPAddr: giaddr,
		Options:       make(dhcpv4.Options, 8),
	}
	// Shared with the request, which nobody changes.
	for _, code := range []uint8{dhcpv4.OptionRelayAgentInformation.Code(), dhcpv4.OptionClientIdentifier.Code()} {
		if v, ok := req.Options[code]; ok {
			d.Options[code] = v
		}
	}
	for _, m := range mods {
		m(d)
	}
	return d
}
