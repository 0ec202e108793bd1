package cloudinit

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var md = MetaData{InstanceID: "i-1", LocalHostname: "acme-md-0-x7k2p", All: map[string]string{
	"instance-id": "i-1", "local-hostname": "acme-md-0-x7k2p", "zone": "rack1",
}}

// TestParseKubeadmBootstrapUserData reads what the Cluster API kubeadm
// bootstrap provider v1.14.2 renders for a worker (testdata, made with
// its bootstrap/kubeadm/pkg/cloudinit.NewNode: a join configuration
// naming the node '{{ ds.meta_data.local_hostname }}', three extra
// files, boot, pre- and post-kubeadm commands).
func TestParseKubeadmBootstrapUserData(t *testing.T) {
	data, err := os.ReadFile("testdata/capi-v1.14.2-node.user-data")
	if err != nil {
		t.Fatal(err)
	}
	c, err := Parse(data, md)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"echo boot"}; !slices.Equal(c.BootCmd, want) {
		t.Errorf("bootcmd %q, want %q", c.BootCmd, want)
	}
	wantRun := []string{
		"echo pre > /run/pre",
		"kubeadm join --config /run/kubeadm/kubeadm-join-config.yaml  && echo success > /run/cluster-api/bootstrap-success.complete",
		"echo post",
	}
	if !slices.Equal(c.RunCmd, wantRun) {
		t.Errorf("runcmd %q, want %q", c.RunCmd, wantRun)
	}
	var paths []string
	byPath := map[string]File{}
	for _, f := range c.Files {
		paths = append(paths, f.Path)
		byPath[f.Path] = f
	}
	wantPaths := []string{"/etc/containerd/certs.d/_default/hosts.toml", "/etc/cozy/b64", "/etc/cozy/log", "/run/kubeadm/kubeadm-join-config.yaml", "/run/cluster-api/placeholder"}
	if !slices.Equal(paths, wantPaths) {
		t.Fatalf("files %q, want %q", paths, wantPaths)
	}
	join := byPath["/run/kubeadm/kubeadm-join-config.yaml"]
	if !strings.Contains(string(join.Content), "name: 'acme-md-0-x7k2p'") || strings.Contains(string(join.Content), "{{") {
		t.Errorf("join configuration not rendered with the host name:\n%s", join.Content)
	}
	if join.Mode != 0o640 {
		t.Errorf("join configuration mode %v, want 0640", join.Mode)
	}
	if got := string(byPath["/etc/cozy/b64"].Content); got != "hello\n" {
		t.Errorf("base64 file %q, want hello", got)
	}
	if f := byPath["/etc/cozy/log"]; !f.Append || f.Mode != 0o644 {
		t.Errorf("append file %+v, want append and 0644", f)
	}
}

