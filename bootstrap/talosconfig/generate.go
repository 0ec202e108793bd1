// Package talosconfig generates a rack's Talos secrets bundle, machine
// configs and talosconfig with Talos's own machinery, never with talosctl.
//
// A machine's config is built in layers, each a Talos config patch, so the
// result reads like what a person would write by hand:
//
//  1. the machinery's defaults for the rack's cluster and Talos version;
//  2. cozy-patch.yaml: what the platform needs on every node (kernel
//     modules, sysctls, CRI and LVM files, no CNI, no kube-proxy), and
//     Talos's flannel with kube-proxy back when the rack's cluster.cni
//     says flannel;
//  3. the machine's own settings from the rack: hostname, install disk and
//     image, links, bonds, VLANs, the VIP, node-IP and etcd subnets;
//  4. the rack's patches for the machine's role, then the machine's own;
//  5. with registries.mirror, a RegistryMirrorConfig per registry host the
//     node pulls from (the rack's MirrorHosts and the hosts of the images
//     the config itself names), endpoint MIRROR/v2/HOST with overridePath:
//     last, so that it also covers images the patches set.
//
// Every config is validated by the machinery for metal before it is
// returned.
package talosconfig

import (
	_ "embed"

	"fmt"
	jsonpatch "github.com/evanphx/json-patch"
	"net/netip"
	"slices"
	"sort"

	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"github.com/siderolabs/talos/pkg/machinery/config"
	coreconfig "github.com/siderolabs/talos/pkg/machinery/config/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configpatcher"
	"github.com/siderolabs/talos/pkg/machinery/config/container"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
	"github.com/siderolabs/talos/pkg/machinery/config/generate"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	"github.com/siderolabs/talos/pkg/machinery/config/machine"
	"github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"
	"github.com/siderolabs/talos/pkg/machinery/config/validation"
	"go.yaml.in/yaml/v3"

	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/internal/imageref"
)

//go:embed cozy-patch.yaml
var cozyPatch []byte

// flannelPatch undoes what cozy-patch.yaml turns off for the platform's
// CNI when the rack asks for Talos's flannel instead (cluster.cni):
// flannel, and kube-proxy, which nothing else replaces then.
var flannelPatch = []byte(`cluster:
  network:
    cni:
      name: flannel
  proxy:
    disabled: false
`)

// Generator builds configs for one rack with one secrets bundle.
type Generator struct {
	Rack    *rack.Rack
	Secrets *secrets.Bundle
}

// Contract is the config version contract for the rack's Talos version.
func Contract(r *rack.Rack) (*config.VersionContract, error) {
	c, err := config.ParseContractFromVersion(r.Talos.Version)
	if err != nil {
		return nil, fmt.Errorf("talos.version %q: %w", r.Talos.Version, err)
	}
	return c, nil
}

