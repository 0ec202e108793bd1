//go:build integration

package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	rspec "github.com/opencontainers/runtime-spec/specs-go"

	"cozy.dev/cozy/internal/ociimage"
	"cozy.dev/cozy/internal/testing/prereq"
	"cozy.dev/cozy/internal/testing/runc"
	"cozy.dev/cozy/internal/testing/syncbuf"
)

// labImage is what a node expects of one image of the layout, and
// commands that prove its programs run in it.
type labImage struct {
	ref        string
	entrypoint string
	user       string
	runs       []check // each in a container of its own (runc run)
	execs      []check // one after the other in one container (runc exec)
	// volumes are directories mounted into the exec container, as a
	// pod's volumes are: path in the container to the files they hold.
	volumes map[string]map[string]string
}

type check struct {
	args []string
	want []string // all in the output, or in file
	file string   // a file of a volume, to check after the command
}

// talosCorefilePlugins are the plugins of the Corefile Talos applies.
var talosCorefilePlugins = []string{"errors", "health", "ready", "log", "kubernetes", "prometheus", "forward", "cache", "loop", "reload", "loadbalance"}

// flannelCNIConf is what Talos's kube-flannel-cfg ConfigMap mounts at
// /etc/kube-flannel/cni-conf.json.
const flannelCNIConf = `{"name":"cbr0","cniVersion":"1.0.0","plugins":[{"type":"flannel","delegate":{"hairpinMode":true,"isDefaultGateway":true}},{"type":"portmap","capabilities":{"portMappings":true}}]}`

func lines(words []string) []string {
	var out []string
	for _, w := range words {
		out = append(out, "\n"+w+"\n")
	}
	return out
}

var labImageList = []labImage{
	{
		ref: "registry.k8s.io/pause:3.10.2", entrypoint: "/pause", user: "65535:65535",
		runs: []check{{args: []string{"/pause", "-v"}, want: []string{"pause.c v3.10.2-v1.36.3"}}},
	},
	{
		ref: "registry.k8s.io/pause:3.10.1", entrypoint: "/pause", user: "65535:65535",
		runs: []check{{args: []string{"/pause", "-v"}, want: []string{"pause.c v3.10.2-v1.36.3"}}},
	},
	{
		ref: "registry.k8s.io/coredns/coredns:v1.14.2", entrypoint: "/coredns", user: "65532:65532",
		runs: []check{
			{args: []string{"/coredns", "-version"}, want: []string{"CoreDNS-1.14.2"}},
			// Talos's Corefile's plugins are all compiled in.
			{args: []string{"/coredns", "-plugins"}, want: lines(talosCorefilePlugins)},
		},
	},
	{
		ref: "ghcr.io/siderolabs/flannel:v0.28.4", entrypoint: "/opt/bin/flanneld",
		runs: []check{{args: []string{"/opt/bin/flanneld", "--version"}, want: []string{"v0.28.4"}}},
		execs: []check{
			{args: []string{"iptables-nft", "--version"}, want: []string{"iptables v1.8.9 (nf_tables)"}},
			{args: []string{"iptables", "-t", "nat", "-A", "POSTROUTING", "-s", "10.244.0.0/16", "!", "-d", "224.0.0.0/4", "-m", "comment", "--comment", "flanneld masq", "-j", "MASQUERADE", "--random-fully"}},
			{args: []string{"iptables-save", "-t", "nat"}, want: []string{`-A POSTROUTING -s 10.244.0.0/16 ! -d 224.0.0.0/4 -m comment --comment "flanneld masq" -j MASQUERADE --random-fully`}},
			{args: []string{"ip6tables-restore", "--version"}, want: []string{"(nf_tables)"}},
			{args: []string{"nft", "add", "table", "inet", "flannel"}},
			{args: []string{"nft", "list", "tables"}, want: []string{"table inet flannel"}},
			// Talos's install-config init container.
			{
				args: []string{"cp", "-f", "/etc/kube-flannel/cni-conf.json", "/etc/cni/net.d/10-flannel.conflist"},
				file: "/etc/cni/net.d/10-flannel.conflist", want: []string{flannelCNIConf},
			},
		},
		volumes: map[string]map[string]string{
			"/etc/kube-flannel": {"cni-conf.json": flannelCNIConf},
			"/etc/cni/net.d":    {},
		},
	},
	{
		ref: "registry.k8s.io/kube-proxy:v1.36.3", entrypoint: "/go-runner",
		runs: []check{
			{args: []string{"/usr/local/bin/kube-proxy", "--version"}, want: []string{"Kubernetes v1.36.3"}},
			{args: []string{"/go-runner", "/usr/local/bin/kube-proxy", "--version"}, want: []string{"Kubernetes v1.36.3"}},
		},
		execs: []check{
			{args: []string{"conntrack", "--version"}, want: []string{"conntrack v1.4.7"}},
			{args: []string{"iptables-restore", "--version"}, want: []string{"(nf_tables)"}},
			{args: []string{"iptables", "-t", "nat", "-N", "KUBE-SERVICES"}},
			{args: []string{"iptables-save"}, want: []string{":KUBE-SERVICES - [0:0]"}},
			{args: []string{"nft", "add", "table", "ip", "kube-proxy"}},
			{args: []string{"nft", "list", "ruleset"}, want: []string{"table ip kube-proxy"}},
		},
	},
	{
		// What internal/clustertest's probe pods run.
		ref: "docker.io/library/busybox:1.35.0",
		runs: []check{{
			args: []string{"sh", "-c", `mkdir -p /www && echo "probe on $HOSTNAME" > /www/index.html && cat /www/index.html && which httpd wget nslookup`},
			want: []string{"probe on ", "/bin/httpd\n/bin/wget\n/bin/nslookup"},
		}},
	},
}

