package talosnode

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/dustin/go-humanize"
)

// Ports the node serves on its address, as Talos does.
const (
	// DefaultAPIPort is apid's port: the machine API and COSI state.
	DefaultAPIPort = 50000
	// TrustdPort is where control planes issue worker API certificates.
	TrustdPort = 50001
	// EtcdClientPort and EtcdPeerPort are etcd's, on control planes.
	EtcdClientPort = 2379
	EtcdPeerPort   = 2380
)

// DefaultRebootDelay is how long an emulated reboot (or install) keeps the
// node off the network.
const DefaultRebootDelay = 2 * time.Second

// Config describes one emulated machine: its hardware, its address and
// its disk (StateDir).
type Config struct {
	// Address is the node's IP address; every server of the node listens
	// on it and nowhere else.
	Address netip.Addr
	// PrefixLength of Address on the first NIC; 0 means a host prefix
	// (/32 or /128).
	PrefixLength int
	// Port of the machine API; 0 means DefaultAPIPort.
	Port int
	// StateDir is the node's disk: the applied machine config, etcd's
	// data, certificates and the logs of etcd and kube-apiserver.
	StateDir string
	// Hostname in maintenance mode (before a config names the machine);
	// empty means one derived from the first MAC, like talos-2f1-a3c.
	Hostname string
	// MACs of the NICs; the first is the one the machine netboots from
	// and carries Address.
	MACs []net.HardwareAddr
	// UUID is the SMBIOS system UUID.
	UUID string
	// Disks are the block devices the node reports.
	Disks []Disk
	// Bin are the programs the node runs.
	Bin Binaries
	// KubernetesAssets are directories of other Kubernetes versions'
	// binaries (kube-apiserver, kube-controller-manager, kube-scheduler,
	// kubelet; hack/envtest-assets.sh VERSION builds one): a component
	// runs the binary of the version its image in the machine config
	// names (kubeversions.go).
	KubernetesAssets []string
	// Platform is PlatformMetal (the node is its machine's whole
	// userland: a lab VM) or PlatformContainer (one of several nodes on
	// one host, each in network and mount namespaces of its own, as
	// Talos runs in a container); empty means metal.
	Platform Platform
	// NodeServices runs what Talos starts on every configured node:
	// containerd and kubelet, and on control planes the controller-manager
	// and scheduler and the bootstrap manifests (CoreDNS, the CNI,
	// kube-proxy, RBAC). Off, the node serves the Talos API and runs etcd
	// and kube-apiserver only (tests of the API).
	NodeServices bool
	// RebootDelay is how long an install or reboot takes; 0 means
	// DefaultRebootDelay.
	RebootDelay time.Duration
	// Reboot says who carries out a reboot (after an install, Reboot, or
	// Reset with reboot): the node itself (RebootInProcess, the default)
	// or the machine it runs on (RebootExit).
	Reboot RebootMode
	// Logger receives the node's log; nil discards it.
	Logger *slog.Logger
}

// Binaries are the programs a node starts; an empty path means the
// program's own name, looked up in PATH (a lab VM has them all there).
type Binaries struct {
	Etcd, APIServer, ControllerManager, Scheduler, Kubelet string
	// Containerd finds containerd-shim-runc-v2 in its own directory.
	Containerd string
	Runc       string
	// CNIDir holds the CNI plugins; default /opt/cni/bin.
	CNIDir string
}

// withDefaults names each binary left out by its own name (found on
// PATH), the CNI plugins by their usual folder.
func (b Binaries) withDefaults() Binaries {
	for _, d := range []struct {
		p    *string
		name string
	}{
		{&b.Etcd, "etcd"}, {&b.APIServer, "kube-apiserver"}, {&b.ControllerManager, "kube-controller-manager"},
		{&b.Scheduler, "kube-scheduler"}, {&b.Kubelet, "kubelet"}, {&b.Containerd, "containerd"}, {&b.Runc, "runc"},
		{&b.CNIDir, defaultCNIBinDir},
	} {
		if *d.p == "" {
			*d.p = d.name
		}
	}
	return b
}

