// Package rack is the rack file: one declarative YAML document that
// describes a cluster's machines, networks and versions, read by every
// `cozyctl` command that acts on a rack (talos gen, bootstrap, pxe serve,
// platform render, lab).
//
// Load parses and validates a file; every problem is reported with its
// field path and, where the field exists in the file, its line. Defaults
// are filled by Load and printed by `cozyctl rack init`, never hidden.
package rack

import (
	"time"

	"go.yaml.in/yaml/v3"
)

// APIVersion and Kind identify a rack file.
const (
	APIVersion = "cozy.dev/v1alpha1"
	Kind       = "Rack"
)

// Roles a machine can have.
const (
	RoleControlPlane = "controlplane"
	RoleWorker       = "worker"
)

// DHCP modes of the provisioning network (see pxe.Config.Mode).
const (
	DHCPModeProxy = "proxy"
	DHCPModeFull  = "full"
)

// The iPXE builds a machine can netboot into (Machine.IPXE).
const (
	IPXEDefault = "ipxe"
	IPXESNPOnly = "snponly"
)

// Rack is the whole file.
type Rack struct {
	APIVersion string   `yaml:"apiVersion" json:"apiVersion"`
	Kind       string   `yaml:"kind" json:"kind"`
	Metadata   Metadata `yaml:"metadata" json:"metadata"`
	Cluster    Cluster  `yaml:"cluster" json:"cluster"`
	Talos      Talos    `yaml:"talos" json:"talos"`
	// Network is the provisioning network the netboot server answers on.
	Network    Network    `yaml:"network" json:"network"`
	Registries Registries `yaml:"registries,omitempty" json:"registries,omitzero"`
	Machines   []Machine  `yaml:"machines" json:"machines"`
	// Patches apply to every machine of the target role, before the
	// machine's own patches.
	Patches  []Patch  `yaml:"patches,omitempty" json:"patches,omitempty"`
	Platform Platform `yaml:"platform,omitempty" json:"platform,omitzero"`
	Etcd     Etcd     `yaml:"etcd,omitempty" json:"etcd,omitzero"`

	// lines maps field paths to their lines in the file, set by Parse
	// for checks made after it (CheckBMCCredentials).
	lines map[string]int
}

// Metadata names the rack; the name is also the cluster name.
type Metadata struct {
	Name string `yaml:"name" json:"name"`
}

// Cluster is the Kubernetes cluster the rack becomes.
type Cluster struct {
	// Endpoint is the Kubernetes API URL; defaults to https://VIP:6443, or
	// the first control plane's static address without a VIP.
	Endpoint string `yaml:"endpoint,omitempty" json:"endpoint,omitempty"`
	// VIP is a shared address Talos moves between healthy control planes.
	VIP               string   `yaml:"vip,omitempty" json:"vip,omitempty"`
	KubernetesVersion string   `yaml:"kubernetesVersion,omitempty" json:"kubernetesVersion,omitempty"`
	PodSubnets        []string `yaml:"podSubnets,omitempty" json:"podSubnets,omitempty"`
	ServiceSubnets    []string `yaml:"serviceSubnets,omitempty" json:"serviceSubnets,omitempty"`
	DNSDomain         string   `yaml:"dnsDomain,omitempty" json:"dnsDomain,omitempty"`
	// AllowSchedulingOnControlPlanes defaults to true: small racks need
	// every node for workloads.
	AllowSchedulingOnControlPlanes *bool `yaml:"allowSchedulingOnControlPlanes,omitempty" json:"allowSchedulingOnControlPlanes,omitempty"`
	// CNI is the cluster's network until the platform brings its own:
	// none (the default: the platform installs Kube-OVN and Cilium, which
	// replaces kube-proxy) or flannel (Talos's own, with kube-proxy: the
	// lab's, while the platform's cannot be built here).
	CNI string `yaml:"cni,omitempty" json:"cni,omitempty"`
}

// The CNIs a rack can name in cluster.cni.
const (
	CNINone    = "none"
	CNIFlannel = "flannel"
)

