// Command labimages packs the images every Kubernetes node of the lab
// pulls at bootstrap (pause, CoreDNS, flannel, kube-proxy) and the
// busybox the lab's probe pods run, from binaries built from source and
// files of Debian packages, into one OCI image layout, each image under
// its exact upstream name and tag, for the lab's registry mirror.
// hack/lab-images.sh builds the binaries, fetches and extracts the
// packages, and runs it.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"cozy.dev/cozy/internal/ociimage"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "labimages:", err)
		os.Exit(1)
	}
}

// inputs are the built binaries, the extracted packages and the versions
// the images are named after.
type inputs struct {
	out, debs                                    string
	pause, coredns, flanneld, kubeProxy, runner  string
	kubernetes, pauseTag, corednsTag, flannelTag string
	pauseTalosTag, busyboxTag                    string
}

func run() error {
	var in inputs
	flag.StringVar(&in.out, "o", "", "OCI image layout directory to write (must not exist)")
	flag.StringVar(&in.debs, "debs", "", "tree where the Debian packages were extracted (dpkg-deb -x)")
	flag.StringVar(&in.pause, "pause", "", "static pause binary")
	flag.StringVar(&in.coredns, "coredns", "", "static coredns binary")
	flag.StringVar(&in.flanneld, "flanneld", "", "static flanneld binary")
	flag.StringVar(&in.kubeProxy, "kube-proxy", "", "static kube-proxy binary")
	flag.StringVar(&in.runner, "go-runner", "", "static kube-log-runner binary (the kube-proxy image's /go-runner)")
	flag.StringVar(&in.kubernetes, "kubernetes-version", "", "Kubernetes version of kube-proxy and of pause's source (v1.36.3)")
	flag.StringVar(&in.pauseTag, "pause-tag", "", "pause image tag, the version of its source (3.10.2)")
	flag.StringVar(&in.pauseTalosTag, "pause-talos-tag", "", "the same pause image under the tag Talos's nodes ask for (3.10.1)")
	flag.StringVar(&in.corednsTag, "coredns-tag", "", "CoreDNS image tag (v1.14.2)")
	flag.StringVar(&in.flannelTag, "flannel-tag", "", "flannel image tag (v0.28.4)")
	flag.StringVar(&in.busyboxTag, "busybox-tag", "", "busybox image tag, the version of Debian's busybox-static (1.35.0)")
	flag.Parse()
	for name, v := range map[string]string{
		"-o": in.out, "-debs": in.debs, "-pause": in.pause, "-coredns": in.coredns, "-flanneld": in.flanneld,
		"-kube-proxy": in.kubeProxy, "-go-runner": in.runner, "-kubernetes-version": in.kubernetes,
		"-pause-tag": in.pauseTag, "-pause-talos-tag": in.pauseTalosTag, "-coredns-tag": in.corednsTag, "-flannel-tag": in.flannelTag,
		"-busybox-tag": in.busyboxTag,
	} {
		if v == "" {
			flag.Usage()
			return fmt.Errorf("%s is required", name)
		}
	}
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	images, err := labImages(in)
	if err != nil {
		return err
	}
	if err := ociimage.WriteNewLayout(in.out, io.Discard, images...); err != nil {
		return err
	}
	return summary(os.Stderr, in.out)
}

// summary prints each image of the layout with its layers and size.
func summary(w io.Writer, dir string) error {
	readJSON := func(file string, v any) error {
		data, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			return err
		}
		return json.Unmarshal(data, v)
	}
	var index ocispec.Index
	if err := readJSON(ocispec.ImageIndexFile, &index); err != nil {
		return err
	}
	for _, top := range index.Manifests {
		var m ocispec.Manifest
		if err := readJSON(filepath.Join("blobs", "sha256", top.Digest.Encoded()), &m); err != nil {
			return err
		}
		size := m.Config.Size
		for _, l := range m.Layers {
			size += l.Size
		}
		fmt.Fprintf(w, "%s: %d layers, %.1f MB, %s\n", top.Annotations[ocispec.AnnotationRefName], len(m.Layers), float64(size)/1e6, top.Digest)
	}
	return nil
}

// envPath is the PATH of the images with a Debian base, as distroless sets it.
const envPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// capNetBindService is the security.capability attribute `setcap
// cap_net_bind_service=+ep` writes (struct vfs_cap_data, revision 2):
// CoreDNS runs as 65532 and binds port 53, as upstream's image does.
const capNetBindService = "\x01\x00\x00\x02" + "\x00\x04\x00\x00" + "\x00\x00\x00\x00" + "\x00\x00\x00\x00" + "\x00\x00\x00\x00"

