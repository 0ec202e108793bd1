package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"cozy.dev/cozy/pxe/inventory"
)

func TestPXEMachines(t *testing.T) {
	dir := t.TempDir()
	fixture := `[{"mac":"52:54:00:00:00:0a","uuid":"12345678-9abc-def0-1234-56789abcdef0","arch":"amd64","firmware":"uefi",
"ip":"10.8.0.10","vendorClass":"PXEClient:Arch:00007","phase":"initrd","allowed":true,
"firstSeen":"2026-11-29T12:00:00Z","lastSeen":"2026-11-29T12:01:00Z"},
{"mac":"52:54:00:00:00:0b","phase":"dhcp","allowed":false,"firstSeen":"2026-11-29T12:00:00Z","lastSeen":"2026-11-29T12:00:00Z"}]`
	if err := os.WriteFile(filepath.Join(dir, inventory.File), []byte(fixture), 0o644); err != nil {
		t.Fatal(err)
	}

	stdout, stderr, code := run("pxe", "machines", "--state-dir", dir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "MAC") ||
		!strings.Contains(lines[1], "10.8.0.10") || !strings.Contains(lines[1], "initrd") ||
		!strings.Contains(lines[2], "false") {
		t.Errorf("table:\n%s", stdout)
	}

	stdout, _, code = run("pxe", "machines", "--state-dir", dir, "-o", "json")
	var got []inventory.Machine
	if code != 0 || json.Unmarshal([]byte(stdout), &got) != nil || len(got) != 2 || got[0].IP.String() != "10.8.0.10" {
		t.Errorf("json: %s", stdout)
	}

	_, stderr, code = run("pxe", "machines", "--state-dir", filepath.Join(dir, "nowhere"))
	if code == 0 || !strings.Contains(stderr, "is cozyctl pxe serve running") {
		t.Errorf("missing state: exit %d, %s", code, stderr)
	}
}

func TestPXEServeFlagErrors(t *testing.T) {
	// Boot files that exist, so the check gets to the arm64 ones.
	boots := []string{"--allow-unknown", "--kernel", "/bin/sh", "--initrd", "/bin/sh", "--ipxe-bios", "/bin/sh", "--ipxe-uefi", "/bin/sh", "--ipxe-arm64", ""}
	tests := []struct {
		args    []string
		wantErr string
	}{
		{[]string{"--mode", "relay"}, `mode "relay": use proxy or full`},
		{[]string{"--range", "10.0.0.1-10.0.0.9"}, "add --mode full"},
		{[]string{"--mode", "full", "--range", "10.0.0.9-10.0.0.1"}, "--range"},
		{[]string{"--mode", "full", "--reserve", "nonsense"}, "want MAC=IP"},
		{[]string{"--allow-mac", "zz"}, "--allow-mac"},
		{[]string{"--server-ip", "fd00::1"}, "IPv4"},
		{[]string{"--pool", "10.80.1.0/24,10.80.1.10-10.80.1.20"}, "add --mode full"},
		{[]string{"--mode", "full", "--pool", "10.80.1.0/24"}, "no range"},
		{[]string{"--mode", "full", "--pool", "10.80.1.0,10.80.1.10-10.80.1.20"}, "not an IPv4 network"},
		{[]string{"--mode", "full", "--pool", "10.80.1.0/24,10.80.1.10-10.80.1.20,router=10.80.1.1"}, "only gateway="},
		{[]string{"--mode", "full", "--pool", "10.80.1.0/24,10.80.1.10-10.80.1.20,gateway=x"}, "want gateway=IPv4"},
		{[]string{"--mode", "full", "--gateway", "10.8.0.1", "--pool", "10.80.1.0/24,10.80.1.10-10.80.1.20"}, "no address range"},
		{slices.Concat(boots, []string{"--kernel-arm64", "/bin/sh"}), "--initrd-arm64"},
		{slices.Concat(boots, []string{"--initrd-arm64", "/bin/sh"}), "--kernel-arm64"},
		{slices.Concat(boots, []string{"--kernel-arm64", "/bin/sh", "--initrd-arm64", "/nonexistent", "--ipxe-arm64", "/bin/sh"}), "arm64 boot file"},
		{slices.Concat(boots, []string{"--snponly", "eth0"}), `snponly.efi for "eth0": want a MAC`},
		{slices.Concat(boots, []string{"--snponly", "52:54:00:12:34:56", "--ipxe-snponly", "/nonexistent"}), "snponly boot file"},
	}
	for _, tc := range tests {
		args := append([]string{"pxe", "serve", "--interface", "lo"}, tc.args...)
		_, stderr, code := run(args...)
		if code == 0 || !strings.Contains(stderr, tc.wantErr) {
			t.Errorf("%v: exit %d, stderr %q, want %q", tc.args, code, stderr, tc.wantErr)
		}
	}
}

func TestParsePoolFlag(t *testing.T) {
	n, err := parsePoolFlag("10.80.1.7/24,10.80.1.100-10.80.1.199,gateway=10.80.1.1,dns=10.8.0.53,dns=10.8.0.54")
	if err != nil {
		t.Fatal(err)
	}
	if n.Subnet.String() != "10.80.1.0/24" || n.Pool.String() != "10.80.1.100-10.80.1.199" || n.Gateway.String() != "10.80.1.1" ||
		len(n.DNS) != 2 || n.DNS[1].String() != "10.8.0.54" {
		t.Errorf("parsed %+v", n)
	}
	if _, err := parsePoolFlag("10.80.1.0/24,10.80.1.100-10.80.1.199,gateway=10.80.1.1,gateway=10.80.1.2"); err == nil {
		t.Error("two gateways accepted")
	}
}
