package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"cozy.dev/cozy/internal/ociimage"
)

// fakeInputs lays out, in temporary directories, the files the packer
// reads: an extracted Debian tree with what the image names, the built
// binaries and Kube-OVN's dist/images.
func fakeInputs(t *testing.T) inputs {
	t.Helper()
	in := inputs{out: filepath.Join(t.TempDir(), "layout"), debs: t.TempDir(), bin: t.TempDir(), dist: t.TempDir(), tag: "v1.15.4"}
	write := func(root, path string) {
		p := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(path), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write(in.debs, "usr/share/base-passwd/passwd.master")
	write(in.debs, "usr/share/base-passwd/group.master")
	for path := range debianCaps {
		write(in.debs, path)
	}
	for link, target := range alternatives {
		if !filepath.IsAbs(target) {
			write(in.debs, filepath.Join(filepath.Dir(link), target))
		}
	}
	for _, b := range []string{"kube-ovn", "kube-ovn-cmd", "kube-ovn-daemon", "kube-ovn-controller", "loopback", "portmap", "macvlan", "kubectl"} {
		write(in.bin, b)
	}
	for _, f := range []string{"start-db.sh", "start-controller.sh", "kubectl-ko", "01-kube-ovn.conflist", "grace_stop_ovn_controller", "logrotate/ovn"} {
		write(in.dist, f)
	}
	return in
}

func TestImage(t *testing.T) {
	im, err := image(fakeInputs(t))
	if err != nil {
		t.Fatal(err)
	}
	if im.Ref != "docker.io/kubeovn/kube-ovn:v1.15.4" || strings.Join(im.Config.Entrypoint, " ") != "/usr/bin/dumb-init --" || im.Config.WorkingDir != "/kube-ovn" {
		t.Errorf("image %s, entrypoint %q in %s: want upstream's name, dumb-init, /kube-ovn", im.Ref, im.Config.Entrypoint, im.Config.WorkingDir)
	}
	if !slices.Contains(im.Config.Env, "OVN_DBDIR=/etc/ovn") {
		t.Errorf("env %q: want OVN_DBDIR=/etc/ovn, where start-db.sh looks for the databases", im.Config.Env)
	}
	files := map[string]ociimage.File{}
	for _, l := range im.Layers {
		for _, f := range l.Files {
			files[f.Path] = f
		}
	}
	for _, tc := range []struct {
		path   string
		caps   []uint // the file's capabilities, nil for none
		target string // a symlink's target
	}{
		{path: "/kube-ovn/kube-ovn-daemon", caps: []uint{ociimage.CapNetAdmin, ociimage.CapNetRaw, ociimage.CapNetBindService, ociimage.CapSysAdmin}},
		{path: "/kube-ovn/kube-ovn-controller", caps: []uint{ociimage.CapNetRaw, ociimage.CapNetBindService}},
		{path: "/kube-ovn/kube-ovn-cmd", caps: []uint{ociimage.CapNetBindService}},
		{path: "/kube-ovn/kube-ovn"},
		{path: "/kube-ovn/start-db.sh"},
		{path: "/usr/share/ovn/scripts/grace_stop_ovn_controller"},
		{path: "/etc/logrotate.d/ovn"},
		{path: "/loopback"},
		{path: "/usr/bin/kubectl"},
		{path: "/etc/passwd"},
		{path: "/usr/lib/openvswitch-switch/ovs-vswitchd", caps: []uint{ociimage.CapNetAdmin, ociimage.CapNetBindService, ociimage.CapSysAdmin}},
		{path: "/usr/bin/nice", caps: []uint{ociimage.CapSysNice}},
		{path: "/usr/sbin/ovs-vswitchd", target: "/usr/lib/openvswitch-switch/ovs-vswitchd"},
		{path: "/usr/sbin/iptables", target: "iptables-nft"},
		{path: "/kube-ovn/kube-ovn-monitor", target: "/kube-ovn/kube-ovn-cmd"},
		{path: "/kube-ovn/kube-ovn-pinger", target: "/kube-ovn/kube-ovn-controller"},
	} {
		f, ok := files[tc.path]
		switch {
		case !ok:
			t.Errorf("%s is not in the image", tc.path)
		case tc.target != "":
			if f.Mode.Type() != fs.ModeSymlink || f.Target != tc.target {
				t.Errorf("%s: mode %v, target %q; want a link to %q", tc.path, f.Mode, f.Target, tc.target)
			}
		default:
			want := ""
			if tc.caps != nil {
				want = ociimage.FileCaps(tc.caps...)
			}
			if got := f.Xattrs["security.capability"]; got != want {
				t.Errorf("%s: security.capability %q, want %q", tc.path, got, want)
			}
		}
	}
}

func TestImageRefusesMissingInputs(t *testing.T) {
	for _, tc := range []struct {
		name, remove, want string
	}{
		{"a binary", "bin/kube-ovn-daemon", "kube-ovn-daemon"},
		{"an alternative's target", "debs/usr/sbin/iptables-nft", "alternative /usr/sbin/iptables"},
		{"base-passwd", "debs/usr/share/base-passwd/passwd.master", "base-passwd"},
		{"a script", "dist/kubectl-ko", "kubectl-ko"},
		{"a binary given capabilities", "debs/usr/sbin/ipset", "no file /usr/sbin/ipset"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := fakeInputs(t)
			dir, rest, _ := strings.Cut(tc.remove, "/")
			root := map[string]string{"bin": in.bin, "debs": in.debs, "dist": in.dist}[dir]
			if err := os.Remove(filepath.Join(root, rest)); err != nil {
				t.Fatal(err)
			}
			if _, err := image(in); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("image() = %v, want an error naming %q", err, tc.want)
			}
		})
	}
}