// Platform says what the node runs on, as Talos's platform does.
type Platform string

const (
	// PlatformMetal: the node owns its machine (a lab VM).
	PlatformMetal Platform = "metal"
	// PlatformContainer: the node shares a host with others, in a
	// network namespace and a mount namespace of its own. It binds its
	// disk over Talos's system directories, keeps its processes in a
	// cgroup tree of its own, and its kubelet leaves the kernel's
	// settings alone.
	PlatformContainer Platform = "container"
)

// Set parses a flag value.
func (p *Platform) Set(s string) error {
	switch Platform(s) {
	case PlatformMetal, PlatformContainer:
		*p = Platform(s)
		return nil
	}
	return fmt.Errorf("%q: want %s or %s", s, PlatformMetal, PlatformContainer)
}

func (p *Platform) String() string {
	if p == nil || *p == "" {
		return string(PlatformMetal)
	}
	return string(*p)
}

// RebootMode says who carries out the node's reboots.
type RebootMode string

const (
	// RebootInProcess: the API goes away for RebootDelay and the node
	// boots again inside Run, from its state dir. For nodes run as
	// processes.
	RebootInProcess RebootMode = "process"
	// RebootExit: Run returns ErrReboot once the reply is out (and a
	// reset's wipe is done), and whatever runs the node reboots the
	// machine; the next boot finds the config on the disk. For nodes
	// that are a VM's whole userland (lab/nodeimage).
	RebootExit RebootMode = "exit"
)

// ErrReboot is what Run returns, with RebootExit, when the machine
// should reboot.
var ErrReboot = errors.New("the machine reboots")

// RebootExitCode is the exit status of cozy-talos-node --reboot=exit
// when the machine should reboot; it exits 0 when the machine should
// power off.
const RebootExitCode = 10

// Set parses a flag value.
func (m *RebootMode) Set(s string) error {
	switch RebootMode(s) {
	case RebootInProcess, RebootExit:
		*m = RebootMode(s)
		return nil
	}
	return fmt.Errorf("%q: want %s or %s", s, RebootInProcess, RebootExit)
}

func (m *RebootMode) String() string {
	if m == nil || *m == "" {
		return string(RebootInProcess)
	}
	return string(*m)
}

// Disk is a block device of the emulated machine.
type Disk struct {
	// Name is the kernel's name: vda, nvme0n1, sda.
	Name string
	// Size in bytes.
	Size   uint64
	Model  string
	Serial string
	// Transport is virtio, nvme, sata, scsi or usb.
	Transport string
}

// ParseDisk parses NAME:SIZE[:TRANSPORT[:MODEL[:SERIAL]]], for example
// vda:20GiB:virtio or nvme0n1:1TB:nvme:Samsung SSD 980:S64ANS0T.
// The transport defaults to one guessed from the name.
func ParseDisk(s string) (Disk, error) {
	parts := strings.SplitN(s, ":", 5)
	if len(parts) < 2 || parts[0] == "" {
		return Disk{}, fmt.Errorf("disk %q: want NAME:SIZE[:TRANSPORT[:MODEL[:SERIAL]]], e.g. vda:20GiB:virtio", s)
	}
	d := Disk{Name: parts[0]}
	size, err := humanize.ParseBytes(parts[1])
	if err != nil || size == 0 {
		return Disk{}, fmt.Errorf("disk %q: size %q is not a size like 20GiB", s, parts[1])
	}
	d.Size = size
	if len(parts) > 2 {
		d.Transport = parts[2]
	}
	if len(parts) > 3 {
		d.Model = parts[3]
	}
	if len(parts) > 4 {
		d.Serial = parts[4]
	}
	if d.Transport == "" {
		d.Transport = transportOf(d.Name)
	}
	return d, nil
}

func transportOf(name string) string {
	switch {
	case strings.HasPrefix(name, "nvme"):
		return "nvme"
	case strings.HasPrefix(name, "vd"):
		return "virtio"
	default:
		return "sata"
	}
}

