package dhcp

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"
)

var (
	serverIP  = netip.MustParseAddr("10.8.0.1")
	knownMAC  = net.HardwareAddr{0x52, 0x54, 0x00, 0x12, 0x34, 0x56}
	otherMAC  = net.HardwareAddr{0x52, 0x54, 0x00, 0xaa, 0xbb, 0xcc}
	guidOpt   = []byte{0, 0x78, 0x56, 0x34, 0x12, 0xbc, 0x9a, 0xf0, 0xde, 0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0}
	guidUUID  = "12345678-9abc-def0-1234-56789abcdef0"
	relayIP   = net.IPv4(10, 9, 0, 1)
	circuitID = []byte{1, 4, 'e', 't', 'h', '7'}
)

func testConfig() Config {
	return Config{
		ServerIP: serverIP,
		HTTPPort: 8080,
		Files:    BootFiles{BIOS: "undionly.kpxe", UEFIAMD64: "ipxe.efi", UEFIARM64: "ipxe-arm64.efi"},
		Allow:    func(c Client) bool { return bytes.Equal(c.MAC, knownMAC) },
	}
}

// request builds a client packet and sends it through the wire format, as
// the server receives it.
func request(t testing.TB, mt dhcpv4.MessageType, mods ...dhcpv4.Modifier) *dhcpv4.DHCPv4 {
	t.Helper()
	base := []dhcpv4.Modifier{
		dhcpv4.WithMessageType(mt),
		dhcpv4.WithHwAddr(knownMAC),
		dhcpv4.WithTransactionID(dhcpv4.TransactionID{1, 2, 3, 4}),
		dhcpv4.WithBroadcast(true),
	}
	req, err := dhcpv4.New(append(base, mods...)...)
	if err != nil {
		t.Fatal(err)
	}
	wire, err := dhcpv4.FromBytes(req.ToBytes())
	if err != nil {
		t.Fatalf("request does not survive the wire: %v", err)
	}
	return wire
}

func pxe(arch iana.Arch) []dhcpv4.Modifier {
	return []dhcpv4.Modifier{
		dhcpv4.WithOption(dhcpv4.OptClassIdentifier(fmt.Sprintf("PXEClient:Arch:%05d:UNDI:002001", arch))),
		dhcpv4.WithOption(dhcpv4.OptClientArch(arch)),
		dhcpv4.WithGeneric(dhcpv4.OptionClientMachineIdentifier, guidOpt),
	}
}

func with(mods []dhcpv4.Modifier, more ...dhcpv4.Modifier) []dhcpv4.Modifier {
	return append(append([]dhcpv4.Modifier{}, mods...), more...)
}

