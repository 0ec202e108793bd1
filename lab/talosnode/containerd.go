package talosnode

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/siderolabs/talos/pkg/machinery/config/config"
)

// sandboxImage is the pause image containerd's CRI runs every pod's
// sandbox from: containerd's own default, which Talos keeps.
const sandboxImage = "registry.k8s.io/pause:3.10.1"

// containerdConfig is the CRI containerd's configuration (version 3, for
// containerd 2.x): Talos's /etc/cri/containerd.toml, which imports the
// machine config's /etc/cri/conf.d/*.part files. runc manages cgroups
// itself (cgroupfs): there is no systemd on a Talos node.
//
// On the container platform the node shares a host that may not let it
// lower processes' OOM scores (no CAP_SYS_RESOURCE, as in a container):
// containerd then keeps pods' scores at or above its own, as it does
// rootless.
func containerdConfig(runc, cniBinDir string, p Platform) ([]byte, error) {
	type m = map[string]any
	runtime := m{
		"cni": m{"bin_dirs": []string{cniBinDir}, "conf_dir": cniConfDir},
		"containerd": m{
			"default_runtime_name": "runc",
			"runtimes": m{"runc": m{
				"runtime_type": "io.containerd.runc.v2",
				"options":      m{"BinaryName": runc, "SystemdCgroup": false},
			}},
		},
	}
	if p == PlatformContainer {
		runtime["restrict_oom_score_adj"] = true
	}
	cfg := m{
		"version": 3,
		"root":    containerdRoot,
		"state":   containerdState,
		"imports": []string{filepath.Join(criConfDir, "*.part")},
		"grpc":    m{"address": containerdSocket},
		"plugins": m{
			"io.containerd.cri.v1.images": m{
				"snapshotter":   "overlayfs",
				"pinned_images": m{"sandbox": sandboxImage},
				"registry":      m{"config_path": criHostsDir},
			},
			"io.containerd.cri.v1.runtime": runtime,
		},
	}
	var out bytes.Buffer
	out.WriteString("# Written by cozy-talos-node, as Talos writes /etc/cri/containerd.toml.\n")
	if err := toml.NewEncoder(&out).Encode(cfg); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// registryHosts renders containerd's hosts.toml files from the machine
// config's registry mirrors and TLS settings, as Talos does: one
// directory per registry under /etc/cri/conf.d/hosts, named host or
// host_port_ (containerd's convention for a port), each mirror endpoint a
// [host."URL"] table with pull and resolve, override_path when the config
// says so, and the registry itself as the fallback server unless
// skipFallback. Files map a path relative to the hosts dir to content.
func registryHosts(mc config.Config) (map[string][]byte, error) {
	files := map[string][]byte{}
	tlsConfigs := mc.RegistryTLSConfigs()
	mirrors := mc.RegistryMirrorConfigs()
	names := make([]string, 0, len(mirrors))
	for name := range mirrors {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		mirror := mirrors[name]
		dir := hostsDirName(name)
		var b strings.Builder
		if !mirror.SkipFallback() && name != "*" {
			fmt.Fprintf(&b, "server = %s\n", tomlString(fallbackServer(name)))
		}
		for _, ep := range mirror.Endpoints() {
			u, err := url.Parse(ep.Endpoint())
			if err != nil || u.Host == "" {
				return nil, fmt.Errorf("registry mirror %s: endpoint %q is not a URL", name, ep.Endpoint())
			}
			fmt.Fprintf(&b, "\n[host.%s]\n  capabilities = [\"pull\", \"resolve\"]\n", tomlString(ep.Endpoint()))
			if ep.OverridePath() {
				b.WriteString("  override_path = true\n")
			}
			if err := hostTLS(&b, files, dir, u.Host, tlsConfigs); err != nil {
				return nil, err
			}
		}
		files[filepath.Join(dir, "hosts.toml")] = []byte(b.String())
	}
	// Registries with TLS settings but no mirror get a hosts.toml of
	// their own.
	hosts := make([]string, 0, len(tlsConfigs))
	for h := range tlsConfigs {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	for _, h := range hosts {
		dir := hostsDirName(h)
		if _, ok := files[filepath.Join(dir, "hosts.toml")]; ok {
			continue
		}
		var b strings.Builder
		fmt.Fprintf(&b, "server = %s\n\n[host.%s]\n  capabilities = [\"pull\", \"resolve\"]\n", tomlString(fallbackServer(h)), tomlString(fallbackServer(h)))
		if err := hostTLS(&b, files, dir, h, tlsConfigs); err != nil {
			return nil, err
		}
		files[filepath.Join(dir, "hosts.toml")] = []byte(b.String())
	}
	return files, nil
}

func hostTLS(b *strings.Builder, files map[string][]byte, dir, host string, configs map[string]config.RegistryTLSConfig) error {
	t, ok := configs[host]
	if !ok || t == nil {
		return nil
	}
	if t.InsecureSkipVerify() {
		b.WriteString("  skip_verify = true\n")
	}
	if ca := t.CA(); len(ca) > 0 {
		name := host + "-ca.crt"
		files[filepath.Join(dir, name)] = ca
		fmt.Fprintf(b, "  ca = %s\n", tomlString(filepath.Join(criHostsDir, dir, name)))
	}
	if id := t.ClientIdentity(); id != nil && len(id.Crt) > 0 {
		crt, key := host+"-client.crt", host+"-client.key"
		files[filepath.Join(dir, crt)] = id.Crt
		files[filepath.Join(dir, key)] = id.Key
		fmt.Fprintf(b, "  client = [[%s, %s]]\n", tomlString(filepath.Join(criHostsDir, dir, crt)), tomlString(filepath.Join(criHostsDir, dir, key)))
	}
	return nil
}

// hostsDirName is containerd's directory name for a registry host:
// "_default" for "*", host_port_ for host:port.
func hostsDirName(name string) string {
	if name == "*" {
		return "_default"
	}
	if h, p, err := net.SplitHostPort(name); err == nil {
		return h + "_" + p + "_"
	}
	return name
}

// fallbackServer is the registry's own address, which containerd tries
// after the mirrors; docker.io's API lives at registry-1.docker.io.
func fallbackServer(name string) string {
	if name == "docker.io" {
		return "https://registry-1.docker.io"
	}
	return "https://" + name
}

// tomlString quotes s as a TOML basic string.
func tomlString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, "\\u%04x", r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// criParts are the machine config's files under /etc/cri/conf.d (Cozy's
// patch adds one), which containerd imports; Talos lets machine.files
// write there and nowhere else in /etc.
func criParts(mc config.Config) (map[string][]byte, error) {
	files, err := mc.Machine().Files()
	if err != nil {
		return nil, fmt.Errorf("machine.files: %w", err)
	}
	parts := map[string][]byte{}
	for _, f := range files {
		if filepath.Dir(f.Path()) != criConfDir || !strings.HasSuffix(f.Path(), ".part") {
			continue
		}
		parts[filepath.Base(f.Path())] = []byte(f.Content())
	}
	return parts, nil
}

// writeCRIConfig writes containerd's config, the machine config's parts
// and the registry hosts, replacing what an earlier boot wrote.
func writeCRIConfig(mc config.Config, runc, cniBinDir string, p Platform) error {
	cfg, err := containerdConfig(runc, cniBinDir, p)
	if err != nil {
		return err
	}
	hosts, err := registryHosts(mc)
	if err != nil {
		return err
	}
	parts, err := criParts(mc)
	if err != nil {
		return err
	}
	if err := os.RemoveAll(criConfDir); err != nil {
		return err
	}
	if err := writeFiles(criConfDir, parts, 0o600); err != nil {
		return err
	}
	if err := writeFiles(criHostsDir, hosts, 0o600); err != nil {
		return err
	}
	return writeFileAtomic(criConfigFile, cfg, 0o600)
}

func writeFiles(dir string, files map[string][]byte, perm os.FileMode) error {
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		p := filepath.Join(dir, n)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := writeFileAtomic(p, files[n], perm); err != nil {
			return err
		}
	}
	return nil
}

// waitSocket waits until a unix socket accepts connections.
func waitSocket(ctx context.Context, path string) error {
	for {
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s does not answer: %w", path, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}