func labImages(in inputs) ([]ociimage.Image, error) {
	base, conntrack, err := debianLayers(in.debs)
	if err != nil {
		return nil, err
	}
	busybox, err := busyboxLayer(in.debs)
	if err != nil {
		return nil, err
	}
	image := func(ref string, config ocispec.ImageConfig, layers ...ociimage.Layer) ociimage.Image {
		// Dated at the epoch: the same inputs give the same digests,
		// whoever builds them and when.
		return ociimage.Image{Ref: ref, Arch: "amd64", Created: time.Unix(0, 0), Layers: layers, Config: config}
	}
	labels := func(version, source string) map[string]string {
		return map[string]string{
			"org.opencontainers.image.version":     version,
			"org.opencontainers.image.source":      source,
			"org.opencontainers.image.description": "built from source by cozy hack/lab-images.sh",
		}
	}
	binary := func(createdBy string, files ...ociimage.File) ociimage.Layer {
		return ociimage.Layer{CreatedBy: createdBy, Files: files}
	}
	// build/pause/Dockerfile: FROM scratch, ADD pause /pause,
	// USER 65535:65535, ENTRYPOINT ["/pause"].
	pause := func(tag string) ociimage.Image {
		return image("registry.k8s.io/pause:"+tag,
			ocispec.ImageConfig{
				User: "65535:65535", Entrypoint: []string{"/pause"},
				Labels: labels(in.pauseTag, "k8s.io/kubernetes@"+in.kubernetes+" build/pause/linux/pause.c"),
			},
			binary("gcc -Os -static build/pause/linux/pause.c",
				ociimage.File{Path: "/pause", Mode: 0o755, Source: in.pause}))
	}
	return []ociimage.Image{
		// One image, one digest, two names: its source's version (what
		// containerd 2.4 and kubeadm 1.36 name, and Cozy's tenant
		// workers run), and the older one Talos v1.13's nodes ask for.
		pause(in.pauseTag),
		pause(in.pauseTalosTag),
		// CoreDNS's Dockerfile: distroless static nonroot, /coredns with
		// cap_net_bind_service, USER nonroot, WORKDIR /, EXPOSE 53 53/udp.
		image("registry.k8s.io/coredns/coredns:"+in.corednsTag,
			ocispec.ImageConfig{
				User: "65532:65532", Entrypoint: []string{"/coredns"}, WorkingDir: "/", Env: []string{envPath},
				ExposedPorts: map[string]struct{}{"53/tcp": {}, "53/udp": {}},
				Labels:       labels(in.corednsTag, "github.com/coredns/coredns@"+in.corednsTag),
			},
			binary("coredns "+in.corednsTag+" (CGO_ENABLED=0, all plugins of plugin.cfg)",
				ociimage.File{Path: "/coredns", Mode: 0o755, Source: in.coredns, Xattrs: map[string]string{"security.capability": capNetBindService}},
				ociimage.File{Path: "/etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
				ociimage.File{Path: "/etc/group", Mode: 0o644, Data: []byte("root:x:0:\nnonroot:x:65532:\n")},
				ociimage.File{Path: "/home/nonroot", Mode: fs.ModeDir | 0o700},
				ociimage.File{Path: "/tmp", Mode: fs.ModeDir | fs.ModeSticky | 0o777})),
		// Talos's flannel DaemonSet runs /opt/bin/flanneld, and
		// `cp -f /etc/kube-flannel/cni-conf.json ...` in an init container.
		image("ghcr.io/siderolabs/flannel:"+in.flannelTag,
			ocispec.ImageConfig{
				Entrypoint: []string{"/opt/bin/flanneld"}, Env: []string{envPath},
				Labels: labels(in.flannelTag, "github.com/flannel-io/flannel@"+in.flannelTag),
			},
			base,
			binary("flanneld "+in.flannelTag+" (cgo, static)",
				ociimage.File{Path: "/opt/bin/flanneld", Mode: 0o755, Source: in.flanneld})),
		// build/server-image/Dockerfile on distroless-iptables:
		// /usr/local/bin/kube-proxy, ENTRYPOINT ["/go-runner"].
		image("registry.k8s.io/kube-proxy:"+in.kubernetes,
			ocispec.ImageConfig{
				Entrypoint: []string{"/go-runner"}, Env: []string{envPath},
				Labels: labels(in.kubernetes, "k8s.io/kubernetes@"+in.kubernetes+" cmd/kube-proxy"),
			},
			base, conntrack,
			binary("kube-proxy "+in.kubernetes+" and kube-log-runner as /go-runner",
				ociimage.File{Path: "/usr/local/bin/kube-proxy", Mode: 0o755, Source: in.kubeProxy},
				ociimage.File{Path: "/go-runner", Mode: 0o755, Source: in.runner})),
		// The probe pods' image (internal/clustertest): busybox's own
		// image is its static binary and every applet in /bin, CMD sh.
		image("docker.io/library/busybox:"+in.busyboxTag,
			ocispec.ImageConfig{
				Cmd: []string{"sh"}, Env: []string{envPath},
				Labels: labels(in.busyboxTag, "Debian 12 busybox-static"),
			},
			busybox),
	}, nil
}

// busyboxLayer is Debian's static busybox with a symlink in /bin for
// each of its applets (which busybox itself lists), and the few files
// busybox's own image has besides.
func busyboxLayer(debs string) (ociimage.Layer, error) {
	bin := filepath.Join(debs, "bin", "busybox")
	out, err := exec.Command(bin, "--list").Output()
	if err != nil {
		return ociimage.Layer{}, fmt.Errorf("%s --list: %w", bin, err)
	}
	l := ociimage.Layer{CreatedBy: "Debian 12 busybox-static", Files: []ociimage.File{
		{Path: "/bin/busybox", Mode: 0o755, Source: bin},
		{Path: "/etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home:/bin/false\n")},
		{Path: "/etc/group", Mode: 0o644, Data: []byte("root:x:0:\nnobody:x:65534:\n")},
		{Path: "/root", Mode: fs.ModeDir | 0o700},
		{Path: "/home", Mode: fs.ModeDir | 0o755},
		{Path: "/tmp", Mode: fs.ModeDir | fs.ModeSticky | 0o777},
	}}
	for _, applet := range strings.Fields(string(out)) {
		if applet == "busybox" || strings.Contains(applet, "/") {
			continue
		}
		l.Files = append(l.Files, ociimage.File{Path: "/bin/" + applet, Mode: fs.ModeSymlink | 0o777, Target: "busybox"})
	}
	if len(l.Files) < 100 {
		return ociimage.Layer{}, fmt.Errorf("%s lists %d applets only", bin, len(l.Files)-6)
	}
	return l, nil
}