func gz(s string) string {
	var b bytes.Buffer
	w := gzip.NewWriter(&b)
	w.Write([]byte(s))
	w.Close()
	return base64.StdEncoding.EncodeToString(b.Bytes())
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, userData string
		want           string // one of the files' content, or RunCmd[0]
		ignored        []string
		err            string
	}{
		{name: "plain", userData: "#cloud-config\nruncmd: [\"echo hi\"]\n", want: "echo hi"},
		{name: "argv list", userData: "#cloud-config\nruncmd:\n  - [echo, \"it's\"]\n", want: `'echo' 'it'\''s'`},
		{name: "gzip+base64", userData: "#cloud-config\nwrite_files:\n- path: /a\n  encoding: gz+b64\n  content: " + gz("zipped") + "\n", want: "zipped"},
		{name: "jinja instance id", userData: "## template: jinja\n#cloud-config\nruncmd: [\"echo {{ v1.instance_id }} {{ds.meta_data.zone}}\"]\n", want: "echo i-1 rack1"},
		{name: "ignored keys", userData: "#cloud-config\nntp: {enabled: true}\nusers: [{name: capk}]\n", ignored: []string{"ntp", "users"}},
		{name: "not cloud-config", userData: "#!/bin/sh\necho hi\n", err: "not a cloud-config"},
		{name: "jinja without header is kept", userData: "#cloud-config\nruncmd: [\"echo {{ x }}\"]\n", want: "echo {{ x }}"},
		{name: "unknown jinja variable", userData: "## template: jinja\n#cloud-config\nruncmd: [\"echo {{ v1.region }}\"]\n", err: "not a variable the worker image knows"},
		{name: "jinja statement", userData: "## template: jinja\n#cloud-config\n{% if x %}\nruncmd: []\n", err: "only variables are supported"},
		{name: "missing meta-data key", userData: "## template: jinja\n#cloud-config\nruncmd: [\"echo {{ ds.meta_data.nope }}\"]\n", err: `meta-data has no "nope"`},
		{name: "disks refused", userData: "#cloud-config\ndisk_setup: {}\nmounts: []\n", err: "does not support partitioning disks"},
		{name: "unknown key", userData: "#cloud-config\nsnap: {}\n", err: "snap: unknown key"},
		{name: "relative path", userData: "#cloud-config\nwrite_files: [{path: etc/x, content: a}]\n", err: "not absolute and clean"},
		{name: "other owner", userData: "#cloud-config\nwrite_files: [{path: /x, owner: 'capk:capk'}]\n", err: "root only"},
		{name: "bad permissions", userData: "#cloud-config\nwrite_files: [{path: /x, permissions: '0999'}]\n", err: "not octal"},
		{name: "bad encoding", userData: "#cloud-config\nwrite_files: [{path: /x, encoding: rot13}]\n", err: "rot13"},
		{name: "bad base64", userData: "#cloud-config\nwrite_files: [{path: /x, encoding: b64, content: '!!'}]\n", err: "illegal base64"},
		{name: "unknown file key", userData: "#cloud-config\nwrite_files: [{path: /x, source: {uri: http://x}}]\n", err: `unknown key "source"`},
		{name: "runcmd not a list", userData: "#cloud-config\nruncmd: echo\n", err: "a list of commands"},
		{name: "bad yaml", userData: "#cloud-config\nruncmd: [\n", err: "user-data"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.userData), md)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			slices.Sort(c.Ignored)
			if !slices.Equal(c.Ignored, tc.ignored) {
				t.Errorf("ignored %q, want %q", c.Ignored, tc.ignored)
			}
			if tc.want == "" {
				return
			}
			var got []string
			got = append(got, c.RunCmd...)
			for _, f := range c.Files {
				got = append(got, string(f.Content))
			}
			if !slices.Contains(got, tc.want) {
				t.Errorf("got %q, want %q among them", got, tc.want)
			}
		})
	}
}

func TestParseMetaData(t *testing.T) {
	for _, tc := range []struct {
		name, data, host, err string
	}{
		{name: "kubevirt", data: "instance-id: acme-md-0-x7k2p.tenant-acme\nlocal-hostname: acme-md-0-x7k2p\n", host: "acme-md-0-x7k2p"},
		{name: "json", data: `{"instance-id": "i", "local-hostname": "w1"}`, host: "w1"},
		{name: "no host name", data: "instance-id: i\n", host: ""},
		{name: "no instance id", data: "local-hostname: w1\n", err: "no instance-id"},
		{name: "bad host name", data: "instance-id: i\nlocal-hostname: 'a b'\n", err: "not a lower-case DNS name"},
		{name: "not yaml", data: "[", err: "meta-data"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseMetaData([]byte(tc.data))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.LocalHostname != tc.host {
				t.Errorf("host %q, want %q", got.LocalHostname, tc.host)
			}
		})
	}
}

