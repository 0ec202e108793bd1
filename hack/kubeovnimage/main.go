// Command kubeovnimage packs Kube-OVN's image, docker.io/kubeovn/kube-ovn,
// into an OCI image layout: Debian's Open vSwitch and OVN with the tools
// Kube-OVN's scripts run, then Kube-OVN's binaries and scripts as its
// dist/images/Dockerfile lays them out. hack/kube-ovn.sh builds the
// binaries, extracts the Debian packages and runs it.
package main

import (
	"flag"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"cozy.dev/cozy/internal/ociimage"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "kubeovnimage:", err)
		os.Exit(1)
	}
}

type inputs struct {
	out, debs, bin, dist, tag string
}

func run() error {
	var in inputs
	flag.StringVar(&in.out, "o", "", "OCI image layout directory to write (must not exist)")
	flag.StringVar(&in.debs, "debs", "", "tree where the Debian packages were extracted (dpkg-deb -x)")
	flag.StringVar(&in.bin, "bin", "", "directory of kube-ovn, kube-ovn-cmd, kube-ovn-daemon, kube-ovn-controller, loopback, portmap, macvlan and kubectl")
	flag.StringVar(&in.dist, "dist", "", "the dist/images directory of Kube-OVN's module")
	flag.StringVar(&in.tag, "tag", "", "the image's tag (v1.15.4)")
	flag.Parse()
	for name, v := range map[string]string{"-o": in.out, "-debs": in.debs, "-bin": in.bin, "-dist": in.dist, "-tag": in.tag} {
		if v == "" {
			flag.Usage()
			return fmt.Errorf("%s is required", name)
		}
	}
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	im, err := image(in)
	if err != nil {
		return err
	}
	return ociimage.WriteNewLayout(in.out, os.Stderr, im)
}

// debianCaps are the file capabilities Kube-OVN's Dockerfile.base gives
// Debian's binaries with setcap, for its containers that run as 65534:
// path in the image (the file, not a link to it) → capabilities.
var debianCaps = map[string][]uint{
	"/usr/sbin/ovsdb-server":                   {ociimage.CapNetBindService},
	"/usr/lib/openvswitch-switch/ovs-vswitchd": {ociimage.CapNetAdmin, ociimage.CapNetBindService, ociimage.CapSysAdmin},
	"/usr/bin/ovs-dpctl":                       {ociimage.CapNetAdmin},
	"/usr/sbin/conntrack":                      {ociimage.CapNetAdmin},
	"/usr/sbin/ethtool":                        {ociimage.CapNetAdmin},
	"/usr/bin/ip":                              {ociimage.CapNetAdmin},
	"/usr/sbin/ipset":                          {ociimage.CapNetAdmin},
	"/usr/sbin/xtables-nft-multi":              {ociimage.CapNetAdmin, ociimage.CapNetRaw},
	"/usr/sbin/xtables-legacy-multi":           {ociimage.CapNetAdmin, ociimage.CapNetRaw},
	"/usr/bin/nsenter":                         {ociimage.CapSysAdmin},
	"/usr/sbin/sysctl":                         {ociimage.CapSysAdmin},
	"/usr/bin/kmod":                            {ociimage.CapSysModule},
	"/usr/bin/nice":                            {ociimage.CapSysNice},
}

// alternatives are the links Debian's maintainer scripts make with
// update-alternatives, which dpkg-deb -x does not run: ovs-vswitchd
// without DPDK, and iptables with the nf_tables backend, as Talos's
// kubelet and the lab's kube-proxy use.
// (Kube-OVN's image installs iptables-wrapper, which picks legacy or
// nft at run time from the rules it finds; not here.)
var alternatives = map[string]string{
	"/usr/sbin/iptables":          "iptables-nft",
	"/usr/sbin/iptables-save":     "iptables-nft-save",
	"/usr/sbin/iptables-restore":  "iptables-nft-restore",
	"/usr/sbin/ip6tables":         "ip6tables-nft",
	"/usr/sbin/ip6tables-save":    "ip6tables-nft-save",
	"/usr/sbin/ip6tables-restore": "ip6tables-nft-restore",
	"/usr/bin/awk":                "mawk",
	"/usr/sbin/ovs-vswitchd":      "/usr/lib/openvswitch-switch/ovs-vswitchd",
	"/usr/bin/which":              "which.debianutils",
}

