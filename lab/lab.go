// Package lab builds a rack out of QEMU virtual machines on one Linux host:
// a network namespace with a bridge and one tap per VM, VMs that netboot
// (BIOS through SeaBIOS's iPXE ROM, UEFI through OVMF's own PXE) from
// Cozy's netboot server, and `cozyctl bootstrap` taking them to a cluster.
// Nothing leaves the namespace: no routes, no NAT.
//
// This file is the pure part: what a lab of a given shape is made of (its
// machines, addresses, MACs, firmware) and the rack file that describes
// it. qemu.go starts and stops VMs, network.go builds the namespace.
package lab

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// Firmware choices for a lab.
const (
	FirmwareBIOS  = "bios"
	FirmwareUEFI  = "uefi"
	FirmwareMixed = "mixed"
)

// Config is the shape of a lab, as `cozyctl lab up` takes it.
type Config struct {
	Name          string
	Nodes         int
	ControlPlanes int
	// Firmware is bios, uefi or mixed (alternating, first node BIOS).
	Firmware string
	// Image is emulated (the emulated Talos node) or talos.
	Image string
	// MemoryMiB per VM.
	MemoryMiB int
	// DiskGiB is each VM's system disk (a sparse qcow2).
	DiskGiB int
	// Dir holds the lab's rack file, disks, serial logs and state.
	Dir string
	// Accel is auto, kvm or tcg.
	Accel string
	// Factory is the Talos Image Factory of --image talos (the rack's
	// talos.factory); empty means the public one.
	Factory string `json:",omitempty"`
	// Internet gives the VMs a way out of the lab's namespace (NAT
	// through this machine), which real Talos needs to pull its
	// installer. Off unless asked for.
	Internet bool `json:",omitempty"`
	// NodeServices is whether the emulated nodes run kubelet, containerd,
	// the controller-manager, the scheduler and pods (on), or only the
	// Talos API, etcd and kube-apiserver (off). auto is on under KVM and
	// off under TCG, where the node services are slow: on 2 cores CoreDNS
	// got ready about 10 minutes after lab up started with two VMs, and
	// not with three (docs/lab.md#measured).
	NodeServices string `json:",omitempty"`
	// KubernetesVersion is the version the lab's rack names; empty means
	// KubernetesVersion, the one its binaries are built at. A test names
	// an older one to upgrade from: the nodes run their one build for it
	// (docs/talos-node.md#kubernetes-versions).
	KubernetesVersion string `json:",omitempty"`
	// Platform installs the platform after the bootstrap: the components
	// whose images Cozy builds (PlatformComponents), from the lab's
	// registry and a Git server on its bridge. It needs the node
	// services.
	Platform bool `json:",omitempty"`
}

// Values of Config.NodeServices.
const (
	NodeServicesAuto = "auto"
	NodeServicesOn   = "on"
	NodeServicesOff  = "off"
)

// runsNodeServices says whether the lab's emulated nodes run their node
// services, once the accelerator is known.
func (c *Config) runsNodeServices(accel string) bool {
	if c.Image == "talos" {
		return false // real Talos runs its own; nothing to switch
	}
	return c.NodeServices == NodeServicesOn || c.NodeServices == NodeServicesAuto && accel == "kvm"
}

// Defaults for a lab; `cozyctl lab up --help` shows them.
const (
	DefaultName      = "cozy"
	DefaultNodes     = 3
	DefaultMemoryMiB = 3072
	DefaultDiskGiB   = 8
)

