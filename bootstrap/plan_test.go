package bootstrap

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/bootstrap/talosapi"
	"cozy.dev/cozy/bootstrap/talosconfig"
)

func TestDryRunChangesNothing(t *testing.T) {
	data, err := rack.Example("lab")
	if err != nil {
		t.Fatal(err)
	}
	r, err := rack.Parse(data, "rack.yaml", ".")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "state")
	p, err := DryRun(r, dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the dry run created %s", dir)
	}
	if !strings.HasPrefix(p.Secrets, "new:") || len(p.Nodes) != 4 {
		t.Fatalf("plan: %+v", p)
	}
	want := []struct{ host, role, sel, disk, vip string }{
		{"cp1", "controlplane", "mac=52:54:00:00:00:01", "/dev/sda", "192.168.100.10 on net0"},
		{"cp3", "controlplane", "mac=52:54:00:00:00:03", "first disk with size >= 100GB, type nvme", "192.168.100.10 on net0"},
		{"worker1", "worker", "uuid=4c4c4544-0042-3510-8052-b4c04f333432", "/dev/nvme0n1", ""},
	}
	for _, w := range want {
		var got *PlannedNode
		for i := range p.Nodes {
			if p.Nodes[i].Hostname == w.host {
				got = &p.Nodes[i]
			}
		}
		if got == nil || got.Role != w.role || got.Select != w.sel || got.Disk != w.disk || got.VIP != w.vip {
			t.Errorf("%s: %+v, want %+v", w.host, got, w)
		}
	}
	if got := strings.Join(p.Nodes[3].Addresses, ", "); got != "bond0: 192.168.100.21/24, bond0.200: 10.200.0.21/24" {
		t.Errorf("worker1 addresses %q", got)
	}

	// With a bundle in place, the dry run says it is kept.
	if _, err := talosconfig.Write(r, filepath.Join(dir, TalosDir)); err != nil {
		t.Fatal(err)
	}
	if p, err = DryRun(r, dir); err != nil || !strings.HasPrefix(p.Secrets, "kept:") {
		t.Errorf("with a bundle: %v, %q", err, p.Secrets)
	}
}

func TestCheckLinks(t *testing.T) {
	links := []talosapi.Link{{Name: "eth0", MAC: "52:54:00:00:00:01"}, {Name: "eth1", MAC: "52:54:00:00:00:02"}}
	tests := []struct {
		name    string
		ifaces  []rack.Interface
		wantErr string
	}{
		{"by name", []rack.Interface{{Name: "eth1"}}, ""},
		{"by mac", []rack.Interface{{Name: "net0", MAC: "52:54:00:00:00:02"}}, ""},
		{"bond", []rack.Interface{{Name: "bond0", Bond: &rack.Bond{Links: []string{"eth0"}, MACs: []string{"52:54:00:00:00:02"}}}}, ""},
		{"missing name", []rack.Interface{{Name: "eno1"}}, "link eno1 does not exist; the machine has eth0 (52:54:00:00:00:01), eth1"},
		{"missing mac", []rack.Interface{{Name: "net0", MAC: "52:54:00:00:00:09"}}, "no link has MAC 52:54:00:00:00:09"},
		{"missing bond member", []rack.Interface{{Name: "bond0", Bond: &rack.Bond{Links: []string{"eth7"}}}}, "link eth7 does not exist"},
	}
	for _, tt := range tests {
		err := checkLinks(&rack.Machine{Interfaces: tt.ifaces}, links)
		if (tt.wantErr == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("%s: %v, want %q", tt.name, err, tt.wantErr)
		}
	}
}