func TestProxyReply(t *testing.T) {
	ipxeUserClass := dhcpv4.WithGeneric(dhcpv4.OptionUserClassInformation, []byte("iPXE"))
	tests := []struct {
		name        string
		cfg         func(*Config)
		msgType     dhcpv4.MessageType
		port        int
		mods        []dhcpv4.Modifier
		want        Outcome
		wantFile    string
		wantVendor  string // option 60 in the reply
		wantOpt43   bool   // PXE discovery control for BIOS ROMs
		wantRelayed bool
		wantErr     error
	}{
		{name: "BIOS discover gets undionly over TFTP", msgType: dhcpv4.MessageTypeDiscover, port: PortDHCP,
			mods: pxe(iana.INTEL_X86PC), want: Offered, wantFile: "undionly.kpxe", wantVendor: "PXEClient", wantOpt43: true},
		{name: "UEFI x64 (IANA 7) gets ipxe.efi", msgType: dhcpv4.MessageTypeDiscover, port: PortDHCP,
			mods: pxe(iana.EFI_X86_64), want: Offered, wantFile: "ipxe.efi", wantVendor: "PXEClient"},
		{name: "UEFI x64 sent as 9 (RFC 4578 table) gets ipxe.efi", msgType: dhcpv4.MessageTypeDiscover, port: PortDHCP,
			mods: pxe(iana.EFI_BC), want: Offered, wantFile: "ipxe.efi", wantVendor: "PXEClient"},
		{name: "UEFI arm64 gets the arm64 binary", msgType: dhcpv4.MessageTypeDiscover, port: PortDHCP,
			mods: pxe(iana.EFI_ARM64), want: Offered, wantFile: "ipxe-arm64.efi", wantVendor: "PXEClient"},
		{name: "UEFI arm64 without an arm64 binary is refused", msgType: dhcpv4.MessageTypeDiscover, port: PortDHCP,
			cfg:  func(c *Config) { c.Files.UEFIARM64 = "" },
			mods: pxe(iana.EFI_ARM64), want: Rejected},
		{name: "UEFI HTTP boot gets a URL and HTTPClient", msgType: dhcpv4.MessageTypeDiscover, port: PortDHCP,
			mods: []dhcpv4.Modifier{
				dhcpv4.WithOption(dhcpv4.OptClassIdentifier("HTTPClient:Arch:00016:UNDI:003001")),
				dhcpv4.WithOption(dhcpv4.OptClientArch(iana.EFI_X86_64_HTTP)),
			},
			want: Offered, wantFile: "http://10.8.0.1:8080/boot/ipxe.efi", wantVendor: "HTTPClient"},
		{name: "iPXE gets its script, not iPXE again", msgType: dhcpv4.MessageTypeDiscover, port: PortDHCP,
			mods: with(pxe(iana.INTEL_X86PC), ipxeUserClass), want: Offered,
			wantFile: "http://10.8.0.1:8080/ipxe/52-54-00-12-34-56.ipxe", wantVendor: "PXEClient"},
		{name: "iPXE on UEFI gets its script", msgType: dhcpv4.MessageTypeDiscover, port: PortDHCP,
			mods: with(pxe(iana.EFI_X86_64), ipxeUserClass), want: Offered,
			wantFile: "http://10.8.0.1:8080/ipxe/52-54-00-12-34-56.ipxe", wantVendor: "PXEClient"},
		{name: "per-machine boot file", msgType: dhcpv4.MessageTypeDiscover, port: PortDHCP,
			cfg:  func(c *Config) { c.BootFile = func(Client) string { return "snponly.efi" } },
			mods: pxe(iana.EFI_X86_64), want: Offered, wantFile: "snponly.efi", wantVendor: "PXEClient"},
		{name: "boot-server request on 4011 is acked", msgType: dhcpv4.MessageTypeRequest, port: PortPXE,
			mods: pxe(iana.EFI_X86_64), want: Acked, wantFile: "ipxe.efi", wantVendor: "PXEClient"},
		{name: "request on 4011 naming another server", msgType: dhcpv4.MessageTypeRequest, port: PortPXE,
			mods: with(pxe(iana.EFI_X86_64), dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.IPv4(10, 8, 0, 99)))),
			want: IgnoredOtherHost},
		{name: "request on 67 belongs to the real DHCP server", msgType: dhcpv4.MessageTypeRequest, port: PortDHCP,
			mods: pxe(iana.INTEL_X86PC), want: IgnoredOtherHost},
		{name: "release is not ours", msgType: dhcpv4.MessageTypeRelease, port: PortDHCP,
			mods: pxe(iana.INTEL_X86PC), want: IgnoredType},
		{name: "discover on 4011 is not a boot-server request", msgType: dhcpv4.MessageTypeDiscover, port: PortPXE,
			mods: pxe(iana.INTEL_X86PC), want: IgnoredType},
		{name: "relayed request keeps giaddr and option 82", msgType: dhcpv4.MessageTypeDiscover, port: PortDHCP,
			mods: with(pxe(iana.INTEL_X86PC), dhcpv4.WithRelay(relayIP),
				dhcpv4.WithGeneric(dhcpv4.OptionRelayAgentInformation, circuitID)),
			want: Offered, wantFile: "undionly.kpxe", wantVendor: "PXEClient", wantOpt43: true, wantRelayed: true},
		{name: "ordinary DHCP client is left to the real server", msgType: dhcpv4.MessageTypeDiscover, port: PortDHCP,
			want: IgnoredNotPXE},
		{name: "unknown machine is not answered", msgType: dhcpv4.MessageTypeDiscover, port: PortDHCP,
			mods: with(pxe(iana.INTEL_X86PC), dhcpv4.WithHwAddr(otherMAC)), want: IgnoredUnknown},
		{name: "no Allow policy answers nobody", msgType: dhcpv4.MessageTypeDiscover, port: PortDHCP,
			cfg:  func(c *Config) { c.Allow = nil },
			mods: pxe(iana.INTEL_X86PC), want: IgnoredUnknown},
		{name: "Itanium is unsupported", msgType: dhcpv4.MessageTypeDiscover, port: PortDHCP,
			mods: pxe(iana.EFI_ITANIUM), want: Rejected, wantErr: ErrUnsupportedArch},
		{name: "malformed option 97", msgType: dhcpv4.MessageTypeDiscover, port: PortDHCP,
			mods: with(pxe(iana.INTEL_X86PC), dhcpv4.WithGeneric(dhcpv4.OptionClientMachineIdentifier, []byte{0, 1, 2})),
			want: Rejected},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			p, err := NewProxy(cfg)
			if err != nil {
				t.Fatal(err)
			}
			req := request(t, tc.msgType, tc.mods...)
			reply, outcome, err := p.Reply(req, tc.port)
			if outcome != tc.want {
				t.Fatalf("outcome = %s (err %v), want %s", outcome, err, tc.want)
			}
			if tc.want == Rejected {
				if err == nil {
					t.Fatal("rejected without saying why")
				}
				if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
					t.Fatalf("error = %v, want %v", err, tc.wantErr)
				}
			}
			if tc.want != Offered && tc.want != Acked {
				if reply != nil {
					t.Fatalf("outcome %s but a reply was built: %s", outcome, reply.Summary())
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			// Check what the client would receive.
			got, err := dhcpv4.FromBytes(reply.ToBytes())
			if err != nil {
				t.Fatalf("reply does not parse: %v", err)
			}
			checkProxyReply(t, req, got)
			if got.BootFileName != tc.wantFile {
				t.Errorf("boot file = %q, want %q", got.BootFileName, tc.wantFile)
			}
			if v := got.ClassIdentifier(); v != tc.wantVendor {
				t.Errorf("option 60 = %q, want %q", v, tc.wantVendor)
			}
			opt43 := got.GetOneOption(dhcpv4.OptionVendorSpecificInformation)
			if tc.wantOpt43 != bytes.Equal(opt43, []byte{6, 1, 8, 255}) {
				t.Errorf("option 43 = %v, want discovery control: %v", opt43, tc.wantOpt43)
			}
			if tc.wantRelayed {
				if !got.GatewayIPAddr.Equal(relayIP) {
					t.Errorf("giaddr = %v, want %v", got.GatewayIPAddr, relayIP)
				}
				if rai := got.GetOneOption(dhcpv4.OptionRelayAgentInformation); !bytes.Equal(rai, circuitID) {
					t.Errorf("option 82 = %v, want it echoed as %v", rai, circuitID)
				}
			}
		})
	}
}

