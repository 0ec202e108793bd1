//go:build integration

package redfishbmc

import (
	"log/slog"
	"net/http/httptest"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"cozy.dev/cozy/internal/testing/prereq"
	"cozy.dev/cozy/lab/redfishbmc/bmctest"
)

// TestSushyDrivesTheLabBMC: the lab's BMC answers sushy, the Redfish
// client OpenStack Ironic drives real iDRACs and iLOs with (Debian's
// python3-sushy), over HTTPS with a self-signed certificate: power state,
// allowed resets, a one-time PXE boot that the next power-on takes, NICs,
// disks, and Redfish's 404 for an unknown system.
func TestSushyDrivesTheLabBMC(t *testing.T) {
	const python = "/usr/bin/python3" // Debian's, where python3-sushy lives
	if err := exec.Command(python, "-c", "import sushy").Run(); err != nil {
		prereq.Missing(t, "python3-sushy is not installed (hack/install-deps.sh): %v", err)
	}
	m := bmctest.NewMachine(false)
	srv := httptest.NewTLSServer(New(Credentials{"admin", "s3cret-sushy"}, slog.New(slog.DiscardHandler),
		System{ID: "n1", UUID: "0a0b0c0d-0000-4000-8000-000000000001", MAC: "52:54:00:aa:bb:01", CPUs: 2, MemoryMiB: 2048, DiskBytes: 8 << 30, Machine: m}))
	defer srv.Close()
	cmd := exec.CommandContext(t.Context(), python, "testdata/sushy_drive.py")
	// An environment of its own: requests lets REQUESTS_CA_BUNDLE override
	// verify=False, and no proxy may see a loopback request.
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + t.TempDir(), "NO_PROXY=*", "PYTHONWARNINGS=ignore",
		"BMC_URL=" + srv.URL, "BMC_USER=admin", "BMC_PASSWORD=s3cret-sushy", "BMC_SYSTEM=/redfish/v1/Systems/n1"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("sushy: %v\n%s", err, out)
	}
	got := strings.TrimSpace(string(out))
	for _, want := range []string{
		"power PowerState.OFF",
		"allowed ResetType.FORCE_OFF,ResetType.FORCE_ON,ResetType.FORCE_RESTART,ResetType.GRACEFUL_RESTART,ResetType.GRACEFUL_SHUTDOWN,ResetType.ON",
		"power PowerState.ON",
		// The one-time override, taken by the power-on, is cleared.
		"boot BootSource.NONE BootSourceOverrideEnabled.DISABLED",
		"nics 52:54:00:aa:bb:01",
		"disk [8589934592]",
		"missing 404",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("sushy's output lacks %q:\n%s", want, got)
		}
	}
	if got := m.Calls(); !slices.Equal(got, []string{"start net", "off"}) {
		t.Errorf("the machine was told %q; want to start once, netbooting, then to power off", got)
	}
}