func (d Disk) String() string {
	return fmt.Sprintf("%s:%s:%s:%s:%s", d.Name, humanize.IBytes(d.Size), d.Transport, d.Model, d.Serial)
}

// withDefaults fills in defaults and checks what cannot be defaulted.
func (c Config) withDefaults() (Config, error) {
	var errs []error
	if !c.Address.IsValid() {
		errs = append(errs, errors.New("address: the node needs an IP address to listen on"))
	} else {
		c.Address = c.Address.Unmap()
		if c.PrefixLength == 0 {
			c.PrefixLength = c.Address.BitLen()
		}
		if c.PrefixLength < 0 || c.PrefixLength > c.Address.BitLen() {
			errs = append(errs, fmt.Errorf("prefix length %d does not fit %s", c.PrefixLength, c.Address))
		}
	}
	if c.Port == 0 {
		c.Port = DefaultAPIPort
	}
	if c.StateDir == "" {
		errs = append(errs, errors.New("state dir: the node needs a directory as its disk"))
	} else if abs, err := filepath.Abs(c.StateDir); err == nil {
		c.StateDir = abs
	}
	if len(c.MACs) == 0 {
		errs = append(errs, errors.New("macs: the node needs at least one NIC"))
	}
	for i, m := range c.MACs {
		if len(m) != 6 {
			errs = append(errs, fmt.Errorf("mac %d (%s) is not an Ethernet address", i, m))
		}
	}
	for i, d := range c.Disks {
		if d.Name == "" || d.Size == 0 {
			errs = append(errs, fmt.Errorf("disk %d needs a name and a size", i))
		}
	}
	if c.Hostname == "" && len(c.MACs) > 0 && len(c.MACs[0]) == 6 {
		m := c.MACs[0]
		c.Hostname = fmt.Sprintf("talos-%02x%x-%x%02x", m[3], m[4]>>4, m[4]&0xf, m[5])
	}
	if c.RebootDelay == 0 {
		c.RebootDelay = DefaultRebootDelay
	}
	switch c.Reboot {
	case "":
		c.Reboot = RebootInProcess
	case RebootInProcess, RebootExit:
	default:
		errs = append(errs, fmt.Errorf("reboot %q: want %s or %s", c.Reboot, RebootInProcess, RebootExit))
	}
	c.Bin = c.Bin.withDefaults()
	switch c.Platform {
	case "":
		c.Platform = PlatformMetal
	case PlatformMetal, PlatformContainer:
	default:
		errs = append(errs, fmt.Errorf("platform %q: want %s or %s", c.Platform, PlatformMetal, PlatformContainer))
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, errors.Join(errs...)
}

// RegisterFlags binds c to flags of fs, as cozy-talos-node takes them.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.Var(addressFlag{c}, "address", "the node's IP address, optionally with its prefix length (10.0.0.11/24); everything listens on it")
	fs.IntVar(&c.Port, "port", DefaultAPIPort, "port of the Talos machine API")
	fs.StringVar(&c.StateDir, "state-dir", "", "directory that is the node's disk (machine config, etcd data, logs)")
	fs.StringVar(&c.Hostname, "hostname", "", "hostname in maintenance mode (default: derived from the first MAC)")
	fs.Var(macsFlag{&c.MACs}, "mac", "MAC address of a NIC; repeat for more NICs, the first is the netboot NIC")
	fs.StringVar(&c.UUID, "uuid", "", "SMBIOS system UUID")
	fs.Var(disksFlag{&c.Disks}, "disk", "block device NAME:SIZE[:TRANSPORT[:MODEL[:SERIAL]]], e.g. vda:20GiB:virtio; repeatable")
	for _, b := range []struct {
		p          *string
		name, what string
	}{
		{&c.Bin.Etcd, "etcd", "etcd"},
		{&c.Bin.APIServer, "kube-apiserver", "kube-apiserver"},
		{&c.Bin.ControllerManager, "kube-controller-manager", "kube-controller-manager"},
		{&c.Bin.Scheduler, "kube-scheduler", "kube-scheduler"},
		{&c.Bin.Kubelet, "kubelet", "kubelet"},
		{&c.Bin.Containerd, "containerd", "containerd (containerd-shim-runc-v2 beside it)"},
		{&c.Bin.Runc, "runc", "runc"},
	} {
		fs.StringVar(b.p, b.name, "", b.what+" binary (default: from PATH)")
	}
	fs.Func("kubernetes-assets", "directory of another Kubernetes version's kube-apiserver, kube-controller-manager, kube-scheduler and kubelet; repeatable. Each component runs the binary of the version its image in the machine config names", func(s string) error {
		c.KubernetesAssets = append(c.KubernetesAssets, s)
		return nil
	})
	fs.StringVar(&c.Bin.CNIDir, "cni-bin-dir", "", "directory of the CNI plugins (default "+defaultCNIBinDir+")")
	fs.Var(&c.Platform, "platform", fmt.Sprintf("%s (the node is its machine's userland) or %s (one of several nodes on a host, each in a network namespace of its own; the node makes its own mount namespace)", PlatformMetal, PlatformContainer))
	fs.BoolVar(&c.NodeServices, "node-services", false, "run containerd and kubelet, and on control planes the controller-manager, scheduler and bootstrap manifests, as Talos does (off: the Talos API, etcd and kube-apiserver only)")
	fs.DurationVar(&c.RebootDelay, "reboot-delay", DefaultRebootDelay, "how long an emulated install or reboot takes")
	fs.Var(&c.Reboot, "reboot", fmt.Sprintf("who reboots the machine: %s (the node, after --reboot-delay) or %s (the node exits with status %d and its VM reboots; power-off exits 0)",
		RebootInProcess, RebootExit, RebootExitCode))
}

