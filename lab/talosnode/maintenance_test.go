package talosnode_test

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/nethelpers"
	"github.com/siderolabs/talos/pkg/machinery/resources/block"
	"github.com/siderolabs/talos/pkg/machinery/resources/hardware"
	"github.com/siderolabs/talos/pkg/machinery/resources/network"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	"github.com/siderolabs/talos/pkg/machinery/version"
	"google.golang.org/protobuf/types/known/emptypb"

	"cozy.dev/cozy/internal/testing/poll"
)

// TestMaintenance reads a fresh node the way discovery does: with the
// real client, --insecure, through COSI; and checks that what needs
// authentication is refused with Talos's answers.
func TestMaintenance(t *testing.T) {
	addr := loopbackAddress(t)
	cfg := testMachine(t, addr, "52:54:00:00:00:01")
	cfg.Hostname = "talos-abc-def"
	n := startNode(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	c := insecureClient(t, n.endpoint())
	poll.Within(t, 30*time.Second, 100*time.Millisecond, "maintenance API up", func() error {
		_, err := safe.StateGetByID[*runtime.MachineStatus](ctx, insecureClient(t, n.endpoint()).COSI, runtime.MachineStatusID)
		return err
	})

	checks := []struct {
		name  string
		check func(t *testing.T)
	}{
		{"disks", func(t *testing.T) {
			disks, err := safe.StateListAll[*block.Disk](ctx, c.COSI)
			if err != nil {
				t.Fatal(err)
			}
			if disks.Len() != 1 {
				t.Fatalf("%d disks, want 1", disks.Len())
			}
			d := disks.Get(0)
			s := d.TypedSpec()
			if d.Metadata().ID() != "vda" || d.Metadata().Namespace() != block.NamespaceName || s.DevPath != "/dev/vda" ||
				s.Size != 20<<30 || s.PrettySize != "22 GB" || s.Model != "QEMU HARDDISK" || s.Serial != "disk-01" ||
				s.Transport != "virtio" || s.Rotational || s.Readonly || s.CDROM {
				t.Errorf("disk %s/%s: %+v", d.Metadata().Namespace(), d.Metadata().ID(), s)
			}
		}},
		{"links", func(t *testing.T) {
			links, err := safe.StateListAll[*network.LinkStatus](ctx, c.COSI)
			if err != nil {
				t.Fatal(err)
			}
			var physical []*network.LinkStatus
			for l := range links.All() {
				if l.TypedSpec().Physical() {
					physical = append(physical, l)
				}
			}
			if len(physical) != len(cfg.MACs) {
				t.Fatalf("%d physical links, want %d", len(physical), len(cfg.MACs))
			}
			for i, l := range physical {
				s := l.TypedSpec()
				if s.PermanentAddr.String() != cfg.MACs[i].String() || s.HardwareAddr.String() != cfg.MACs[i].String() ||
					s.OperationalState != nethelpers.OperStateUp || !s.LinkState || s.Kind != "" {
					t.Errorf("link %s: %+v", l.Metadata().ID(), s)
				}
			}
		}},
		{"node address", func(t *testing.T) {
			addrs, err := safe.StateListAll[*network.AddressStatus](ctx, c.COSI)
			if err != nil {
				t.Fatal(err)
			}
			want := netip.PrefixFrom(addr, 32)
			found := false
			for a := range addrs.All() {
				found = found || a.TypedSpec().Address == want
			}
			if !found {
				t.Errorf("no address status %s among %d", want, addrs.Len())
			}
		}},
		{"system information", func(t *testing.T) {
			si, err := safe.StateGetByID[*hardware.SystemInformation](ctx, c.COSI, hardware.SystemInformationID)
			if err != nil {
				t.Fatal(err)
			}
			if si.TypedSpec().UUID != cfg.UUID {
				t.Errorf("UUID %q, want %q", si.TypedSpec().UUID, cfg.UUID)
			}
		}},
		{"machine status", func(t *testing.T) {
			ms, err := safe.StateGetByID[*runtime.MachineStatus](ctx, c.COSI, runtime.MachineStatusID)
			if err != nil {
				t.Fatal(err)
			}
			if ms.TypedSpec().Stage != runtime.MachineStageMaintenance || !ms.TypedSpec().Status.Ready {
				t.Errorf("machine status %+v, want maintenance and ready", ms.TypedSpec())
			}
		}},
		{"hostname", func(t *testing.T) {
			hs, err := safe.StateGetByID[*network.HostnameStatus](ctx, c.COSI, network.HostnameID)
			if err != nil {
				t.Fatal(err)
			}
			if hs.TypedSpec().Hostname != "talos-abc-def" {
				t.Errorf("hostname %q", hs.TypedSpec().Hostname)
			}
		}},
		{"version resource", func(t *testing.T) {
			v, err := safe.StateGetByID[*runtime.Version](ctx, c.COSI, "version")
			if err != nil {
				t.Fatal(err)
			}
			if v.TypedSpec().Version != version.Tag || v.TypedSpec().Version != "v1.13.0" {
				t.Errorf("version %q, want %s", v.TypedSpec().Version, version.Tag)
			}
		}},
		{"resources are read-only", func(t *testing.T) {
			err := c.COSI.Create(ctx, block.NewDisk(block.NamespaceName, "sdz"))
			// The COSI client turns PermissionDenied into an owner conflict.
			if err == nil || !strings.Contains(err.Error(), "code = PermissionDenied") {
				t.Errorf("creating a disk: %v, want PermissionDenied", err)
			}
		}},
		{"Version needs a SideroLink peer", func(t *testing.T) {
			_, err := c.Version(ctx)
			if codeOf(err) != "Unimplemented" || !strings.Contains(err.Error(), "API is not implemented in maintenance mode") {
				t.Errorf("Version: %v, want Unimplemented (API is not implemented in maintenance mode)", err)
			}
		}},
		{"Bootstrap is not served", func(t *testing.T) {
			err := c.Bootstrap(ctx, &machine.BootstrapRequest{})
			if codeOf(err) != "Unimplemented" {
				t.Errorf("Bootstrap: %v, want Unimplemented", err)
			}
		}},
		{"Reset is refused", func(t *testing.T) {
			err := c.Reset(ctx, true, true)
			if codeOf(err) != "Unimplemented" {
				t.Errorf("Reset: %v, want Unimplemented", err)
			}
		}},
		{"Kubeconfig is not served", func(t *testing.T) {
			_, err := c.Kubeconfig(ctx)
			if codeOf(err) != "Unimplemented" {
				t.Errorf("Kubeconfig: %v, want Unimplemented", err)
			}
		}},
		{"no Hostname API", func(t *testing.T) {
			_, err := c.MachineClient.Hostname(ctx, &emptypb.Empty{})
			if codeOf(err) != "Unimplemented" {
				t.Errorf("Hostname: %v, want Unimplemented", err)
			}
		}},
	}
	for _, tc := range checks {
		t.Run(tc.name, tc.check)
	}
}