var labName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,13}[a-z0-9])?$`)

// DefaultDir is where labs live unless --dir says otherwise.
func DefaultDir(name string) string {
	base := os.Getenv("XDG_STATE_HOME")
	if base == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			home = "/root"
		}
		base = filepath.Join(home, ".local", "state")
	}
	return filepath.Join(base, "cozy", "labs", name)
}

// WithDefaults returns c with what it leaves out filled in, or why the
// rest cannot make a lab.
func (c Config) WithDefaults() (Config, error) {
	if c.Name == "" {
		c.Name = DefaultName
	}
	if !labName.MatchString(c.Name) {
		return c, fmt.Errorf("lab name %q: use at most 15 lower-case letters, digits and '-'", c.Name)
	}
	if c.Nodes == 0 {
		c.Nodes = DefaultNodes
	}
	if c.ControlPlanes == 0 {
		c.ControlPlanes = 1
	}
	if c.Firmware == "" {
		c.Firmware = FirmwareMixed
	}
	if c.Image == "" {
		c.Image = "emulated"
	}
	if c.MemoryMiB == 0 {
		c.MemoryMiB = DefaultMemoryMiB
	}
	if c.DiskGiB == 0 {
		c.DiskGiB = DefaultDiskGiB
	}
	if c.Dir == "" {
		c.Dir = DefaultDir(c.Name)
	}
	if c.Accel == "" {
		c.Accel = "auto"
	}
	if c.NodeServices == "" {
		c.NodeServices = NodeServicesAuto
	}
	var errs []error
	switch c.NodeServices {
	case NodeServicesAuto, NodeServicesOn, NodeServicesOff:
		if c.Image == "talos" && c.NodeServices != NodeServicesAuto {
			errs = append(errs, errors.New("--node-services is for the emulated nodes: real Talos runs its own"))
		}
	default:
		errs = append(errs, fmt.Errorf("--node-services %q: use auto, on or off", c.NodeServices))
	}
	if c.ControlPlanes != 1 && c.ControlPlanes != 3 {
		errs = append(errs, fmt.Errorf("--controlplanes %d: use 1 or 3", c.ControlPlanes))
	}
	if c.Nodes < c.ControlPlanes || c.Nodes > 60 {
		errs = append(errs, fmt.Errorf("--nodes %d: between the control planes (%d) and 60", c.Nodes, c.ControlPlanes))
	}
	switch c.Firmware {
	case FirmwareBIOS, FirmwareUEFI, FirmwareMixed:
	default:
		errs = append(errs, fmt.Errorf("--firmware %q: use bios, uefi or mixed", c.Firmware))
	}
	switch c.Image {
	case "emulated":
	case "talos":
		if !c.Internet {
			errs = append(errs, errors.New("--image talos: real Talos nodes pull their installer from the Image Factory's registry; add --internet to let the lab's VMs out (NAT through this machine)"))
		}
	default:
		errs = append(errs, fmt.Errorf("--image %q: use emulated or talos", c.Image))
	}
	if c.Factory != "" {
		if u, err := url.Parse(c.Factory); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			errs = append(errs, fmt.Errorf("--factory %q: want the Image Factory's http(s) URL", c.Factory))
		}
	}
	switch c.Accel {
	case "auto", "kvm", "tcg":
	default:
		errs = append(errs, fmt.Errorf("--accel %q: use auto, kvm or tcg", c.Accel))
	}
	if c.MemoryMiB < 512 {
		errs = append(errs, fmt.Errorf("--memory %d: at least 512 MiB", c.MemoryMiB))
	}
	return c, errors.Join(errs...)
}

// Network plan of every lab: its own namespace, so the same addresses in
// every lab never meet.
var (
	Subnet   = netip.MustParsePrefix("192.168.77.0/24")
	ServerIP = netip.MustParseAddr("192.168.77.1")
	// VIP is the API endpoint of a lab with three control planes: the
	// one holding it moves it when it fails, as on a real rack.
	VIP = netip.MustParseAddr("192.168.77.10")
	// RangeFrom-RangeTo is the DHCP pool for anything not in the rack.
	RangeFrom = netip.MustParseAddr("192.168.77.100")
	RangeTo   = netip.MustParseAddr("192.168.77.199")
	// BMCSubnet is the lab's management network, on the same bridge: each
	// VM's BMC answers at an address of its own there, as a rack's BMCs
	// do on theirs.
	BMCSubnet = netip.MustParsePrefix("192.168.78.0/24")
)

// Bridge is the namespace's bridge, where the netboot server answers.
const Bridge = "br0"

// Machine is one VM of the lab.
type Machine struct {
	Name     string           `json:"name"`
	Role     string           `json:"role"`
	Firmware string           `json:"firmware"`
	MAC      net.HardwareAddr `json:"-"`
	MACText  string           `json:"mac"`
	UUID     string           `json:"uuid"`
	IP       netip.Addr       `json:"ip"`
	Tap      string           `json:"tap"`
	// BMC is the address of the VM's Redfish BMC on BMCSubnet.
	BMC netip.Addr `json:"bmc"`
}

// Machines lists the lab's VMs: control planes cp1.., then workers w1..,
// with MACs and UUIDs derived from the lab name, so a lab rebuilt with the
// same name has the same machines.
func (c *Config) Machines() []Machine {
	out := make([]Machine, 0, c.Nodes)
	for i := range c.Nodes {
		m := Machine{Role: "worker", Name: fmt.Sprintf("w%d", i-c.ControlPlanes+1)}
		if i < c.ControlPlanes {
			m.Role, m.Name = "controlplane", fmt.Sprintf("cp%d", i+1)
		}
		switch {
		case c.Firmware == FirmwareMixed && i%2 == 1, c.Firmware == FirmwareUEFI:
			m.Firmware = FirmwareUEFI
		default:
			m.Firmware = FirmwareBIOS
		}
		sum := sha256.Sum256([]byte(c.Name))
		m.MAC = net.HardwareAddr{0x52, 0x54, 0x00, 0xc0, sum[0], byte(i + 1)}
		m.MACText = m.MAC.String()
		u := sha256.Sum256(fmt.Appendf(nil, "cozy-lab/%s/%d", c.Name, i))
		u[6] = u[6]&0x0f | 0x50 // a name-based UUID (RFC 4122 version 5 layout)
		u[8] = u[8]&0x3f | 0x80
		m.UUID = fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
		m.IP = netip.AddrFrom4([4]byte{192, 168, 77, byte(11 + i)})
		m.Tap = fmt.Sprintf("tap%d", i)
		m.BMC = netip.AddrFrom4([4]byte{192, 168, 78, byte(11 + i)})
		out = append(out, m)
	}
	return out
}

// Rack is the rack file of the lab: the user can read it, edit it and rerun
// `cozyctl bootstrap` by hand.
func (c *Config) Rack() []byte {
	var b strings.Builder
	fmt.Fprintf(&b, `# The rack of lab %[1]q, written by cozyctl lab up: QEMU VMs on the bridge