type addressFlag struct{ c *Config }

func (f addressFlag) String() string {
	if f.c == nil || !f.c.Address.IsValid() {
		return ""
	}
	if f.c.PrefixLength != 0 {
		return netip.PrefixFrom(f.c.Address, f.c.PrefixLength).String()
	}
	return f.c.Address.String()
}

func (f addressFlag) Set(s string) error {
	if p, err := netip.ParsePrefix(s); err == nil {
		f.c.Address, f.c.PrefixLength = p.Addr(), p.Bits()
		return nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return fmt.Errorf("%q is not an IP address or IP/prefix", s)
	}
	f.c.Address, f.c.PrefixLength = a, 0
	return nil
}

type macsFlag struct{ macs *[]net.HardwareAddr }

func (f macsFlag) String() string {
	if f.macs == nil {
		return ""
	}
	s := make([]string, len(*f.macs))
	for i, m := range *f.macs {
		s[i] = m.String()
	}
	return strings.Join(s, ",")
}

func (f macsFlag) Set(s string) error {
	m, err := net.ParseMAC(s)
	if err != nil || len(m) != 6 {
		return fmt.Errorf("%q is not a MAC address like 52:54:00:00:00:01", s)
	}
	*f.macs = append(*f.macs, m)
	return nil
}

type disksFlag struct{ disks *[]Disk }

func (f disksFlag) String() string {
	if f.disks == nil {
		return ""
	}
	s := make([]string, len(*f.disks))
	for i, d := range *f.disks {
		s[i] = d.String()
	}
	return strings.Join(s, ",")
}

func (f disksFlag) Set(s string) error {
	d, err := ParseDisk(s)
	if err != nil {
		return err
	}
	*f.disks = append(*f.disks, d)
	return nil
}

// listenAddr is where the node's servers listen: every address, as
// Talos's apid, trustd and kube-apiserver do (the VIP among them), unless
// the node sits on a loopback address beside other nodes (tests).
func (c Config) listenAddr(port int) string {
	if c.Address.IsLoopback() {
		return c.hostPort(port)
	}
	return net.JoinHostPort("", strconv.Itoa(port))
}

// hostPort joins the node address with a port.
func (c Config) hostPort(port int) string {
	return net.JoinHostPort(c.Address.String(), strconv.Itoa(port))
}
