package dhcp

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"

	"cozy.dev/cozy/pxe/lease"
)

// Leases is the lease state full mode needs; *lease.Store implements it.
// Changes are applied at once and durable after Sync of the position they
// return (see Decision.Commit).
type Leases interface {
	Offer(mac string, requested netip.Addr) (netip.Addr, error)
	GrantBuffered(mac string, ip netip.Addr, d time.Duration) (lease.Lease, lease.Seq, error)
	ReleaseBuffered(mac string, ip netip.Addr) lease.Seq
	DeclineBuffered(mac string, ip netip.Addr) lease.Seq
	Sync(lease.Seq) error
}

// Network is one network full mode hands out addresses on: the server's
// own link (requests not relayed are answered from it) or a network
// behind a relay agent (requests relayed from an address in it are).
type Network struct {
	// Subnet is the network; its mask goes to clients, and requests for
	// addresses outside it are refused with DHCPNAK.
	Subnet  netip.Prefix
	Routers []netip.Addr
	DNS     []netip.Addr
	// Leases is the network's pool (lease.Store.Network(i)).
	Leases Leases
}

// FullConfig configures the server as the DHCP server of one or more
// networks.
type FullConfig struct {
	// Boot is the boot information, as for proxy mode; Boot.Allow decides
	// who gets it.
	Boot Config
	// AllowAddress decides who gets an address at all (PXE client or
	// not). Nil gives nobody one.
	AllowAddress func(mac net.HardwareAddr) bool
	// Networks are the networks served; their subnets must not overlap,
	// which lease.CheckNetworks checks for the store their Leases share.
	Networks  []Network
	LeaseTime time.Duration
}

// Full answers DHCP as the networks' only DHCP server: addresses from a
// pool, plus boot information for netboot clients.
type Full struct {
	cfg   FullConfig
	proxy *Proxy
	nets  []*fullNetwork
}

type fullNetwork struct {
	Network
	opts networkOptions
}

// networkOptions are the options every OFFER and ACK on a network
// carries, in wire form, encoded once: replies share them (nothing changes
// an option's bytes once set).
type networkOptions struct {
	offer, ack, serverID, mask, routers, dns, leaseTime, renew, rebind []byte
}

func newNetworkOptions(serverID net.IP, n Network, leaseTime time.Duration) networkOptions {
	enc := func(o dhcpv4.Option) []byte { return o.Value.ToBytes() }
	o := networkOptions{
		offer:     []byte{byte(dhcpv4.MessageTypeOffer)},
		ack:       []byte{byte(dhcpv4.MessageTypeAck)},
		serverID:  enc(dhcpv4.OptServerIdentifier(serverID)),
		mask:      enc(dhcpv4.OptSubnetMask(net.CIDRMask(n.Subnet.Bits(), 32))),
		leaseTime: enc(dhcpv4.OptIPAddressLeaseTime(leaseTime)),
		renew:     enc(dhcpv4.OptRenewTimeValue(leaseTime / 2)),
		rebind:    enc(dhcpv4.OptRebindingTimeValue(leaseTime * 7 / 8)),
	}
	if len(n.Routers) > 0 {
		o.routers = enc(dhcpv4.OptRouter(ips(n.Routers)...))
	}
	if len(n.DNS) > 0 {
		o.dns = enc(dhcpv4.OptDNS(ips(n.DNS)...))
	}
	return o
}

// NewFull checks cfg and returns a Full.
func NewFull(cfg FullConfig) (*Full, error) {
	proxy, err := NewProxy(cfg.Boot)
	if err != nil {
		return nil, err
	}
	if cfg.LeaseTime < time.Minute {
		return nil, fmt.Errorf("lease time %v: at least a minute", cfg.LeaseTime)
	}
	nets := cfg.Networks
	if len(nets) == 0 {
		return nil, errors.New("full mode needs an address pool")
	}
	f := &Full{cfg: cfg, proxy: proxy}
	for _, n := range nets {
		if !n.Subnet.IsValid() || !n.Subnet.Addr().Is4() {
			return nil, fmt.Errorf("subnet %v: need the IPv4 network the pool belongs to", n.Subnet)
		}
		if n.Leases == nil {
			return nil, fmt.Errorf("network %s has no lease store", n.Subnet)
		}
		f.nets = append(f.nets, &fullNetwork{Network: n, opts: newNetworkOptions(proxy.serverIP(), n, cfg.LeaseTime)})
	}
	return f, nil
}

