package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPlatformRender(t *testing.T) {
	dir := t.TempDir()
	ex, _, _ := run("rack", "init", "--name", "prod")
	rackFile := filepath.Join(dir, "rack.yaml")
	if err := os.WriteFile(rackFile, []byte(ex), 0o644); err != nil {
		t.Fatal(err)
	}
	repo := filepath.Join(dir, "repo")
	stdout, stderr, code := run("platform", "render", "--rack", rackFile, "--out", repo)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, f := range []string{"clusters/prod/platform.yaml", "clusters/prod/kustomization.yaml", "clusters/prod/values.yaml",
		"clusters/prod/components/networking/kube-ovn.yaml", "charts/cozy-operator/Chart.yaml"} {
		if !strings.Contains(stdout, f) {
			t.Errorf("output does not list %s:\n%s", f, stdout)
		}
		if _, err := os.Stat(filepath.Join(repo, f)); err != nil {
			t.Error(err)
		}
	}

	if _, stderr, code := run("platform", "render", "--rack", rackFile, "--out", repo, "--check"); code != 0 {
		t.Errorf("--check after render: exit %d: %s", code, stderr)
	}
	// A hand edit and a leftover component are both reported.
	edited := filepath.Join(repo, "clusters/prod/components/metallb/metallb.yaml")
	if err := os.WriteFile(edited, []byte("# edited\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(repo, "clusters/prod/components/old/release.yaml")
	if err := os.MkdirAll(filepath.Dir(stale), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(stale, []byte("{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, stderr, code = run("platform", "render", "--rack", rackFile, "--out", repo, "--check")
	if code == 0 || !strings.Contains(stderr, "differs: clusters/prod/components/metallb/metallb.yaml") ||
		!strings.Contains(stderr, "stale: clusters/prod/components/old/release.yaml") {
		t.Errorf("--check after edits: exit %d: %s", code, stderr)
	}
	// Rendering again restores the file and removes the leftover.
	if _, stderr, code := run("platform", "render", "--rack", rackFile, "--out", repo); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("stale component survived a new rendering: %v", err)
	}
	if _, stderr, code := run("platform", "render", "--rack", rackFile, "--out", repo, "--check"); code != 0 {
		t.Errorf("--check after a new render: exit %d: %s", code, stderr)
	}
}

func TestPlatformRenderRefusesBadInput(t *testing.T) {
	dir := t.TempDir()
	ex, _, _ := run("rack", "init", "--name", "prod")
	write := func(name, content string) string {
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return f
	}
	good := write("rack.yaml", ex)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no rack flag", []string{"--out", dir}, `required flag(s) "rack" not set`},
		{"missing rack file", []string{"--rack", filepath.Join(dir, "none.yaml"), "--out", dir}, "read rack file"},
		{"invalid rack", []string{"--rack", write("bad.yaml", "kind: Rack\n"), "--out", dir}, "bad.yaml:"},
		{"rack the platform cannot serve", []string{"--rack", write("v6.yaml", strings.Replace(ex, "# podSubnets: [10.244.0.0/16]", "podSubnets: [fd00::/64]", 1)), "--out", dir},
			"cluster.podSubnets [fd00::/64] has no IPv4 network"},
		{"bad platform values", []string{"--rack", write("vals.yaml", strings.Replace(ex, "platform:                       # what the platform layer (Flux) reads", "platform:\n  values: {storage: {backend: ceph}}", 1)), "--out", dir},
			"at '/storage/backend': value must be one of 'lvm-thin', 'zfs'"},
		{"out is a file", []string{"--rack", good, "--out", good}, "is a file, not a folder"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, code := run(append([]string{"platform", "render"}, tc.args...)...)
			if code == 0 || !strings.Contains(stderr, tc.want) {
				t.Errorf("exit %d, stderr lacks %q:\n%s", code, tc.want, stderr)
			}
		})
	}
}

func TestOneLine(t *testing.T) {
	tests := []struct {
		in   string
		max  int
		want string
	}{
		{"short", 20, "short"},
		{"two\nlines  and   spaces", 40, "two lines and spaces"},
		{"failed to fetch index: Get https://x: dial tcp: lookup x: network is unreachable", 40, "failed to fet … : network is unreachable"},
	}
	for _, tt := range tests {
		got := oneLine(tt.in, tt.max)
		if got != tt.want {
			t.Errorf("oneLine(%q, %d) = %q, want %q", tt.in, tt.max, got, tt.want)
		}
		if n := len([]rune(got)); n > tt.max {
			t.Errorf("oneLine(%q, %d) is %d runes long", tt.in, tt.max, n)
		}
	}
}