func image(in inputs) (ociimage.Image, error) {
	debian, err := ociimage.DirLayer(in.debs, "Debian trixie: Open vSwitch, OVN and the tools Kube-OVN's scripts run")
	if err != nil {
		return ociimage.Image{}, err
	}
	given := map[string]bool{}
	for i, f := range debian.Files {
		if caps, ok := debianCaps[f.Path]; ok && f.Mode.IsRegular() {
			debian.Files[i].Xattrs = map[string]string{"security.capability": ociimage.FileCaps(caps...)}
			given[f.Path] = true
		}
	}
	for _, p := range slices.Sorted(maps.Keys(debianCaps)) {
		if !given[p] {
			return ociimage.Image{}, fmt.Errorf("no file %s in the Debian packages to give its capabilities to", p)
		}
	}
	system, err := systemFiles(in.debs)
	if err != nil {
		return ociimage.Image{}, err
	}
	kubeovn, err := kubeOVNFiles(in)
	if err != nil {
		return ociimage.Image{}, err
	}
	return ociimage.Image{
		Ref: "docker.io/kubeovn/kube-ovn:" + in.tag, Arch: "amd64",
		// Dated at the epoch: the same inputs give the same digest.
		Created: time.Unix(0, 0),
		Layers: []ociimage.Layer{debian,
			{CreatedBy: "what Debian's maintainer scripts would make; the directories Kube-OVN's image makes", Files: system},
			{CreatedBy: "Kube-OVN " + in.tag + " (CGO_ENABLED=0), its scripts, the CNI plugins, kubectl", Files: kubeovn}},
		Config: ocispec.ImageConfig{
			// Debian's ovn-ctl keeps the databases in /var/lib/ovn;
			// Kube-OVN's start-db.sh looks for them in /etc/ovn, where
			// its own build of OVN keeps them and its chart mounts the
			// host's directory.
			Env:        []string{ociimage.EnvPath, "OVN_DBDIR=/etc/ovn"},
			WorkingDir: "/kube-ovn",
			Entrypoint: []string{"/usr/bin/dumb-init", "--"},
			Labels: map[string]string{
				"org.opencontainers.image.version":     in.tag,
				"org.opencontainers.image.source":      "github.com/kubeovn/kube-ovn@" + in.tag,
				"org.opencontainers.image.description": "built from source by cozy hack/kube-ovn.sh, with Debian trixie's Open vSwitch and OVN",
			},
		},
	}, nil
}

// systemFiles are what an installed Debian system has that extracting
// its packages does not give: the accounts base-passwd's postinst
// writes, the alternatives' links, and the run directories Kube-OVN's
// Dockerfile.base makes.
func systemFiles(debs string) ([]ociimage.File, error) {
	var files []ociimage.File
	for _, f := range []struct{ master, path string }{
		{"usr/share/base-passwd/passwd.master", "/etc/passwd"},
		{"usr/share/base-passwd/group.master", "/etc/group"},
	} {
		src := filepath.Join(debs, f.master)
		if _, err := os.Stat(src); err != nil {
			return nil, fmt.Errorf("base-passwd: %w", err)
		}
		files = append(files, ociimage.File{Path: f.path, Mode: 0o644, Source: src})
	}
	for _, link := range slices.Sorted(maps.Keys(alternatives)) {
		target := alternatives[link]
		resolved := target
		if !filepath.IsAbs(target) {
			resolved = filepath.Join(filepath.Dir(link), target)
		}
		if _, err := os.Stat(filepath.Join(debs, resolved)); err != nil {
			return nil, fmt.Errorf("alternative %s: %w", link, err)
		}
		files = append(files, ociimage.File{Path: link, Mode: fs.ModeSymlink | 0o777, Target: target})
	}
	for _, d := range []string{"/var/run/openvswitch", "/var/run/ovn", "/etc/openvswitch", "/etc/ovn", "/var/log/openvswitch", "/var/log/ovn", "/var/log/kube-ovn", "/etc/cni/net.d", "/opt/cni/bin", "/tmp"} {
		mode := fs.ModeDir | 0o755
		if d == "/tmp" {
			mode = fs.ModeDir | fs.ModeSticky | 0o777
		}
		files = append(files, ociimage.File{Path: d, Mode: mode})
	}
	return files, nil
}

