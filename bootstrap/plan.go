package bootstrap

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"

	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/bootstrap/talosconfig"
)

// PlannedNode is what a dry run says will happen to one machine.
type PlannedNode struct {
	Hostname string `json:"hostname"`
	Role     string `json:"role"`
	// Select is how the machine is recognised: mac=... or uuid=...
	Select string `json:"select"`
	// Disk is the install disk, or the selector Talos will resolve.
	Disk      string   `json:"disk"`
	Addresses []string `json:"addresses"`
	VIP       string   `json:"vip,omitempty"`
	// Config is the machine config file bootstrap will write and apply.
	Config string `json:"config"`
}

// Plan is the dry run of a bootstrap: what each machine gets, with every
// config generated and validated, and nothing written.
type Plan struct {
	Cluster      string        `json:"cluster"`
	Endpoint     string        `json:"endpoint"`
	Talos        string        `json:"talosVersion"`
	Kubernetes   string        `json:"kubernetesVersion"`
	InstallImage string        `json:"installImage"`
	Secrets      string        `json:"secrets"`
	Nodes        []PlannedNode `json:"nodes"`
}

// DryRun plans the bootstrap of r into stateDir. Configs are generated
// with the secrets bundle already there, or with a throwaway one that is
// never written, so they are validated exactly as a real run would.
func DryRun(r *rack.Rack, stateDir string) (*Plan, error) {
	talosDir := filepath.Join(stateDir, TalosDir)
	secretsPath := filepath.Join(talosDir, talosconfig.SecretsFile)
	b, err := secrets.LoadBundle(secretsPath)
	note := "kept: " + secretsPath
	if errors.Is(err, fs.ErrNotExist) {
		contract, cerr := talosconfig.Contract(r)
		if cerr != nil {
			return nil, cerr
		}
		if b, err = secrets.NewBundle(secrets.NewFixedClock(time.Now()), contract); err != nil {
			return nil, err
		}
		note = "new: would be generated at " + secretsPath
	} else if err != nil {
		return nil, fmt.Errorf("secrets bundle %s: %w", secretsPath, err)
	}
	img, err := r.InstallImage()
	if err != nil {
		return nil, err
	}
	p := &Plan{Cluster: r.Metadata.Name, Endpoint: r.Cluster.Endpoint, Talos: r.Talos.Version,
		Kubernetes: r.Cluster.KubernetesVersion, InstallImage: img, Secrets: note}
	g := &talosconfig.Generator{Rack: r, Secrets: b}
	for i := range r.Machines {
		m := &r.Machines[i]
		if _, err := g.MachineConfig(m); err != nil {
			return nil, err
		}
		n := PlannedNode{Hostname: m.Hostname, Role: m.Role, Config: filepath.Join(talosDir, m.Hostname+".yaml")}
		if m.MAC != "" {
			n.Select = "mac=" + m.MAC
		} else {
			n.Select = "uuid=" + m.UUID
		}
		n.Disk = m.Install.Disk
		if s := m.Install.DiskSelector; s != nil {
			n.Disk = describeSelector(s)
		}
		for _, in := range m.Interfaces {
			n.Addresses = append(n.Addresses, addressing(in.Name, in.Addresses, in.DHCP)...)
			for _, v := range in.VLANs {
				n.Addresses = append(n.Addresses, addressing(fmt.Sprintf("%s.%d", in.Name, v.ID), v.Addresses, v.DHCP)...)
			}
		}
		if len(m.Interfaces) == 0 {
			n.Addresses = []string{rack.ProvisioningLink + ": dhcp"}
		}
		if m.Role == rack.RoleControlPlane && r.Cluster.VIP != "" {
			n.VIP = r.Cluster.VIP + " on " + r.VIPLink(m)
		}
		p.Nodes = append(p.Nodes, n)
	}
	return p, nil
}

func addressing(link string, addrs []string, dhcp bool) []string {
	var out []string
	for _, a := range addrs {
		out = append(out, link+": "+a)
	}
	if dhcp {
		out = append(out, link+": dhcp")
	}
	return out
}

func describeSelector(s *rack.DiskSelector) string {
	var parts []string
	for _, kv := range [][2]string{{"size", s.Size}, {"type", s.Type}, {"model", s.Model}, {"serial", s.Serial}, {"busPath", s.BusPath}} {
		if kv[1] != "" {
			parts = append(parts, kv[0]+" "+kv[1])
		}
	}
	return "first disk with " + strings.Join(parts, ", ")
}

// Header and Rows print a plan as a table.
func (p *Plan) Header() []string {
	return []string{"NODE", "ROLE", "SELECTED BY", "INSTALL DISK", "ADDRESSES", "VIP", "CONFIG"}
}

func (p *Plan) Rows() [][]string {
	var rows [][]string
	for _, n := range p.Nodes {
		vip := n.VIP
		if vip == "" {
			vip = "-"
		}
		rows = append(rows, []string{n.Hostname, n.Role, n.Select, n.Disk, strings.Join(n.Addresses, ", "), vip, n.Config})
	}
	return rows
}
