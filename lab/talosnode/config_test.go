package talosnode_test

import (
	"flag"
	"io"
	"net"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"cozy.dev/cozy/lab/talosnode"
)

func TestParseDisk(t *testing.T) {
	tests := []struct {
		in   string
		want talosnode.Disk
		err  string
	}{
		{"vda:20GiB:virtio", talosnode.Disk{Name: "vda", Size: 20 << 30, Transport: "virtio"}, ""},
		{"vda:20GiB", talosnode.Disk{Name: "vda", Size: 20 << 30, Transport: "virtio"}, ""},
		{"nvme0n1:1TB", talosnode.Disk{Name: "nvme0n1", Size: 1e12, Transport: "nvme"}, ""},
		{"sda:500GB:sata:Samsung SSD 870:S5Y1NX0", talosnode.Disk{Name: "sda", Size: 500e9, Transport: "sata", Model: "Samsung SSD 870", Serial: "S5Y1NX0"}, ""},
		{"vda", talosnode.Disk{}, "want NAME:SIZE"},
		{":20GiB", talosnode.Disk{}, "want NAME:SIZE"},
		{"vda:big", talosnode.Disk{}, "not a size"},
		{"vda:0", talosnode.Disk{}, "not a size"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := talosnode.ParseDisk(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestFlags(t *testing.T) {
	mac := func(s string) net.HardwareAddr {
		m, err := net.ParseMAC(s)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	tests := []struct {
		name string
		args []string
		want talosnode.Config
		err  string
	}{
		{
			name: "everything",
			args: []string{"--address", "10.0.0.11/24", "--port", "50010", "--state-dir", "/var/lib/node", "--hostname", "spare",
				"--mac", "52:54:00:00:00:01", "--mac", "52:54:00:00:00:02", "--uuid", "u-1",
				"--disk", "vda:20GiB:virtio", "--disk", "vdb:1TiB", "--etcd", "/bin/etcd", "--kube-apiserver", "/bin/kube-apiserver",
				"--kube-controller-manager", "/bin/kcm", "--kube-scheduler", "/bin/ks", "--kubelet", "/bin/kubelet",
				"--containerd", "/bin/containerd", "--runc", "/sbin/runc", "--cni-bin-dir", "/cni",
				"--platform", "container", "--node-services", "--reboot-delay", "5s", "--reboot", "exit"},
			want: talosnode.Config{
				Address: netip.MustParseAddr("10.0.0.11"), PrefixLength: 24, Port: 50010, StateDir: "/var/lib/node", Hostname: "spare",
				MACs: []net.HardwareAddr{mac("52:54:00:00:00:01"), mac("52:54:00:00:00:02")}, UUID: "u-1",
				Disks: []talosnode.Disk{{Name: "vda", Size: 20 << 30, Transport: "virtio"}, {Name: "vdb", Size: 1 << 40, Transport: "virtio"}},
				Bin: talosnode.Binaries{Etcd: "/bin/etcd", APIServer: "/bin/kube-apiserver", ControllerManager: "/bin/kcm",
					Scheduler: "/bin/ks", Kubelet: "/bin/kubelet", Containerd: "/bin/containerd", Runc: "/sbin/runc", CNIDir: "/cni"},
				Platform: talosnode.PlatformContainer, NodeServices: true, RebootDelay: 5 * time.Second,
				Reboot: talosnode.RebootExit,
			},
		},
		{
			name: "defaults",
			args: []string{"--address", "10.0.0.12", "--state-dir", "d", "--mac", "52:54:00:00:00:03"},
			want: talosnode.Config{
				Address: netip.MustParseAddr("10.0.0.12"), Port: talosnode.DefaultAPIPort, StateDir: "d",
				MACs: []net.HardwareAddr{mac("52:54:00:00:00:03")}, RebootDelay: talosnode.DefaultRebootDelay,
			},
		},
		{name: "bad address", args: []string{"--address", "node1"}, err: "not an IP address"},
		{name: "bad MAC", args: []string{"--mac", "52:54:00"}, err: "not a MAC address"},
		{name: "bad disk", args: []string{"--disk", "vda"}, err: "NAME:SIZE"},
		{name: "bad reboot mode", args: []string{"--reboot", "kexec"}, err: "want process or exit"},
		{name: "bad platform", args: []string{"--platform", "docker"}, err: "want metal or container"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fs := flag.NewFlagSet("cozy-talos-node", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			var got talosnode.Config
			got.RegisterFlags(fs)
			err := fs.Parse(tc.args)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestNewRefusesIncompleteConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  talosnode.Config
		err  string
	}{
		{"no address", talosnode.Config{StateDir: "d", MACs: []net.HardwareAddr{{0x52, 0x54, 0, 0, 0, 1}}}, "address"},
		{"no disk dir", talosnode.Config{Address: netip.MustParseAddr("127.0.0.2"), MACs: []net.HardwareAddr{{0x52, 0x54, 0, 0, 0, 1}}}, "state dir"},
		{"no NIC", talosnode.Config{Address: netip.MustParseAddr("127.0.0.2"), StateDir: "d"}, "at least one NIC"},
		{"unknown reboot mode", talosnode.Config{Address: netip.MustParseAddr("127.0.0.2"), StateDir: "d", MACs: []net.HardwareAddr{{0x52, 0x54, 0, 0, 0, 1}}, Reboot: "kexec"}, "reboot"},
		{"prefix too long", talosnode.Config{Address: netip.MustParseAddr("127.0.0.2"), PrefixLength: 33, StateDir: "d", MACs: []net.HardwareAddr{{0x52, 0x54, 0, 0, 0, 1}}}, "prefix length"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := talosnode.New(tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("New: %v, want an error about %s", err, tc.err)
			}
		})
	}
}