func TestReadSeedAndWrite(t *testing.T) {
	seed := t.TempDir()
	os.WriteFile(filepath.Join(seed, "meta-data"), []byte("instance-id: i\nlocal-hostname: w1\n"), 0o644)
	os.WriteFile(filepath.Join(seed, "user-data"), []byte("#cloud-config\nwrite_files:\n- {path: /etc/a/b, content: new, permissions: '0600'}\n- {path: /var/log/x, content: two, append: true}\n"), 0o644)
	md, c, err := ReadSeed(seed)
	if err != nil {
		t.Fatal(err)
	}
	if md.LocalHostname != "w1" {
		t.Errorf("host %q", md.LocalHostname)
	}
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "var/log"), 0o755)
	os.WriteFile(filepath.Join(root, "var/log/x"), []byte("one,"), 0o644)
	for _, f := range c.Files {
		if err := Write(root, f); err != nil {
			t.Fatal(err)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(root, "etc/a/b")); string(b) != "new" {
		t.Errorf("etc/a/b %q", b)
	}
	if fi, _ := os.Stat(filepath.Join(root, "etc/a/b")); fi.Mode().Perm() != 0o600 {
		t.Errorf("etc/a/b mode %v", fi.Mode())
	}
	if b, _ := os.ReadFile(filepath.Join(root, "var/log/x")); string(b) != "one,two" {
		t.Errorf("appended file %q", b)
	}
	if leftovers, _ := filepath.Glob(filepath.Join(root, "etc/a/.*")); len(leftovers) > 0 {
		t.Errorf("temporary files left: %q", leftovers)
	}

	// Without user-data: nothing to do.
	os.Remove(filepath.Join(seed, "user-data"))
	if _, c, err := ReadSeed(seed); err != nil || len(c.Files)+len(c.RunCmd) != 0 {
		t.Errorf("seed without user-data: %+v, %v", c, err)
	}
	if _, _, err := ReadSeed(t.TempDir()); err == nil || !strings.Contains(err.Error(), "meta-data") {
		t.Errorf("empty seed: %v", err)
	}
}

// A config drive, as KubeVirt writes one for a VM whose cloud-init
// volume is cloudInitConfigDrive (CAPK's): the host name and instance ID
// as cloud-init takes them from meta_data.json, and user_data applied.
// Nested values (KubeVirt's devices) are not variables.
func TestReadSeedConfigDrive(t *testing.T) {
	seed := t.TempDir()
	dir := filepath.Join(seed, "openstack", "latest")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	meta := `{"instance_id":"md0-abc.tenants","hostname":"md0-abc","uuid":"4c9c8a8e-3f0e-5b1e-9c55-1b0b8d0c2f11","devices":[{"type":"nic","bus":"pci","address":"0000:01:00.0","tags":null}]}`
	if err := os.WriteFile(filepath.Join(dir, "meta_data.json"), []byte(meta), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "user_data"), []byte("## template: jinja\n#cloud-config\nwrite_files:\n- {path: /etc/node, content: '{{ ds.meta_data.local_hostname }}'}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	md, c, err := ReadSeed(seed)
	if err != nil {
		t.Fatal(err)
	}
	if md.LocalHostname != "md0-abc" || md.InstanceID != "4c9c8a8e-3f0e-5b1e-9c55-1b0b8d0c2f11" {
		t.Errorf("host %q, instance %q", md.LocalHostname, md.InstanceID)
	}
	if len(c.Files) != 1 || string(c.Files[0].Content) != "md0-abc" {
		t.Errorf("files %+v", c.Files)
	}
	// A config drive without its metadata is an error that says so.
	if err := os.Remove(filepath.Join(dir, "meta_data.json")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ReadSeed(seed); err == nil || !strings.Contains(err.Error(), "config drive") || !strings.Contains(err.Error(), "meta_data.json") {
		t.Errorf("config drive without meta_data.json: %v", err)
	}
}

// FuzzParse: no user-data or meta-data makes Parse panic, and whatever
// it accepts has absolute, clean paths.
func FuzzParse(f *testing.F) {
	data, err := os.ReadFile("testdata/capi-v1.14.2-node.user-data")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data, []byte("instance-id: i\nlocal-hostname: w1\n"))
	f.Add([]byte("#cloud-config\nwrite_files: [{path: /x, encoding: gz+b64, content: H4sI}]\n"), []byte("{}"))
	f.Fuzz(func(t *testing.T, userData, metaData []byte) {
		md, err := ParseMetaData(metaData)
		if err != nil {
			md = MetaData{InstanceID: "i"}
		}
		c, err := Parse(userData, md)
		if err != nil {
			return
		}
		for _, file := range c.Files {
			if !strings.HasPrefix(file.Path, "/") || filepath.Clean(file.Path) != file.Path {
				t.Fatalf("accepted path %q", file.Path)
			}
		}
	})
}