// debianLayers picks, from the extracted packages, the base the flannel
// and kube-proxy images share (iptables with the nf_tables backend, nft,
// cp, netbase's tables) and kube-proxy's conntrack on top.
func debianLayers(debs string) (base, conntrack ociimage.Layer, err error) {
	b := newDebRoot(debs)
	steps := []func() error{
		func() error { return b.add("/usr/sbin/xtables-nft-multi") },
		// iptables-nft, iptables-nft-save, ip6tables-nft, ...
		func() error { return b.addLinksTo("/usr/sbin", "xtables-nft-multi") },
		// The extensions (-p tcp, -j MASQUERADE, -m comment, ...) are
		// dlopened from XTABLES_LIBDIR.
		func() error { return b.addDir("/usr/lib/x86_64-linux-gnu/xtables") },
		func() error { return b.add("/usr/sbin/nft") },
		func() error { return b.add("/bin/cp") },
		func() error { return b.add("/etc/protocols") },
		func() error { return b.add("/etc/services") },
		func() error { return b.add("/etc/ethertypes") },
	}
	// What iptables' postinst does with update-alternatives, for the
	// nf_tables backend: iptables -> iptables-nft, and so on.
	for _, cmd := range []string{"iptables", "ip6tables", "arptables", "ebtables"} {
		for _, suffix := range []string{"", "-save", "-restore"} {
			f := ociimage.File{Path: "/usr/sbin/" + cmd + suffix, Mode: fs.ModeSymlink | 0o777, Target: cmd + "-nft" + suffix}
			steps = append(steps, func() error { return b.set(f) })
		}
	}
	for _, d := range []string{"bin", "sbin", "lib", "lib64"} {
		f := ociimage.File{Path: "/" + d, Mode: fs.ModeSymlink | 0o777, Target: "usr/" + d}
		steps = append(steps, func() error { return b.set(f) })
	}
	steps = append(steps, func() error { return b.set(ociimage.File{Path: "/tmp", Mode: fs.ModeDir | fs.ModeSticky | 0o777}) })
	c := newDebRoot(debs)
	steps = append(steps, func() error { return c.add("/usr/sbin/conntrack") })
	for _, step := range steps {
		if err := step(); err != nil {
			return base, conntrack, err
		}
	}
	if base, err = b.layer("Debian 12 iptables (nf_tables), nftables, coreutils cp, netbase"); err != nil {
		return base, conntrack, err
	}
	conntrack, err = c.layer("Debian 12 conntrack", b)
	return base, conntrack, err
}