# %[2]s in network namespace %[3]s. Rerun the bootstrap by hand with
#   ip netns exec %[3]s cozyctl bootstrap --rack %[4]s ...
# (cozyctl lab up prints the whole command).
apiVersion: cozy.dev/v1alpha1
kind: Rack
metadata:
  name: %[1]s
network:
  interface: %[2]s
  subnet: %[5]s
  dhcp:
    mode: full               # the lab's netboot server is its only DHCP server
    range: %[6]s-%[7]s
`, c.Name, Bridge, Namespace(c.Name), filepath.Join(c.Dir, "rack.yaml"), Subnet, RangeFrom, RangeTo)
	if c.Internet {
		fmt.Fprintf(&b, "  gateway: %s          # --internet: out through this machine (NAT)\n  dns: [%s]\n", ServerIP, strings.Join(resolvers(), ", "))
	} else {
		// A default route, as a rack has (flannel takes its interface
		// from it); the namespace routes nowhere further.
		fmt.Fprintf(&b, "  gateway: %s          # the lab's namespace: nothing is routed beyond it\n", ServerIP)
	}
	var cluster []string
	if c.ControlPlanes > 1 {
		cluster = append(cluster, fmt.Sprintf("  vip: %s                 # the API endpoint: the control planes elect its holder", VIP))
	}
	if c.Image != "talos" {
		// The version the lab's binaries and images are built at
		// (hack/envtest-assets.sh, hack/lab-images.sh).
		line := "  kubernetesVersion: " + KubernetesVersion + "   # what the lab builds from source"
		if v := c.KubernetesVersion; v != "" && v != KubernetesVersion {
			line = "  kubernetesVersion: " + v + "   # the lab's " + KubernetesVersion + " build runs it"
		}
		cluster = append(cluster, line)
		// The lab's own CNI, as Talos's default: the platform's Kube-OVN
		// and Cilium are not built here yet (docs/lab.md).
		cluster = append(cluster, "  cni: flannel                    # Talos's flannel, with kube-proxy")
	}
	if len(cluster) > 0 {
		fmt.Fprintf(&b, "cluster:\n%s\n", strings.Join(cluster, "\n"))
	}
	if c.Image != "talos" {
		fmt.Fprintf(&b, "registries:\n  mirror: %s # every image, built from source (cozyctl images mirror)\n", RegistryURL())
	}
	if c.Factory != "" {
		fmt.Fprintf(&b, "talos:\n  factory: %s\n", c.Factory)
	}
	if c.Platform {
		b.WriteString(c.platformSection())
	}
	if c.Image != "talos" {
		b.WriteString(slowControlPlanePatch)
	}
	b.WriteString("machines:\n")
	for _, m := range c.Machines() {
		fmt.Fprintf(&b, `  - hostname: %s
    role: %s
    mac: "%s"                # %s firmware
    uuid: %s
    install:
      disk: /dev/vda
    interfaces:
      - mac: "%s"
        addresses: [%s/%d]
    bmc:                       # the lab's Redfish BMC of this VM (cozyctl machine power)
      address: redfish+https://%s/redfish/v1/Systems/%s
      credentialsFile: %s
      insecureSkipVerify: true # its certificate is self-signed, as most BMCs' are