// Talos selects the Talos release and image.
type Talos struct {
	Version string `yaml:"version,omitempty" json:"version,omitempty"`
	// Factory is the Talos Image Factory serving kernel, initramfs and
	// installer for the schematic.
	Factory   string    `yaml:"factory,omitempty" json:"factory,omitempty"`
	Schematic Schematic `yaml:"schematic,omitempty" json:"schematic,omitzero"`
	// InstallImage overrides the installer image the factory would give.
	InstallImage string `yaml:"installImage,omitempty" json:"installImage,omitempty"`
}

// Schematic is an Image Factory schematic: either its ID, or the
// customisation whose ID Cozy computes as the factory does.
type Schematic struct {
	ID              string   `yaml:"id,omitempty" json:"id,omitempty"`
	Extensions      []string `yaml:"extensions,omitempty" json:"extensions,omitempty"`
	ExtraKernelArgs []string `yaml:"extraKernelArgs,omitempty" json:"extraKernelArgs,omitempty"`
}

// Network is the provisioning network: where machines PXE-boot and get
// their first address.
type Network struct {
	// Interface is the netboot server's interface on this network.
	Interface string   `yaml:"interface" json:"interface"`
	Subnet    string   `yaml:"subnet" json:"subnet"`
	Gateway   string   `yaml:"gateway,omitempty" json:"gateway,omitempty"`
	DNS       []string `yaml:"dns,omitempty" json:"dns,omitempty"`
	DHCP      DHCP     `yaml:"dhcp,omitempty" json:"dhcp,omitzero"`
}

// DHCP says how the netboot server hands out addresses.
type DHCP struct {
	// Mode is proxy (default: another DHCP server gives addresses) or full.
	Mode string `yaml:"mode,omitempty" json:"mode,omitempty"`
	// Range is FROM-TO, the pool full mode leases from.
	Range string `yaml:"range,omitempty" json:"range,omitempty"`
	// LeaseTime is a Go duration (default 1h).
	LeaseTime string `yaml:"leaseTime,omitempty" json:"leaseTime,omitempty"`
	// Relayed are pools on other networks, whose machines reach the
	// netboot server through a DHCP relay agent (full mode): a relayed
	// request is answered from the pool of its relay's network.
	Relayed []RelayedPool `yaml:"relayed,omitempty" json:"relayed,omitempty"`
}

// RelayedPool is the address pool of one network behind a DHCP relay.
type RelayedPool struct {
	Subnet  string   `yaml:"subnet" json:"subnet"`
	Range   string   `yaml:"range" json:"range"`
	Gateway string   `yaml:"gateway,omitempty" json:"gateway,omitempty"`
	DNS     []string `yaml:"dns,omitempty" json:"dns,omitempty"`
}

// Registries configures image pulls on every node.
type Registries struct {
	// Mirror is one registry (http(s)://HOST[:PORT]) that serves every
	// image the rack needs, each under its upstream name:
	// registry.k8s.io/pause:3.10.1 is HOST:PORT/registry.k8s.io/pause:3.10.1,
	// as `cozyctl images mirror` pushes it. It becomes a Talos mirror for
	// each registry host the rack pulls from (MirrorHosts), with the
	// endpoint MIRROR/v2/HOST and overridePath.
	Mirror string `yaml:"mirror,omitempty" json:"mirror,omitempty"`
	// Mirrors maps a registry host (docker.io) to mirror endpoint URLs.
	Mirrors map[string][]string `yaml:"mirrors,omitempty" json:"mirrors,omitempty"`
}

// Machine is one server.
type Machine struct {
	Hostname string `yaml:"hostname" json:"hostname"`
	// Role is controlplane or worker (default).
	Role string `yaml:"role,omitempty" json:"role,omitempty"`
	// MAC and UUID select the server: the MAC it PXE-boots from, or its
	// SMBIOS system UUID. At least one is required.
	MAC  string `yaml:"mac,omitempty" json:"mac,omitempty"`
	UUID string `yaml:"uuid,omitempty" json:"uuid,omitempty"`
	// IPXE is the iPXE an x86-64 UEFI machine netboots into: ipxe
	// (default: ipxe.efi, with iPXE's own NIC drivers) or snponly
	// (snponly.efi, through the firmware's NIC driver, for NICs iPXE
	// does not drive).
	IPXE       string      `yaml:"ipxe,omitempty" json:"ipxe,omitempty"`
	Install    Install     `yaml:"install" json:"install"`
	Interfaces []Interface `yaml:"interfaces,omitempty" json:"interfaces,omitempty"`
	Patches    []Patch     `yaml:"patches,omitempty" json:"patches,omitempty"`
	// BMC is the server's management controller, if Cozy may drive it.
	BMC *BMC `yaml:"bmc,omitempty" json:"bmc,omitempty"`
}

