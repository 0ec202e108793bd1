// Package dhcp decides how Cozy's netboot server answers a DHCPv4 request
// from a network-booting machine. The core is pure: Proxy.Reply maps a
// request packet to a reply packet (or to no reply, with the reason), so it
// is tested without sockets; sockets live in the server that calls it.
package dhcp

import (
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"
)

// Firmware is the boot environment a client runs.
type Firmware string

// Firmware types Cozy boots.
const (
	BIOS Firmware = "bios"
	UEFI Firmware = "uefi"
)

// CPU is the instruction set of a client, in Go/Talos naming.
type CPU string

// CPUs Cozy boots.
const (
	AMD64 CPU = "amd64"
	ARM64 CPU = "arm64"
)

// Client is what a DHCP request says about the machine that sent it.
type Client struct {
	MAC net.HardwareAddr
	// UUID is the SMBIOS system UUID from option 97, in the canonical form
	// dmidecode and Talos print; empty when the client sent none.
	UUID string
	// Arch is option 93 as sent (RFC 4578 / IANA processor architecture).
	Arch     iana.Arch
	CPU      CPU
	Firmware Firmware
	// HTTPBoot is a UEFI HTTP boot client (vendor class "HTTPClient"): it
	// needs a URL, not a TFTP file name.
	HTTPBoot bool
	// IPXE is iPXE itself asking (user class "iPXE"): it gets the HTTP
	// script, never an iPXE binary again, so there is no chain-load loop.
	IPXE bool
	// VendorClass is option 60 as sent.
	VendorClass string
}

// String describes the client for logs.
func (c Client) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s/%s arch=%d", c.MAC, c.CPU, c.Firmware, uint16(c.Arch))
	if c.UUID != "" {
		fmt.Fprintf(&b, " uuid=%s", c.UUID)
	}
	if c.HTTPBoot {
		b.WriteString(" http-boot")
	}
	if c.IPXE {
		b.WriteString(" ipxe")
	}
	return b.String()
}

// Errors Classify returns. A request that is not a netboot request is normal
// traffic on a shared network and is ignored quietly.
var (
	ErrNotNetboot      = errors.New("not a PXE or HTTP boot client")
	ErrUnsupportedArch = errors.New("unsupported client architecture")
)

// Classify reads the client's hardware address, architecture, firmware and
// boot stage from a request.
func Classify(req *dhcpv4.DHCPv4) (Client, error) {
	c := Client{VendorClass: req.ClassIdentifier()}
	switch {
	case strings.HasPrefix(c.VendorClass, "PXEClient"):
	case strings.HasPrefix(c.VendorClass, "HTTPClient"):
		c.HTTPBoot = true
	default:
		return c, ErrNotNetboot
	}
	if req.HWType != iana.HWTypeEthernet || len(req.ClientHWAddr) != 6 {
		return c, fmt.Errorf("%w: hardware type %v with a %d-byte address", ErrNotNetboot, req.HWType, len(req.ClientHWAddr))
	}
	c.MAC = req.ClientHWAddr

	archs := req.ClientArch()
	if len(archs) == 0 {
		// Option 93 is mandatory for PXE clients (RFC 4578); old BIOS ROMs
		// that omit it are x86 BIOS.
		archs = []iana.Arch{iana.INTEL_X86PC}
	}
	c.Arch = archs[0]
	switch c.Arch {
	case iana.INTEL_X86PC:
		c.CPU, c.Firmware = AMD64, BIOS
	// 7 is x64 UEFI per IANA; RFC 4578's table swapped 7 and 9, and some
	// firmware still sends 9 for x64.
	case iana.EFI_X86_64, iana.EFI_BC:
		c.CPU, c.Firmware = AMD64, UEFI
	case iana.EFI_X86_64_HTTP:
		c.CPU, c.Firmware, c.HTTPBoot = AMD64, UEFI, true
	case iana.EFI_ARM64:
		c.CPU, c.Firmware = ARM64, UEFI
	case iana.EFI_ARM64_HTTP:
		c.CPU, c.Firmware, c.HTTPBoot = ARM64, UEFI, true
	default:
		return c, fmt.Errorf("%w %d (%v)", ErrUnsupportedArch, uint16(c.Arch), c.Arch)
	}

	for _, uc := range req.UserClass() {
		if uc == "iPXE" {
			c.IPXE = true
		}
	}
	if guid := req.GetOneOption(dhcpv4.OptionClientMachineIdentifier); guid != nil {
		uuid, err := smbiosUUID(guid)
		if err != nil {
			return c, fmt.Errorf("option 97: %w", err)
		}
		c.UUID = uuid
	}
	return c, nil
}

// smbiosUUID formats option 97 (type 0, then 16 bytes) as dmidecode does.
// Firmware copies the SMBIOS bytes, whose first three fields are
// little-endian (SMBIOS 2.6+), into the option.
func smbiosUUID(opt []byte) (string, error) {
	if len(opt) != 17 || opt[0] != 0 {
		return "", fmt.Errorf("want type 0 and a 16-byte UUID, got %d bytes", len(opt))
	}
	b := opt[1:]
	canonical := []byte{
		b[3], b[2], b[1], b[0],
		b[5], b[4],
		b[7], b[6],
		b[8], b[9],
		b[10], b[11], b[12], b[13], b[14], b[15],
	}
	h := hex.EncodeToString(canonical)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32], nil
}