`, m.Name, m.Role, m.MACText, m.Firmware, m.UUID, m.MACText, m.IP, Subnet.Bits(), m.BMC, m.UUID, BMCCredentialsFile)
	}
	return []byte(b.String())
}

// slowControlPlanePatch gives the controller-manager and the scheduler
// leases that survive a slow API server. The lab's VMs are often emulated
// (TCG, no KVM), about ten times slower than the host: with the default
// 15 s lease and 10 s renew deadline, a control plane busy starting up
// loses its leader lease, and the controller-manager and scheduler
// exit and start over (seen in TestLab before this patch; with it, they
// still do when the node services saturate the VMs: docs/lab.md#measured).
// Talos passes these flags through cluster.*.extraArgs like any other.
// Every node's kubelet also gives the container runtime 10 minutes a
// request instead of 2: a --platform try saw a container's start fail with
// "context deadline exceeded" on a busy VM, and the pod start over.
const slowControlPlanePatch = `patches:
  - target: all              # container starts on emulated (slow) VMs
    patch:
      machine:
        kubelet:
          extraConfig:
            runtimeRequestTimeout: 10m
  - target: controlplane     # leases for emulated (slow) VMs
    patch:
      cluster:
        controllerManager:
          extraArgs:
            leader-elect-lease-duration: 60s
            leader-elect-renew-deadline: 40s
            leader-elect-retry-period: 10s
        scheduler:
          extraArgs:
            leader-elect-lease-duration: 60s
            leader-elect-renew-deadline: 40s
            leader-elect-retry-period: 10s
`

// KubernetesVersion is the version of the emulated lab's cluster: the
// default of hack/envtest-assets.sh and hack/lab-images.sh, which build
// its binaries and images.
const KubernetesVersion = "1.36.3"

// Namespace is the network namespace of lab name.
func Namespace(name string) string { return "cozy-lab-" + name }