func (g *Generator) input(m *rack.Machine) (*generate.Input, error) {
	r := g.Rack
	contract, err := Contract(r)
	if err != nil {
		return nil, err
	}
	image, err := r.InstallImage()
	if err != nil {
		return nil, err
	}
	opts := []generate.Option{
		generate.WithVersionContract(contract),
		generate.WithSecretsBundle(g.Secrets),
		generate.WithEndpointList(g.TalosEndpoints()),
		generate.WithInstallImage(image),
		generate.WithDNSDomain(r.Cluster.DNSDomain),
		generate.WithAllowSchedulingOnControlPlanes(*r.Cluster.AllowSchedulingOnControlPlanes),
	}
	if m != nil && m.Install.Disk != "" {
		opts = append(opts, generate.WithInstallDisk(m.Install.Disk))
	}
	if r.Cluster.VIP != "" {
		opts = append(opts, generate.WithAdditionalSubjectAltNames([]string{r.Cluster.VIP}))
	}
	hosts := make([]string, 0, len(r.Registries.Mirrors))
	for h := range r.Registries.Mirrors {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	for _, h := range hosts {
		opts = append(opts, generate.WithRegistryMirror(h, r.Registries.Mirrors[h]...))
	}
	in, err := generate.NewInput(r.Metadata.Name, r.Cluster.Endpoint, r.Cluster.KubernetesVersion, opts...)
	if err != nil {
		return nil, fmt.Errorf("talos generate input: %w", err)
	}
	in.PodNet = slices.Clone(r.Cluster.PodSubnets)
	in.ServiceNet = slices.Clone(r.Cluster.ServiceSubnets)
	return in, nil
}

// TalosEndpoints are the control planes' static addresses, where talosctl
// and bootstrap reach the Talos API. (Not the VIP: it is only up once etcd
// is.) Empty when control planes get their addresses by DHCP; bootstrap
// then uses the addresses discovery finds.
func (g *Generator) TalosEndpoints() []string {
	var eps []string
	for _, m := range g.Rack.ControlPlanes() {
		if a := m.StaticAddress(); a.IsValid() {
			eps = append(eps, a.String())
		}
	}
	return eps
}

// MachineConfig returns the validated config of machine m, as YAML.
func (g *Generator) MachineConfig(m *rack.Machine) ([]byte, error) {
	cfg, err := g.Config(m)
	if err != nil {
		return nil, err
	}
	return cfg.EncodeBytes(encoder.WithComments(encoder.CommentsDisabled))
}

// Config returns the validated config of machine m.
func (g *Generator) Config(m *rack.Machine) (config.Provider, error) {
	cfg, err := g.machineConfig(m)
	if err != nil {
		return nil, fmt.Errorf("config for %s: %w", m.Hostname, err)
	}
	return cfg, nil
}

func (g *Generator) machineConfig(m *rack.Machine) (config.Provider, error) {
	in, err := g.input(m)
	if err != nil {
		return nil, err
	}
	typ := machine.TypeWorker
	if m.Role == rack.RoleControlPlane {
		typ = machine.TypeControlPlane
	}
	base, err := in.Config(typ)
	if err != nil {
		return nil, fmt.Errorf("generate: %w", err)
	}
	own, err := g.machinePatch(m)
	if err != nil {
		return nil, err
	}
	layers := [][]byte{cozyPatch}
	if g.Rack.Cluster.CNI == rack.CNIFlannel {
		layers = append(layers, flannelPatch)
	}
	layers = append(layers, own)
	for _, p := range g.Rack.Patches {
		if p.Target == "all" || p.Target == m.Role {
			layers = append(layers, p.Content())
		}
	}
	for _, p := range m.Patches {
		layers = append(layers, p.Content())
	}
	cfg := base
	for i, l := range layers {
		p, err := configpatcher.LoadPatch(l)
		if err != nil {
			return nil, fmt.Errorf("patch %d: %w", i, err)
		}
		if cfg, err = applyPatch(cfg, p); err != nil {
			return nil, fmt.Errorf("patch %d: %w", i, err)
		}
	}
	if g.Rack.Registries.Mirror != "" {
		l, err := mirrorPatch(g.Rack, cfg)
		if err != nil {
			return nil, err
		}
		p, err := configpatcher.LoadPatch(l)
		if err != nil {
			return nil, fmt.Errorf("registries.mirror: %w", err)
		}
		if cfg, err = applyPatch(cfg, p); err != nil {
			return nil, fmt.Errorf("registries.mirror: %w", err)
		}
	}
	if _, err := cfg.Validate(metal{}, validationOptions...); err != nil {
		return nil, fmt.Errorf("the config is not valid for Talos: %w", err)
	}
	return cfg, nil
}

// mirrorPatch is layer 5: registries.mirror as one RegistryMirrorConfig
// document per registry host. generate.WithRegistryMirror cannot set
// overridePath, which the mirror's naming needs (the path already holds
// /v2/HOST), so the documents come as a patch.
func mirrorPatch(r *rack.Rack, cfg config.Config) ([]byte, error) {
	hosts := r.MirrorHosts()
	for _, img := range Images(cfg) {
		ref, err := imageref.Parse(img.Ref)
		if err != nil {
			return nil, fmt.Errorf("registries.mirror: the %s image: %w", img.Component, err)
		}
		if !slices.Contains(hosts, ref.Host) {
			if _, ok := r.Registries.Mirrors[ref.Host]; ok {
				return nil, fmt.Errorf("registries.mirror covers %s (the %s image %s) and registries.mirrors names it too: keep one of the two", ref.Host, img.Component, img.Ref)
			}
			hosts = append(hosts, ref.Host)
		}
	}
	slices.Sort(hosts)
	var out []byte
	for i, h := range hosts {
		d, err := yaml.Marshal(doc("RegistryMirrorConfig", map[string]any{
			"name":      h,
			"endpoints": []map[string]any{{"url": imageref.MirrorEndpoint(r.Registries.Mirror, h), "overridePath": true}},
		}))
		if err != nil {
			return nil, err
		}
		if i > 0 {
			out = append(out, "---\n"...)
		}
		out = append(out, d...)
	}
	return out, nil
}

// applyPatch applies one patch. Talos applies JSON 6902 patches only to
// single-document configs, so Cozy applies them to the v1alpha1 document
// (paths such as /machine/install/disk, as with talosctl) and keeps the
// other documents as they are.
func applyPatch(cfg config.Provider, p configpatcher.Patch) (config.Provider, error) {
	if _, ok := p.(jsonpatch.Patch); !ok {
		out, err := configpatcher.Apply(configpatcher.WithConfig(cfg), []configpatcher.Patch{p})
		if err != nil {
			return nil, err
		}
		return out.Config()
	}
	var others []coreconfig.Document
	for _, d := range cfg.Documents() {
		if _, ok := d.(*v1alpha1.Config); !ok {
			others = append(others, d)
		}
	}
	single := container.NewV1Alpha1(cfg.RawV1Alpha1().DeepCopy())
	out, err := configpatcher.Apply(configpatcher.WithConfig(single), []configpatcher.Patch{p})
	if err != nil {
		return nil, err
	}
	patched, err := out.Config()
	if err != nil {
		return nil, err
	}
	return container.New(append([]coreconfig.Document{patched.RawV1Alpha1()}, others...)...)
}

// machinePatch is layer 3: the machine's settings from the rack, as a
// multi-document strategic merge patch.
func (g *Generator) machinePatch(m *rack.Machine) ([]byte, error) {
	r := g.Rack
	subnet := nodeSubnet(r, m)
	mc := map[string]any{
		"kubelet": map[string]any{"nodeIP": map[string]any{"validSubnets": []string{subnet}}},
	}
	install := map[string]any{"wipe": m.Install.Wipe}
	if s := m.Install.DiskSelector; s != nil {
		install["diskSelector"] = s
	}
	mc["install"] = install
	docs := []any{map[string]any{"machine": mc}}
	if m.Role == rack.RoleControlPlane {
		docs[0].(map[string]any)["cluster"] = map[string]any{
			"etcd": map[string]any{"advertisedSubnets": []string{subnet}},
		}
	}
	docs = append(docs, doc("HostnameConfig", map[string]any{"hostname": m.Hostname, "auto": "off"}))
	docs = append(docs, linkDocs(r, m)...)
	if len(r.Network.DNS) > 0 {
		var ns []map[string]string
		for _, d := range r.Network.DNS {
			ns = append(ns, map[string]string{"address": d})
		}
		docs = append(docs, doc("ResolverConfig", map[string]any{"nameservers": ns}))
	}
	var out []byte
	for i, d := range docs {
		b, err := yaml.Marshal(d)
		if err != nil {
			return nil, err
		}
		if i > 0 {
			out = append(out, "---\n"...)
		}
		out = append(out, b...)
	}
	return out, nil
}

// nodeSubnet is where the kubelet and etcd pick their address from: the
// subnet of the machine's first static address, else the provisioning
// network.
func nodeSubnet(r *rack.Rack, m *rack.Machine) string {
	for _, in := range m.Interfaces {
		for _, a := range in.Addresses {
			if p, err := netip.ParsePrefix(a); err == nil {
				return p.Masked().String()
			}
		}
	}
	return r.Network.Subnet
}

func doc(kind string, fields map[string]any) map[string]any {
	fields["apiVersion"] = "v1alpha1"
	fields["kind"] = kind
	return fields
}

// linkDocs turns the machine's interfaces into Talos network documents:
// aliases for NICs chosen by MAC, links, bonds, VLANs, DHCP and the VIP.
func linkDocs(r *rack.Rack, m *rack.Machine) []any {
	var docs []any
	alias := func(name, mac string) {
		docs = append(docs, doc("LinkAliasConfig", map[string]any{
			"name":     name,
			"selector": map[string]any{"match": fmt.Sprintf("mac(link.permanent_addr) == %q", mac)},
		}))
	}
	addressing := func(fields map[string]any, addrs []string, gateway string, mtu int) map[string]any {
		fields["up"] = true
		if len(addrs) > 0 {
			var as []map[string]string
			for _, a := range addrs {
				as = append(as, map[string]string{"address": a})
			}
			fields["addresses"] = as
		}
		if gateway != "" {
			fields["routes"] = []map[string]string{{"gateway": gateway}}
		}
		if mtu != 0 {
			fields["mtu"] = mtu
		}
		return fields
	}
	dhcp := func(link string) {
		docs = append(docs, doc("DHCPv4Config", map[string]any{"name": link}))
	}
	if len(m.Interfaces) == 0 && m.MAC != "" {
		// No interfaces in the rack: the NIC the machine netboots from,
		// by DHCP, as it was in maintenance mode.
		alias(rack.ProvisioningLink, m.MAC)
		docs = append(docs, doc("LinkConfig", map[string]any{"name": rack.ProvisioningLink, "up": true}))
		dhcp(rack.ProvisioningLink)
	}
	for _, in := range m.Interfaces {
		if in.MAC != "" {
			alias(in.Name, in.MAC)
		}
		if b := in.Bond; b != nil {
			links := slices.Clone(b.Links)
			for k, mac := range b.MACs {
				name := fmt.Sprintf("%sm%d", in.Name, k)
				alias(name, mac)
				links = append(links, name)
			}
			docs = append(docs, doc("BondConfig", addressing(map[string]any{
				"name": in.Name, "links": links, "bondMode": b.Mode,
			}, in.Addresses, in.Gateway, in.MTU)))
		} else {
			docs = append(docs, doc("LinkConfig", addressing(map[string]any{"name": in.Name}, in.Addresses, in.Gateway, in.MTU)))
		}
		if in.DHCP {
			dhcp(in.Name)
		}
		for _, v := range in.VLANs {
			name := fmt.Sprintf("%s.%d", in.Name, v.ID)
			docs = append(docs, doc("VLANConfig", addressing(map[string]any{
				"name": name, "parent": in.Name, "vlanID": v.ID,
			}, v.Addresses, v.Gateway, v.MTU)))
			if v.DHCP {
				dhcp(name)
			}
		}
	}
	if m.Role == rack.RoleControlPlane && r.Cluster.VIP != "" {
		link := r.VIPLink(m)
		if link == rack.ProvisioningLink && len(m.Interfaces) > 0 {
			alias(link, m.MAC) // interfaces are listed, but not the netboot NIC
			docs = append(docs, doc("LinkConfig", map[string]any{"name": link, "up": true}))
			dhcp(link)
		}
		docs = append(docs, doc("Layer2VIPConfig", map[string]any{"name": r.Cluster.VIP, "link": link}))
	}
	return docs
}

// Talosconfig returns the client config for the rack's cluster: an admin
// certificate signed by the OS CA, with the control planes as endpoints.
func (g *Generator) Talosconfig() (*clientconfig.Config, error) {
	in, err := g.input(nil)
	if err != nil {
		return nil, err
	}
	return in.Talosconfig()
}

// metal is the runtime mode configs are validated for: bare metal, which
// installs to disk and does not run in a container.
type metal struct{}

func (metal) String() string        { return "metal" }
func (metal) RequiresInstall() bool { return true }
func (metal) InContainer() bool     { return false }

// validationOptions: strict, so warnings (deprecated fields, odd values)
// fail generation instead of surprising a node later.
var validationOptions = []validation.Option{validation.WithStrict()}