// network is the network a request is for: the one a relay's giaddr is
// in; without a relay, the server's own link. Nil: none served here.
func (f *Full) network(req *dhcpv4.DHCPv4) *fullNetwork {
	at := addrOf(req.GatewayIPAddr)
	if !at.IsValid() {
		at = f.cfg.Boot.ServerIP
	}
	for _, n := range f.nets {
		if n.Subnet.Contains(at) {
			return n
		}
	}
	return nil
}

// Outcomes only full mode has.
const (
	IgnoredOtherNetwork Outcome = "ignored-other-network"
	Nacked              Outcome = "nak"
	Released            Outcome = "release"
	Declined            Outcome = "decline"
	Informed            Outcome = "inform"
)

// Reply computes the answer to req received on port. Lease changes are
// durable before Reply returns a DHCPACK.
func (f *Full) Reply(req *dhcpv4.DHCPv4, port int) (*dhcpv4.DHCPv4, Outcome, error) {
	d, n, err := f.decide(req, port)
	if err == nil && d.Commit != 0 {
		if err := n.Leases.Sync(d.Commit); err != nil {
			// Could not make the lease durable: say nothing rather than
			// ACK something a restart would forget.
			return nil, Rejected, fmt.Errorf("%s from %s: %w", req.MessageType(), req.ClientHWAddr, err)
		}
	}
	return d.Reply, d.Outcome, err
}

// Decide computes the answer to req received on port. Lease changes are
// applied but not yet durable: d.Reply may leave only after
// Leases.Sync(d.Commit), which lets a server answer a batch of requests
// with one journal write and one fdatasync.
func (f *Full) Decide(req *dhcpv4.DHCPv4, port int) (Decision, error) {
	d, _, err := f.decide(req, port)
	return d, err
}

// decide is Decide, also naming the network whose leases d.Commit is a
// position of (nil if none).
func (f *Full) decide(req *dhcpv4.DHCPv4, port int) (Decision, *fullNetwork, error) {
	if req.OpCode != dhcpv4.OpcodeBootRequest {
		return Decision{Outcome: IgnoredType, RequestType: messageType(req)}, nil, nil
	}
	client, classifyErr := Classify(req)
	if port == PortPXE {
		d, err := f.proxy.decide(req, port, client, classifyErr)
		return d, nil, err
	}
	d := Decision{RequestType: messageType(req), Client: client, Netboot: classifyErr == nil}
	d.Outcome = IgnoredType
	if req.HWType != iana.HWTypeEthernet || len(req.ClientHWAddr) != 6 {
		return d, nil, nil
	}
	n := f.network(req)
	if n == nil {
		d.Outcome = IgnoredOtherNetwork
		return d, nil, nil
	}
	d, err := f.decideOn(n, req, d)
	return d, n, err
}

// decideOn answers a request for network n.
func (f *Full) decideOn(n *fullNetwork, req *dhcpv4.DHCPv4, d Decision) (Decision, error) {
	mac := req.ClientHWAddr
	if f.cfg.AllowAddress == nil || !f.cfg.AllowAddress(mac) {
		d.Outcome = IgnoredUnknown
		return d, nil
	}
	switch d.RequestType {
	case dhcpv4.MessageTypeDiscover:
		ip, err := n.Leases.Offer(mac.String(), optAddr(req, dhcpv4.OptionRequestedIPAddress))
		if err != nil {
			d.Outcome = Rejected
			return d, fmt.Errorf("offer to %s on %s: %w", mac, n.Subnet, err)
		}
		return f.answer(n, req, d, dhcpv4.MessageTypeOffer, ip, Offered)
	case dhcpv4.MessageTypeRequest:
		return f.request(n, req, d)
	case dhcpv4.MessageTypeDecline:
		ip := optAddr(req, dhcpv4.OptionRequestedIPAddress)
		if !f.ours(req) || !ip.IsValid() {
			d.Outcome = IgnoredOtherHost
			return d, nil
		}
		d.Outcome, d.Commit = Declined, n.Leases.DeclineBuffered(mac.String(), ip)
		return d, nil
	case dhcpv4.MessageTypeRelease:
		ip := addrOf(req.ClientIPAddr)
		if !f.ours(req) || !ip.IsValid() {
			d.Outcome = IgnoredOtherHost
			return d, nil
		}
		d.Outcome, d.Commit = Released, n.Leases.ReleaseBuffered(mac.String(), ip)
		return d, nil
	case dhcpv4.MessageTypeInform:
		// Configuration only: the client has its address already.
		return f.answer(n, req, d, dhcpv4.MessageTypeAck, netip.Addr{}, Informed)
	default:
		return d, nil
	}
}