// BMC is how Cozy reaches a machine's baseboard management controller.
type BMC struct {
	// Address is redfish+https://HOST[:PORT][/redfish/v1/Systems/ID]
	// (redfish+http:// for a BMC without TLS) or ipmi://HOST[:PORT].
	Address string `yaml:"address" json:"address"`
	// CredentialsFile holds the BMC's username and password (YAML),
	// mode 0600, read relative to the rack file. Credentials never go
	// in the rack itself.
	CredentialsFile string `yaml:"credentialsFile" json:"credentialsFile"`
	// InsecureSkipVerify accepts the BMC's TLS certificate unchecked
	// (BMCs often ship self-signed ones).
	InsecureSkipVerify bool `yaml:"insecureSkipVerify,omitempty" json:"insecureSkipVerify,omitempty"`

	// credentialsPath is CredentialsFile resolved against the rack's
	// directory, set by Load.
	credentialsPath string
}

// Install says where Talos goes.
type Install struct {
	// Disk is a device path; DiskSelector picks one by its facts instead.
	Disk         string        `yaml:"disk,omitempty" json:"disk,omitempty"`
	DiskSelector *DiskSelector `yaml:"diskSelector,omitempty" json:"diskSelector,omitempty"`
	// Wipe zeroes the disk before installing (slow on large disks).
	Wipe bool `yaml:"wipe,omitempty" json:"wipe,omitempty"`
}

// DiskSelector matches disks the way Talos's installDiskSelector does.
type DiskSelector struct {
	// Size is a comparison such as ">= 100GB" or an exact "480GB".
	Size   string `yaml:"size,omitempty" json:"size,omitempty"`
	Model  string `yaml:"model,omitempty" json:"model,omitempty"`
	Serial string `yaml:"serial,omitempty" json:"serial,omitempty"`
	// Type is ssd, hdd, nvme or sd.
	Type    string `yaml:"type,omitempty" json:"type,omitempty"`
	BusPath string `yaml:"busPath,omitempty" json:"busPath,omitempty"`
}

// Interface is a node network link: a NIC (by name or MAC) or a bond.
type Interface struct {
	Name string `yaml:"name,omitempty" json:"name,omitempty"`
	// MAC selects the NIC by hardware address when names are not known.
	MAC       string   `yaml:"mac,omitempty" json:"mac,omitempty"`
	Addresses []string `yaml:"addresses,omitempty" json:"addresses,omitempty"`
	DHCP      bool     `yaml:"dhcp,omitempty" json:"dhcp,omitempty"`
	// Gateway adds the default route through this link.
	Gateway string `yaml:"gateway,omitempty" json:"gateway,omitempty"`
	MTU     int    `yaml:"mtu,omitempty" json:"mtu,omitempty"`
	Bond    *Bond  `yaml:"bond,omitempty" json:"bond,omitempty"`
	VLANs   []VLAN `yaml:"vlans,omitempty" json:"vlans,omitempty"`
}

// Bond aggregates links; the interface's Name is the bond's name.
type Bond struct {
	// Links are member NIC names; MACs select members by address instead.
	Links []string `yaml:"links,omitempty" json:"links,omitempty"`
	MACs  []string `yaml:"macs,omitempty" json:"macs,omitempty"`
	// Mode is a Linux bonding mode (default 802.3ad).
	Mode string `yaml:"mode,omitempty" json:"mode,omitempty"`
}

// VLAN is a tagged sub-interface of its parent interface.
type VLAN struct {
	ID        int      `yaml:"id" json:"id"`
	Addresses []string `yaml:"addresses,omitempty" json:"addresses,omitempty"`
	DHCP      bool     `yaml:"dhcp,omitempty" json:"dhcp,omitempty"`
	Gateway   string   `yaml:"gateway,omitempty" json:"gateway,omitempty"`
	MTU       int      `yaml:"mtu,omitempty" json:"mtu,omitempty"`
}