// checkProxyReply asserts what every proxyDHCP answer must hold.
func checkProxyReply(t *testing.T, req, reply *dhcpv4.DHCPv4) {
	t.Helper()
	if reply.OpCode != dhcpv4.OpcodeBootReply || reply.TransactionID != req.TransactionID ||
		!bytes.Equal(reply.ClientHWAddr, req.ClientHWAddr) {
		t.Errorf("reply does not answer the request: %s", reply.Summary())
	}
	if !reply.YourIPAddr.IsUnspecified() {
		t.Errorf("a proxy hands out no address, yiaddr = %v", reply.YourIPAddr)
	}
	if !reply.ServerIPAddr.Equal(net.IP(serverIP.AsSlice())) || !reply.ServerIdentifier().Equal(net.IP(serverIP.AsSlice())) {
		t.Errorf("siaddr %v, server id %v, want %v", reply.ServerIPAddr, reply.ServerIdentifier(), serverIP)
	}
	if guid := req.GetOneOption(dhcpv4.OptionClientMachineIdentifier); guid != nil &&
		!bytes.Equal(reply.GetOneOption(dhcpv4.OptionClientMachineIdentifier), guid) {
		t.Error("option 97 not echoed; PXE ROMs drop such offers")
	}
	if reply.IPAddressLeaseTime(0) != 0 {
		t.Error("a proxy offer must not carry a lease time")
	}
}

func TestClassify(t *testing.T) {
	tests := []struct {
		name string
		mods []dhcpv4.Modifier
		want Client
	}{
		{"BIOS PXE ROM", pxe(iana.INTEL_X86PC),
			Client{CPU: AMD64, Firmware: BIOS, Arch: iana.INTEL_X86PC, UUID: guidUUID}},
		{"no option 93 means BIOS", []dhcpv4.Modifier{dhcpv4.WithOption(dhcpv4.OptClassIdentifier("PXEClient"))},
			Client{CPU: AMD64, Firmware: BIOS, Arch: iana.INTEL_X86PC}},
		{"OVMF", pxe(iana.EFI_X86_64), Client{CPU: AMD64, Firmware: UEFI, Arch: iana.EFI_X86_64, UUID: guidUUID}},
		{"iPXE, RFC 3004 user class", with(pxe(iana.EFI_ARM64), dhcpv4.WithUserClass("iPXE", true)),
			Client{CPU: ARM64, Firmware: UEFI, Arch: iana.EFI_ARM64, UUID: guidUUID, IPXE: true}},
		{"HTTP boot arm64", []dhcpv4.Modifier{
			dhcpv4.WithOption(dhcpv4.OptClassIdentifier("HTTPClient:Arch:00019")),
			dhcpv4.WithOption(dhcpv4.OptClientArch(iana.EFI_ARM64_HTTP)),
		}, Client{CPU: ARM64, Firmware: UEFI, Arch: iana.EFI_ARM64_HTTP, HTTPBoot: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Classify(request(t, dhcpv4.MessageTypeDiscover, tc.mods...))
			if err != nil {
				t.Fatal(err)
			}
			tc.want.MAC = knownMAC
			tc.want.VendorClass = got.VendorClass
			if got.String() != tc.want.String() {
				t.Errorf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
}

func TestNewProxyChecksConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  func(*Config)
	}{
		{"no server IP", func(c *Config) { c.ServerIP = netip.Addr{} }},
		{"IPv6 server IP", func(c *Config) { c.ServerIP = netip.MustParseAddr("fd00::1") }},
		{"unspecified server IP", func(c *Config) { c.ServerIP = netip.IPv4Unspecified() }},
		{"port 0", func(c *Config) { c.HTTPPort = 0 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			tc.cfg(&cfg)
			if _, err := NewProxy(cfg); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}
