package dhcp

import (
	"encoding/binary"
	"net"
	"slices"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// AppendPacket appends m in wire format to b, exactly as m.ToBytes()
// writes it (options in code order, option 82 last, long options split,
// padded to BOOTP's 300 bytes), but into the caller's buffer, so a server
// can reuse one per datagram.
func AppendPacket(b []byte, m *dhcpv4.DHCPv4) []byte {
	start := len(b)
	b = append(b, byte(m.OpCode), byte(m.HWType), byte(len(m.ClientHWAddr)), m.HopCount)
	b = append(b, m.TransactionID[:]...)
	b = binary.BigEndian.AppendUint16(b, m.NumSeconds)
	b = binary.BigEndian.AppendUint16(b, m.Flags)
	for _, ip := range []net.IP{m.ClientIPAddr, m.YourIPAddr, m.ServerIPAddr, m.GatewayIPAddr} {
		var a [4]byte
		copy(a[:], ip.To4())
		b = append(b, a[:]...)
	}
	b = appendField(b, m.ClientHWAddr, 16, 16)
	b = appendField(b, []byte(m.ServerHostName), 63, 64)
	b = appendField(b, []byte(m.BootFileName), 127, 128)
	b = append(b, 99, 130, 83, 99) // the magic cookie

	const agentInfo, end = 82, 255
	var codes [256]uint8
	n := 0
	for c := range m.Options {
		if c != agentInfo && c != end && c != 0 {
			codes[n] = c
			n++
		}
	}
	slices.Sort(codes[:n])
	if _, ok := m.Options[agentInfo]; ok {
		codes[n] = agentInfo
		n++
	}
	for _, c := range codes[:n] {
		data := m.Options[c]
		if len(data) == 0 {
			b = append(b, c, 0)
		}
		for len(data) > 0 {
			l := min(len(data), 255)
			b = append(append(b, c, byte(l)), data[:l]...)
			data = data[l:]
		}
	}
	b = append(b, end)
	for len(b)-start < 300 {
		b = append(b, 0)
	}
	return b
}

// appendField appends at most max bytes of v, zero-padded to size.
func appendField(b, v []byte, max, size int) []byte {
	v = v[:min(len(v), max)]
	b = append(b, v...)
	for range size - len(v) {
		b = append(b, 0)
	}
	return b
}