// Patch is a Talos config patch: a strategic merge (a partial config
// document) or a JSON 6902 list, inline or from a file next to the rack.
type Patch struct {
	// Target limits a rack-level patch to a role: all (default),
	// controlplane or worker. Machine patches ignore it.
	Target string `yaml:"target,omitempty" json:"target,omitempty"`
	// File is read relative to the rack file.
	File  string    `yaml:"file,omitempty" json:"file,omitempty"`
	Patch yaml.Node `yaml:"patch,omitempty" json:"-"`

	// content is the patch text, from File or Patch, set by Load.
	content []byte
}

// Content is the patch as Talos's configpatcher reads it.
func (p *Patch) Content() []byte { return p.content }

// Platform holds the values the platform layer reads.
type Platform struct {
	// LoadBalancerPool lists address ranges (CIDR or FROM-TO) MetalLB
	// announces for Services of type LoadBalancer.
	LoadBalancerPool []string `yaml:"loadBalancerPool,omitempty" json:"loadBalancerPool,omitempty"`
	Storage          Storage  `yaml:"storage,omitempty" json:"storage,omitzero"`
	Git              Git      `yaml:"git,omitempty" json:"git,omitzero"`
	// Mirror is the OCI registry path the platform's upstream charts are
	// read from instead of their Helm repositories:
	// http://HOST[:PORT]/PATH (plain HTTP) or https://HOST[:PORT]/PATH
	// (also written oci://). `cozyctl images mirror --rack` pushes the
	// charts there. Empty: the charts' own repositories.
	Mirror string `yaml:"mirror,omitempty" json:"mirror,omitempty"`
	// Components switch the platform's components on and off by name
	// (docs/platform.md): {linstor: {enabled: false}}. Every component
	// is on unless switched off here.
	Components map[string]Component `yaml:"components,omitempty" json:"components,omitempty"`
	// Values are passed unchanged to the platform chart.
	Values map[string]any `yaml:"values,omitempty" json:"values,omitempty"`
}

// Component is one platform component's settings.
type Component struct {
	// Enabled false leaves the component out; unset is on.
	Enabled *bool `yaml:"enabled,omitempty" json:"enabled,omitempty"`
	// Values are merged over the values the platform gives each of the
	// component's HelmReleases, by HelmRelease name:
	// {cert-manager: {replicaCount: 2}}.
	Values map[string]map[string]any `yaml:"values,omitempty" json:"values,omitempty"`
}

// Storage configures LINSTOR's satellite pools.
type Storage struct {
	// Backend is lvm-thin (default) or zfs.
	Backend string `yaml:"backend,omitempty" json:"backend,omitempty"`
	// Devices are the disks given to the pool on every node (by path).
	Devices []string `yaml:"devices,omitempty" json:"devices,omitempty"`
}

// Git is where Flux reads the platform.
type Git struct {
	URL    string `yaml:"url,omitempty" json:"url,omitempty"`
	Branch string `yaml:"branch,omitempty" json:"branch,omitempty"`
	Path   string `yaml:"path,omitempty" json:"path,omitempty"`
}

// Etcd is what Cozy does with the cluster's etcd besides running it.
type Etcd struct {
	Backups EtcdBackups `yaml:"backups,omitempty" json:"backups,omitzero"`
}

// EtcdBackups is the schedule of `cozyctl etcd backup`: a snapshot once
// the newest in the state dir is Every old, the newest Keep kept.
type EtcdBackups struct {
	// Every is a duration (6h, 30m); empty means no schedule.
	Every string `yaml:"every,omitempty" json:"every,omitempty"`
	// Keep is how many snapshots are kept (default 7).
	Keep int `yaml:"keep,omitempty" json:"keep,omitempty"`
}

// Interval is Every as a duration; 0 without a schedule (validated by
// Load).
func (b EtcdBackups) Interval() time.Duration {
	d, _ := time.ParseDuration(b.Every)
	return d
}