// ours reports whether a message that names a server names this one.
func (f *Full) ours(req *dhcpv4.DHCPv4) bool {
	sid, ok := optIPv4(req, dhcpv4.OptionServerIdentifier)
	return !ok || netip.AddrFrom4(sid) == f.cfg.Boot.ServerIP
}

// request handles the three kinds of DHCPREQUEST (RFC 2131 4.3.2).
func (f *Full) request(n *fullNetwork, req *dhcpv4.DHCPv4, d Decision) (Decision, error) {
	requested := optAddr(req, dhcpv4.OptionRequestedIPAddress)
	var want netip.Addr
	switch {
	case hasIPv4(req, dhcpv4.OptionServerIdentifier): // SELECTING an offer
		if !f.ours(req) {
			d.Outcome = IgnoredOtherHost // it chose another server
			return d, nil
		}
		want = requested
	case requested.IsValid(): // INIT-REBOOT: confirming an address it had
		want = requested
	default: // RENEWING or REBINDING
		want = addrOf(req.ClientIPAddr)
	}
	if !want.IsValid() {
		d.Outcome = Rejected
		return d, fmt.Errorf("request from %s names no address", req.ClientHWAddr)
	}
	if !n.Subnet.Contains(want) {
		return f.nak(req, d, fmt.Sprintf("%s is not on this network", want))
	}
	l, seq, err := n.Leases.GrantBuffered(req.ClientHWAddr.String(), want, f.cfg.LeaseTime)
	switch {
	case errors.Is(err, lease.ErrTaken), errors.Is(err, lease.ErrOutOfPool):
		return f.nak(req, d, err.Error())
	case err != nil:
		d.Outcome = Rejected
		return d, fmt.Errorf("grant %s to %s: %w", want, req.ClientHWAddr, err)
	}
	d.Commit = seq
	return f.answer(n, req, d, dhcpv4.MessageTypeAck, l.IP, Acked)
}

func (f *Full) nak(req *dhcpv4.DHCPv4, d Decision, why string) (Decision, error) {
	d.Reply = newReply(req,
		dhcpv4.WithMessageType(dhcpv4.MessageTypeNak),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(f.proxy.serverIP())),
		dhcpv4.WithOption(dhcpv4.OptMessage(why)),
	)
	if addrOf(req.GatewayIPAddr).IsValid() {
		d.Reply.SetBroadcast() // RFC 2131 4.3.2: the relay must broadcast a NAK
	}
	d.Outcome = Nacked
	return d, nil
}

