package talosnode

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/resource/meta"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/cosi-project/runtime/pkg/state/impl/inmem"
	"github.com/cosi-project/runtime/pkg/state/impl/namespaced"
	coreconfig "github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/nethelpers"
	"github.com/siderolabs/talos/pkg/machinery/resources/block"
	configres "github.com/siderolabs/talos/pkg/machinery/resources/config"
	"github.com/siderolabs/talos/pkg/machinery/resources/hardware"
	"github.com/siderolabs/talos/pkg/machinery/resources/network"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
)

// newState is the node's resource store for one boot: in memory, one
// collection per namespace, as machined's.
func newState() state.State {
	return state.WrapCore(namespaced.NewState(inmem.Build))
}

// bootResources are the resources a node has from the moment it boots,
// in maintenance and configured mode alike: what Talos's controllers
// publish about the hardware, the network, the hostname and the version.
// Each carries the ID and namespace Talos gives it.
func bootResources(c Config, hostname, domainname, talosVersion string) []resource.Resource {
	var rs []resource.Resource
	for _, d := range c.Disks {
		rs = append(rs, disk(d))
	}

	lo := network.NewLinkStatus(network.NamespaceName, "lo")
	lo.TypedSpec().Index = 1
	lo.TypedSpec().Type = nethelpers.LinkLoopbck
	lo.TypedSpec().Flags = nethelpers.LinkFlags(nethelpers.LinkUp | nethelpers.LinkLoopback | nethelpers.LinkRunning | nethelpers.LinkLowerUp)
	lo.TypedSpec().MTU = 65536
	lo.TypedSpec().OperationalState = nethelpers.OperStateUnknown
	lo.TypedSpec().LinkState = true
	lo.TypedSpec().HardwareAddr = nethelpers.HardwareAddr(make(net.HardwareAddr, 6))
	lo.TypedSpec().BroadcastAddr = nethelpers.HardwareAddr(make(net.HardwareAddr, 6))
	lo.TypedSpec().PermanentAddr = nethelpers.HardwareAddr(make(net.HardwareAddr, 6))
	lo.TypedSpec().QueueDisc = "noqueue"
	rs = append(rs, lo)
	for i, mac := range c.MACs {
		rs = append(rs, link(i, mac))
	}
	if len(c.MACs) > 0 {
		first := network.NewHardwareAddr(network.NamespaceName, network.FirstHardwareAddr)
		first.TypedSpec().Name = linkName(0)
		first.TypedSpec().HardwareAddr = nethelpers.HardwareAddr(c.MACs[0])
		rs = append(rs, first)
	}

	loopback := netip.MustParsePrefix("127.0.0.1/8")
	nodeAddr := netip.PrefixFrom(c.Address, c.PrefixLength)
	rs = append(rs,
		address("lo", 1, loopback, nethelpers.ScopeHost),
		address(linkName(0), 2, nodeAddr, nethelpers.ScopeGlobal),
	)
	for _, id := range []resource.ID{network.NodeAddressDefaultID, network.NodeAddressCurrentID, network.NodeAddressRoutedID, network.NodeAddressAccumulativeID} {
		na := network.NewNodeAddress(network.NamespaceName, id)
		na.TypedSpec().Addresses = []netip.Prefix{nodeAddr}
		rs = append(rs, na)
	}

	hs := network.NewHostnameStatus(network.NamespaceName, network.HostnameID)
	hs.TypedSpec().Hostname = hostname
	hs.TypedSpec().Domainname = domainname
	rs = append(rs, hs)

	si := hardware.NewSystemInformation(hardware.SystemInformationID)
	si.TypedSpec().Manufacturer = "QEMU"
	si.TypedSpec().ProductName = "Standard PC (Q35 + ICH9, 2009)"
	si.TypedSpec().UUID = c.UUID
	si.TypedSpec().WakeUpType = "Power Switch"
	rs = append(rs, si)

	v := runtime.NewVersion()
	v.TypedSpec().Name = "Talos"
	v.TypedSpec().Version = talosVersion
	rs = append(rs, v)
	return rs
}

func disk(d Disk) *block.Disk {
	r := block.NewDisk(block.NamespaceName, d.Name)
	s := r.TypedSpec()
	s.DevPath = "/dev/" + d.Name
	s.SetSize(d.Size)
	s.IOSize = 512
	s.SectorSize = 512
	s.Model = d.Model
	s.Serial = d.Serial
	s.Transport = d.Transport
	s.SubSystem = "/sys/class/block"
	return r
}