// TestLabImages checks the layout hack/lab-images.sh made (its directory
// in COZY_LAB_IMAGES) as a node uses it: every image under its upstream
// name, each blob's digest, and each image's programs running in it
// under runc, with the user and capabilities Kubernetes gives them.
func TestLabImages(t *testing.T) {
	dir := os.Getenv("COZY_LAB_IMAGES")
	if dir == "" {
		prereq.Missing(t, "COZY_LAB_IMAGES is not set: COZY_LAB_IMAGES=$(hack/lab-images.sh) go test -tags integration ./hack/labimages")
	}
	for _, bin := range []string{"skopeo", "umoci", "runc"} {
		if _, err := exec.LookPath(bin); err != nil {
			prereq.Missing(t, "%s is not installed (see hack/install-deps.sh)", bin)
		}
	}
	if os.Geteuid() != 0 {
		prereq.Missing(t, "runc runs the images as root only")
	}

	data, err := os.ReadFile(filepath.Join(dir, ocispec.ImageIndexFile))
	if err != nil {
		t.Fatal(err)
	}
	var index ocispec.Index
	if err := json.Unmarshal(data, &index); err != nil {
		t.Fatal(err)
	}
	refs := map[string]bool{}
	for _, m := range index.Manifests {
		ref := m.Annotations[ocispec.AnnotationRefName]
		if m.Annotations[ociimage.AnnotationContainerdImageName] != ref {
			t.Errorf("index entry %s: annotations %v, want both names equal", m.Digest, m.Annotations)
		}
		refs[ref] = true
	}
	if len(refs) != len(labImageList) {
		t.Errorf("the layout holds %v, want the %d lab images", refs, len(labImageList))
	}

	for _, im := range labImageList {
		t.Run(im.ref, func(t *testing.T) {
			if !refs[im.ref] {
				t.Fatalf("%s is not in the layout", im.ref)
			}
			config := runc.Config(t, dir, im.ref)
			if c := config.Config; strings.Join(c.Entrypoint, " ") != im.entrypoint || c.User != im.user || config.Architecture != "amd64" {
				t.Errorf("config %+v, want entrypoint %q, user %q", c, im.entrypoint, im.user)
			}
			// skopeo copy checks every blob against its digest.
			runc.CheckBlobs(t, dir, im.ref)

			bundle := runc.Unpack(t, dir, im.ref)
			for _, c := range im.runs {
				wantAll(t, c, runIn(t, bundle, c.args))
			}
			if len(im.execs) == 0 {
				return
			}
			volumes := map[string]string{}
			for dir, files := range im.volumes {
				volumes[dir] = t.TempDir()
				for name, content := range files {
					if err := os.WriteFile(filepath.Join(volumes[dir], name), []byte(content), 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			execIn := container(t, bundle, volumes)
			for _, c := range im.execs {
				out := execIn(c.args)
				if c.file != "" {
					data, err := os.ReadFile(filepath.Join(volumes[filepath.Dir(c.file)], filepath.Base(c.file)))
					if err != nil {
						t.Errorf("after %s: %v", strings.Join(c.args, " "), err)
					}
					out = string(data)
				}
				wantAll(t, c, out)
			}
		})
	}
	t.Run("coredns binds port 53 as 65532", func(t *testing.T) {
		corednsBindsPort53(t, dir)
	})
}

func wantAll(t *testing.T, c check, out string) {
	t.Helper()
	for _, w := range c.want {
		if !strings.Contains(out, w) {
			t.Errorf("%s: %q has no %q", strings.Join(c.args, " "), out, w)
		}
	}
}

// setSpec rewrites the bundle's runtime spec as the kubelet would run a
// container of a privileged-enough pod (flannel and kube-proxy get
// NET_ADMIN and NET_RAW), with args, its own network namespace, and
// volumes (path in the container: directory here).
func setSpec(t *testing.T, bundle string, args []string, volumes map[string]string, edit func(*rspec.Spec)) {
	t.Helper()
	runc.EditSpec(t, bundle, func(spec *rspec.Spec) {
		if args != nil {
			spec.Process.Args = args
		}
		spec.Process.Terminal = false
		caps := spec.Process.Capabilities
		for _, c := range []string{"CAP_NET_ADMIN", "CAP_NET_RAW"} {
			caps.Bounding, caps.Effective, caps.Permitted = append(caps.Bounding, c), append(caps.Effective, c), append(caps.Permitted, c)
		}
		hasNetNS := false
		for _, ns := range spec.Linux.Namespaces {
			hasNetNS = hasNetNS || ns.Type == rspec.NetworkNamespace
		}
		if !hasNetNS {
			spec.Linux.Namespaces = append(spec.Linux.Namespaces, rspec.LinuxNamespace{Type: rspec.NetworkNamespace})
		}
		for dst, src := range volumes {
			spec.Mounts = append(spec.Mounts, rspec.Mount{Destination: dst, Type: "bind", Source: src, Options: []string{"rbind", "rw"}})
		}
		if edit != nil {
			edit(spec)
		}
	})
}

// runIn runs args in a new container of the bundle and returns what it
// printed.
func runIn(t *testing.T, bundle string, args []string) string {
	t.Helper()
	setSpec(t, bundle, args, nil, nil)
	return runc.Run(t, bundle)
}

// container creates a container of the bundle whose entrypoint never
// starts (runc create), for commands to run in its namespaces one after
// the other (runc exec).
func container(t *testing.T, bundle string, volumes map[string]string) func(args []string) string {
	t.Helper()
	setSpec(t, bundle, nil, volumes, nil)
	c := runc.Create(t, bundle)
	return func(args []string) string {
		out, err := c.Exec(nil, args...)
		if err != nil {
			t.Error(err)
		}
		return out
	}
}

// corednsBindsPort53 runs CoreDNS as the kubelet runs Talos's CoreDNS
// pod: as the image's user, capabilities dropped but NET_BIND_SERVICE,
// no new privileges, a read-only root. Only the file capability the image gives /coredns
// lets it bind port 53, as upstream's image does.
func corednsBindsPort53(t *testing.T, dir string) {
	bundle := runc.Unpack(t, dir, "registry.k8s.io/coredns/coredns:v1.14.2")
	buf := make([]byte, 64)
	n, err := syscall.Getxattr(filepath.Join(bundle, "rootfs", "coredns"), "security.capability", buf)
	if err != nil || string(buf[:n]) != capNetBindService {
		t.Errorf("/coredns security.capability %q (%v), want cap_net_bind_service=ep", buf[:max(n, 0)], err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "rootfs", "Corefile"), []byte(".:53 {\n  whoami\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	setSpec(t, bundle, []string{"/coredns", "-conf", "/Corefile"}, nil, func(s *rspec.Spec) {
		s.Process.NoNewPrivileges = true
		s.Root.Readonly = true
		only := []string{"CAP_NET_BIND_SERVICE"}
		s.Process.Capabilities = &rspec.LinuxCapabilities{Bounding: only, Effective: only, Permitted: only}
	})
	id := runc.NewID()
	out := &syncbuf.Buffer{}
	cmd := exec.Command("runc", "run", "--bundle", bundle, id)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = exec.Command("runc", "kill", id, "KILL").Run()
		<-done
		_ = exec.Command("runc", "delete", "--force", id).Run()
	})
	// CoreDNS prints its version once every server listens, and exits
	// when a bind fails.
	deadline := time.After(30 * time.Second)
	for tick := time.NewTicker(100 * time.Millisecond); ; {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("coredns exited (%v):\n%s", err, out.String())
		case <-deadline:
			t.Fatalf("coredns did not start in 30 s:\n%s", out.String())
		case <-tick.C:
		}
		if strings.Contains(out.String(), "CoreDNS-1.14.2") {
			if !strings.Contains(out.String(), ".:53") {
				t.Errorf("coredns started without serving .:53:\n%s", out.String())
			}
			return
		}
	}
}