// answer builds an OFFER or ACK for ip (zero for INFORM) with the network
// options and, for allowed netboot clients, the boot information.
func (f *Full) answer(on *fullNetwork, req *dhcpv4.DHCPv4, d Decision, mt dhcpv4.MessageType, ip netip.Addr, outcome Outcome) (Decision, error) {
	reply := newReply(req)
	o, n := reply.Options, &on.opts
	o[dhcpv4.OptionDHCPMessageType.Code()] = n.ack
	if mt == dhcpv4.MessageTypeOffer {
		o[dhcpv4.OptionDHCPMessageType.Code()] = n.offer
	}
	o[dhcpv4.OptionServerIdentifier.Code()] = n.serverID
	o[dhcpv4.OptionSubnetMask.Code()] = n.mask
	if n.routers != nil {
		o[dhcpv4.OptionRouter.Code()] = n.routers
	}
	if n.dns != nil {
		o[dhcpv4.OptionDomainNameServer.Code()] = n.dns
	}
	if ip.IsValid() {
		reply.YourIPAddr = net.IP(ip.AsSlice())
		o[dhcpv4.OptionIPAddressLeaseTime.Code()] = n.leaseTime
		o[dhcpv4.OptionRenewTimeValue.Code()] = n.renew
		o[dhcpv4.OptionRebindingTimeValue.Code()] = n.rebind
	} else {
		reply.ClientIPAddr = req.ClientIPAddr
	}
	var mods []dhcpv4.Modifier
	if d.Netboot && f.cfg.Boot.Allow != nil && f.cfg.Boot.Allow(d.Client) {
		boot, err := f.proxy.bootMods(req, d.Client)
		if err != nil {
			d.Outcome = Rejected
			return d, err
		}
		mods = append(mods, boot...)
		if d.Client.IPXE {
			// iPXE takes an offer saying PXEClient for a ProxyDHCP
			// server's too, and after the ACK asks it again on port 4011,
			// waiting 1+2+4+8 s for an answer. The file name is all it
			// needs from this server.
			mods = append(mods, func(d *dhcpv4.DHCPv4) { d.Options.Del(dhcpv4.OptionClassIdentifier) })
		}
	}
	for _, m := range mods {
		m(reply)
	}
	d.Reply, d.Outcome = reply, outcome
	return d, nil
}

// messageType is m's option 53, read without the allocations of
// m.MessageType().
func messageType(m *dhcpv4.DHCPv4) dhcpv4.MessageType {
	if v := m.Options[dhcpv4.OptionDHCPMessageType.Code()]; len(v) == 1 {
		return dhcpv4.MessageType(v[0])
	}
	return dhcpv4.MessageTypeNone
}

// optIPv4 reads an IPv4 address option of m as dhcpv4.GetIP does (four
// bytes, else none), without its allocations.
func optIPv4(m *dhcpv4.DHCPv4, code dhcpv4.OptionCode) ([4]byte, bool) {
	v := m.Options[code.Code()]
	if len(v) != 4 {
		return [4]byte{}, false
	}
	return [4]byte(v), true
}

func hasIPv4(m *dhcpv4.DHCPv4, code dhcpv4.OptionCode) bool {
	_, ok := optIPv4(m, code)
	return ok
}

// optAddr is an IPv4 address option of m; the zero Addr if it is missing,
// malformed or 0.0.0.0.
func optAddr(m *dhcpv4.DHCPv4, code dhcpv4.OptionCode) netip.Addr {
	if v, ok := optIPv4(m, code); ok && v != [4]byte{} {
		return netip.AddrFrom4(v)
	}
	return netip.Addr{}
}

func addrOf(ip net.IP) netip.Addr {
	a, ok := netip.AddrFromSlice(ip.To4())
	if !ok || a.IsUnspecified() {
		return netip.Addr{}
	}
	return a
}

func ips(addrs []netip.Addr) []net.IP {
	out := make([]net.IP, len(addrs))
	for i, a := range addrs {
		out[i] = net.IP(a.AsSlice())
	}
	return out
}

// Destination is where a reply to req, received on port from peer, must
// go (RFC 2131 4.1): to the relay agent if there is one; to the client's
// address if it has one and this is no NAK; else broadcast on the link.
func Destination(req, reply *dhcpv4.DHCPv4, port int, peer *net.UDPAddr) *net.UDPAddr {
	switch {
	case addrOf(req.GatewayIPAddr).IsValid():
		return &net.UDPAddr{IP: req.GatewayIPAddr, Port: dhcpv4.ServerPort}
	case port == PortPXE:
		return peer
	case messageType(reply) != dhcpv4.MessageTypeNak && addrOf(req.ClientIPAddr).IsValid():
		return &net.UDPAddr{IP: req.ClientIPAddr, Port: dhcpv4.ClientPort}
	default:
		return &net.UDPAddr{IP: net.IPv4bcast, Port: dhcpv4.ClientPort}
	}
}