// kubeOVNFiles lay out Kube-OVN's binaries and scripts as its
// dist/images/Dockerfile does, with its setcap capabilities.
func kubeOVNFiles(in inputs) ([]ociimage.File, error) {
	var files []ociimage.File
	add := func(path string, mode fs.FileMode, src string, caps ...uint) error {
		if _, err := os.Stat(src); err != nil {
			return err
		}
		f := ociimage.File{Path: path, Mode: mode, Source: src}
		if len(caps) > 0 {
			f.Xattrs = map[string]string{"security.capability": ociimage.FileCaps(caps...)}
		}
		files = append(files, f)
		return nil
	}
	// COPY *.sh kubectl-ko 01-kube-ovn.conflist /kube-ovn/
	scripts, err := filepath.Glob(filepath.Join(in.dist, "*.sh"))
	if err != nil {
		return nil, err
	}
	if len(scripts) == 0 {
		return nil, fmt.Errorf("no scripts in %s", in.dist)
	}
	for _, s := range append(scripts, filepath.Join(in.dist, "kubectl-ko")) {
		if err := add("/kube-ovn/"+filepath.Base(s), 0o755, s); err != nil {
			return nil, err
		}
	}
	if err := add("/kube-ovn/01-kube-ovn.conflist", 0o644, filepath.Join(in.dist, "01-kube-ovn.conflist")); err != nil {
		return nil, err
	}
	if err := add("/usr/share/ovn/scripts/grace_stop_ovn_controller", 0o755, filepath.Join(in.dist, "grace_stop_ovn_controller")); err != nil {
		return nil, err
	}
	rotate, err := filepath.Glob(filepath.Join(in.dist, "logrotate", "*"))
	if err != nil {
		return nil, err
	}
	for _, r := range rotate {
		if err := add("/etc/logrotate.d/"+filepath.Base(r), 0o644, r); err != nil {
			return nil, err
		}
	}
	bin := func(name string) string { return filepath.Join(in.bin, name) }
	for _, b := range []struct {
		path, name string
		caps       []uint
	}{
		{"/kube-ovn/kube-ovn", "kube-ovn", nil},
		{"/kube-ovn/kube-ovn-cmd", "kube-ovn-cmd", []uint{ociimage.CapNetBindService}},
		{"/kube-ovn/kube-ovn-controller", "kube-ovn-controller", []uint{ociimage.CapNetRaw, ociimage.CapNetBindService}},
		{"/kube-ovn/kube-ovn-daemon", "kube-ovn-daemon", []uint{ociimage.CapNetAdmin, ociimage.CapNetRaw, ociimage.CapNetBindService, ociimage.CapSysAdmin}},
		// Dockerfile.base: the CNI plugins at /, kubectl in /usr/bin.
		{"/loopback", "loopback", nil},
		{"/portmap", "portmap", nil},
		{"/macvlan", "macvlan", nil},
		{"/usr/bin/kubectl", "kubectl", nil},
	} {
		if err := add(b.path, 0o755, bin(b.name), b.caps...); err != nil {
			return nil, err
		}
	}
	for link, target := range map[string]string{
		"kube-ovn-monitor": "kube-ovn-cmd", "kube-ovn-speaker": "kube-ovn-cmd", "kube-ovn-webhook": "kube-ovn-cmd",
		"kube-ovn-leader-checker": "kube-ovn-cmd", "kube-ovn-ic-controller": "kube-ovn-cmd", "kube-ovn-pinger": "kube-ovn-controller",
	} {
		files = append(files, ociimage.File{Path: "/kube-ovn/" + link, Mode: fs.ModeSymlink | 0o777, Target: "/kube-ovn/" + target})
	}
	slices.SortFunc(files, func(a, b ociimage.File) int { return strings.Compare(a.Path, b.Path) })
	return files, nil
}