// linkName names NICs in order, as the kernel does without predictable
// names; the rack selects NICs by MAC, never by name.
func linkName(i int) string { return fmt.Sprintf("eth%d", i) }

func link(i int, mac net.HardwareAddr) *network.LinkStatus {
	l := network.NewLinkStatus(network.NamespaceName, linkName(i))
	s := l.TypedSpec()
	s.Index = uint32(i + 2)
	s.Type = nethelpers.LinkEther
	s.Kind = ""
	s.Flags = nethelpers.LinkFlags(nethelpers.LinkUp | nethelpers.LinkBroadcast | nethelpers.LinkRunning | nethelpers.LinkMulticast | nethelpers.LinkLowerUp)
	s.HardwareAddr = nethelpers.HardwareAddr(mac)
	s.PermanentAddr = nethelpers.HardwareAddr(mac)
	s.BroadcastAddr = nethelpers.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	s.MTU = 1500
	s.QueueDisc = "pfifo_fast"
	s.OperationalState = nethelpers.OperStateUp
	s.LinkState = true
	s.Driver = "virtio_net"
	s.BusPath = fmt.Sprintf("virtio%d", i)
	return l
}

func address(linkName string, linkIndex uint32, p netip.Prefix, scope nethelpers.Scope) *network.AddressStatus {
	// Talos's ID: link/address.
	a := network.NewAddressStatus(network.NamespaceName, linkName+"/"+p.String())
	s := a.TypedSpec()
	s.Address = p
	s.Local = p.Addr()
	s.LinkIndex = linkIndex
	s.LinkName = linkName
	s.Family = nethelpers.FamilyInet4
	if p.Addr().Is6() {
		s.Family = nethelpers.FamilyInet6
	}
	s.Scope = scope
	s.Flags = nethelpers.AddressFlags(nethelpers.AddressPermanent)
	return a
}

// machineStatus is runtime.MachineStatus "machine": the boot stage and
// whether the node is ready.
func machineStatus(stage runtime.MachineStage, ready bool, unmet ...runtime.UnmetCondition) *runtime.MachineStatus {
	ms := runtime.NewMachineStatus()
	ms.TypedSpec().Stage = stage
	ms.TypedSpec().Status.Ready = ready
	ms.TypedSpec().Status.UnmetConditions = unmet
	return ms
}

// seed creates rs in st, plus the resource definitions talosctl resolves
// type names with (talosctl get disks).
func seed(ctx context.Context, st state.State, rs ...resource.Resource) error {
	types := map[resource.Type]bool{}
	for _, r := range rs {
		if err := st.Create(ctx, r); err != nil {
			return fmt.Errorf("create %s: %w", r.Metadata(), err)
		}
		p, ok := r.(meta.ResourceDefinitionProvider)
		if !ok || types[r.Metadata().Type()] {
			continue
		}
		types[r.Metadata().Type()] = true
		rd, err := meta.NewResourceDefinition(p.ResourceDefinition())
		if err != nil {
			return err
		}
		// Another resource of the type may have created it (put).
		if err := st.Create(ctx, rd); err != nil && !state.IsConflictError(err) {
			return fmt.Errorf("create %s: %w", rd.Metadata(), err)
		}
	}
	return nil
}

// put creates r in st, or replaces the resource of its ID.
func put(ctx context.Context, st state.State, r resource.Resource) error {
	cur, err := st.Get(ctx, r.Metadata())
	if state.IsNotFoundError(err) {
		return seed(ctx, st, r)
	}
	if err != nil {
		return err
	}
	r.Metadata().SetVersion(cur.Metadata().Version())
	return st.Update(ctx, r)
}

// readOnly lets clients read the state and nothing else, as Talos's
// access policy does for every role but os:admin (and Talos lets no one
// write these resources). Sensitive resources (the machine config, with
// the cluster's keys) only os:admin reads, as on Talos.
func readOnly(ctx context.Context, access state.Access) error {
	if !access.Verb.Readonly() {
		return errPermissionDenied
	}
	if access.ResourceType == configres.MachineConfigType && !slices.Contains(roles(ctx), roleAdmin) {
		return errPermissionDenied
	}
	return nil
}

// machineConfigResource is the running config as Talos publishes it
// (MachineConfigs.config.talos.dev, ID v1alpha1): what talosctl
// upgrade-k8s and edit read before they patch a config.
func machineConfigResource(mc coreconfig.Provider) *configres.MachineConfig {
	return configres.NewMachineConfig(mc)
}
