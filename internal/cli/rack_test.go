package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRackInitValidates(t *testing.T) {
	stdout, stderr, code := run("rack", "init", "--name", "prod")
	if code != 0 || !strings.Contains(stdout, "name: prod") {
		t.Fatalf("rack init: exit %d, %s", code, stderr)
	}
	f := filepath.Join(t.TempDir(), "rack.yaml")
	if err := os.WriteFile(f, []byte(stdout), 0o644); err != nil {
		t.Fatal(err)
	}
	out, stderr, code := run("rack", "validate", f, "-o", "json")
	var rep rackReport
	if code != 0 || json.Unmarshal([]byte(out), &rep) != nil || !rep.Valid || rep.Cluster != "prod" || rep.ControlPlanes != 3 {
		t.Errorf("validate the example: exit %d, %s %s", code, out, stderr)
	}
}

func TestRackValidateReportsProblems(t *testing.T) {
	f := filepath.Join(t.TempDir(), "rack.yaml")
	broken := "apiVersion: cozy.dev/v1alpha1\nkind: Rack\nmetadata: {name: x}\nnetwork: {interface: eth0, subnet: 10.0.0.0/24}\nmachines:\n  - hostname: a\n    role: controlplane\n    mac: zz\n    install: {disk: sda}\n"
	if err := os.WriteFile(f, []byte(broken), 0o644); err != nil {
		t.Fatal(err)
	}
	out, stderr, code := run("rack", "validate", f)
	if code != 1 || !strings.Contains(stderr, "is not a valid rack") {
		t.Errorf("exit %d, stderr %s", code, stderr)
	}
	for _, want := range []string{"8      machines[0].mac", "9      machines[0].install.disk"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if _, _, code := run("rack", "init", "--name", "Bad Name"); code == 0 {
		t.Error("rack init accepted a name that is not a DNS label")
	}
}

func TestTalosGen(t *testing.T) {
	dir := t.TempDir()
	ex, _, _ := run("rack", "init", "--name", "gen")
	rackFile := filepath.Join(dir, "rack.yaml")
	if err := os.WriteFile(rackFile, []byte(ex), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	stdout, stderr, code := run("talos", "gen", "--rack", rackFile, "--out", out)
	if code != 0 || !strings.Contains(stdout, "secrets bundle (new") {
		t.Fatalf("exit %d: %s %s", code, stdout, stderr)
	}
	for _, f := range []string{"secrets.yaml", "talosconfig", "cp1.yaml", "cp2.yaml", "cp3.yaml", "worker1.yaml"} {
		fi, err := os.Stat(filepath.Join(out, f))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, mode %v", f, err, fi.Mode().Perm())
		}
	}
	if stdout, _, _ := run("talos", "gen", "--rack", rackFile, "--out", out); !strings.Contains(stdout, "kept") {
		t.Errorf("second run does not say it kept the bundle:\n%s", stdout)
	}
	_, stderr, code = run("talos", "gen", "--rack", filepath.Join(dir, "missing.yaml"), "--out", out)
	if code == 0 || !strings.Contains(stderr, "read rack file") {
		t.Errorf("missing rack: exit %d, %s", code, stderr)
	}
}

func TestPXEServeRackErrors(t *testing.T) {
	dir := t.TempDir()
	ex, _, _ := run("rack", "init")
	withUUID := filepath.Join(dir, "uuid.yaml")
	if err := os.WriteFile(withUUID, []byte(ex), 0o644); err != nil {
		t.Fatal(err)
	}
	macsOnly := filepath.Join(dir, "macs.yaml")
	if err := os.WriteFile(macsOnly, []byte(strings.Replace(ex, "uuid: 4c4c4544-0042-3510-8052-b4c04f333432", "mac: 52:54:00:00:01:01", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		args    []string
		wantErr string
	}{
		{[]string{"--rack", filepath.Join(dir, "none.yaml")}, "read rack file"},
		{[]string{"--rack", withUUID}, "add --allow-unknown"},
		{[]string{"--rack", macsOnly}, "factory.talos.dev/image/"},
		{[]string{}, "no interface: name the boot network's interface (--interface"},
	}
	for _, tc := range tests {
		_, stderr, code := run(append([]string{"pxe", "serve"}, tc.args...)...)
		if code == 0 || !strings.Contains(stderr, tc.wantErr) {
			t.Errorf("pxe serve %v: exit %d, %s; want %q", tc.args, code, stderr, tc.wantErr)
		}
	}
}

func TestBootstrapCommandErrors(t *testing.T) {
	dir := t.TempDir()
	ex, _, _ := run("rack", "init")
	rackFile := filepath.Join(dir, "rack.yaml")
	if err := os.WriteFile(rackFile, []byte(ex), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		args    []string
		wantErr string
	}{
		{[]string{}, `required flag(s) "rack" not set`},
		{[]string{"--rack", rackFile}, "add --allow-unknown"},
		{[]string{"--rack", rackFile, "--allow-unknown"}, "factory.talos.dev/image/"},
		{[]string{"--rack", rackFile, "--no-netboot"}, "--no-netboot needs --inventory"},
	}
	for _, tc := range tests {
		_, stderr, code := run(append([]string{"bootstrap", "--state-dir", filepath.Join(dir, "state")}, tc.args...)...)
		if code == 0 || !strings.Contains(stderr, tc.wantErr) {
			t.Errorf("bootstrap %v: exit %d, %s; want %q", tc.args, code, stderr, tc.wantErr)
		}
	}

	out, stderr, code := run("bootstrap", "--rack", rackFile, "--dry-run", "-o", "json")
	var plan struct {
		Cluster string `json:"cluster"`
		Nodes   []struct {
			Hostname, Role, Disk string
		} `json:"nodes"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &plan) != nil || plan.Cluster != "lab" || len(plan.Nodes) != 4 || plan.Nodes[0].Disk != "/dev/sda" {
		t.Errorf("dry run: exit %d, %s %s", code, out, stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "lab")); !os.IsNotExist(err) {
		t.Error("the dry run created the default state dir")
	}
}

func TestLabCommands(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "lab")
	tests := []struct {
		args    []string
		code    int
		wantOut string
	}{
		{[]string{"lab", "up", "--dir", dir, "--controlplanes", "2"}, 1, "--controlplanes 2: use 1 or 3"},
		{[]string{"lab", "up", "--dir", dir, "--image", "talos"}, 1, "add --internet"},
		{[]string{"lab", "up", "--dir", dir, "--image", "talos", "--internet", "--factory", "factory.example.com"}, 1, "--factory \"factory.example.com\": want the Image Factory's http(s) URL"},
		{[]string{"lab", "down", "--dir", dir}, 0, "nothing to remove"},
		{[]string{"lab", "status", "--dir", dir}, 1, "no lab in"},
		{[]string{"lab", "console", "cp1", "--dir", dir}, 1, "no lab in"},
	}
	for _, tc := range tests {
		_, stderr, code := run(tc.args...)
		if code != tc.code || !strings.Contains(stderr, tc.wantOut) {
			t.Errorf("%v: exit %d, %s; want %d and %q", tc.args, code, stderr, tc.code, tc.wantOut)
		}
	}
}
