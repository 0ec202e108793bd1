package inventory

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"
)

const macA = "52:54:00:00:00:0a"

var ipA = netip.MustParseAddr("10.8.0.10")

type event struct {
	dhcp  *DHCPSighting
	phase Phase      // Advance to this
	mac   string     // for Advance; "" = by IP
	ip    netip.Addr // for Advance
}

func firmwareDHCP(ipxe bool) event {
	return event{dhcp: &DHCPSighting{MAC: macA, UUID: "u", Arch: "amd64", Firmware: "uefi", Allowed: true, Answered: true, IPXE: ipxe}}
}

func TestPhases(t *testing.T) {
	tests := []struct {
		name   string
		events []event
		want   Phase
	}{
		{"UEFI firmware PXE chain", []event{
			// The 4011 request told the server the MAC's IP.
			firmwareDHCP(false), {phase: PhaseIPXEBinary, mac: macA, ip: ipA}, firmwareDHCP(true),
			{phase: PhaseIPXEScript, mac: macA, ip: ipA}, {phase: PhaseKernel, ip: ipA}, {phase: PhaseInitrd, ip: ipA},
		}, PhaseInitrd},
		{"iPXE ROM straight to the script", []event{firmwareDHCP(true), {phase: PhaseIPXEScript, mac: macA, ip: ipA}}, PhaseIPXEScript},
		{"reboot starts over", []event{
			firmwareDHCP(true), {phase: PhaseIPXEScript, mac: macA, ip: ipA}, {phase: PhaseKernel, ip: ipA},
			{phase: PhaseInitrd, ip: ipA}, {phase: PhaseConfig, mac: macA, ip: ipA}, firmwareDHCP(false),
		}, PhaseDHCP},
		{"iPXE after its own download is the same boot", []event{
			firmwareDHCP(false), {phase: PhaseIPXEBinary, mac: macA, ip: ipA}, firmwareDHCP(true),
		}, PhaseIPXEBinary},
		{"a repeated download later in the boot does not go back", []event{
			firmwareDHCP(true), {phase: PhaseIPXEScript, mac: macA, ip: ipA}, {phase: PhaseKernel, ip: ipA},
			{phase: PhaseInitrd, ip: ipA}, {phase: PhaseIPXEScript, mac: macA, ip: ipA},
		}, PhaseInitrd},
		{"OS DHCP without boot information changes nothing", []event{
			firmwareDHCP(true), {phase: PhaseIPXEScript, mac: macA, ip: ipA}, {phase: PhaseInitrd, ip: ipA},
			{dhcp: &DHCPSighting{MAC: macA, IP: ipA, Allowed: true}},
		}, PhaseInitrd},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			inv, err := Open(t.TempDir(), nil)
			if err != nil {
				t.Fatal(err)
			}
			for i, e := range tc.events {
				if e.dhcp != nil {
					inv.SawDHCP(*e.dhcp)
					continue
				}
				if !inv.Advance(e.mac, e.ip, e.phase) {
					t.Fatalf("event %d: machine at %v unknown", i, e.ip)
				}
			}
			m, ok := inv.Get(macA)
			if !ok || m.Phase != tc.want {
				t.Fatalf("phase %q, want %q", m.Phase, tc.want)
			}
		})
	}
}

func TestInstalled(t *testing.T) {
	inv, _ := Open(t.TempDir(), nil)
	inv.SawDHCP(*firmwareDHCP(false).dhcp)
	inv.Advance(macA, ipA, PhaseConfig)
	if m, _ := inv.Get(macA); m.Installed {
		t.Fatal("installed before it rebooted")
	}
	inv.SawDHCP(*firmwareDHCP(false).dhcp) // Talos installed and rebooted
	if m, _ := inv.Get(macA); !m.Installed || m.Phase != PhaseDHCP {
		t.Fatalf("after the reboot: %+v", m)
	}
}

func TestAdvanceUnknownIP(t *testing.T) {
	inv, _ := Open(t.TempDir(), nil)
	if inv.Advance("", netip.MustParseAddr("10.8.0.99"), PhaseKernel) {
		t.Error("advanced a machine nobody has seen")
	}
	if len(inv.List()) != 0 {
		t.Error("an unknown IP created a machine")
	}
}

func TestPersistence(t *testing.T) {
	dir := t.TempDir()
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	inv, err := Open(dir, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	inv.SawDHCP(DHCPSighting{MAC: macA, UUID: "12345678-9abc-def0-1234-56789abcdef0", Arch: "amd64", Firmware: "bios",
		VendorClass: "PXEClient", IP: ipA, Allowed: true, Answered: true})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := inv.Run(ctx, time.Hour); err != nil { // flushes on the way out
		t.Fatal(err)
	}
	got, err := Load(dir)
	if err != nil || len(got) != 1 {
		t.Fatalf("load: %v %v", got, err)
	}
	m := got[0]
	if m.MAC != macA || m.IP != ipA || m.Phase != PhaseDHCP || !m.FirstSeen.Equal(now) || m.UUID == "" || !m.Allowed {
		t.Errorf("round trip: %+v", m)
	}
	again, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if mac, ok := again.MACAt(ipA); !ok || mac != macA {
		t.Error("reopened inventory forgot which machine has which IP")
	}
}

func TestFlushCrashSafe(t *testing.T) {
	dir := t.TempDir()
	inv, err := Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	inv.SawDHCP(DHCPSighting{MAC: "52:54:00:00:00:01", Allowed: true})
	if err := inv.Flush(); err != nil {
		t.Fatal(err)
	}
	// A crash in the middle of a later flush leaves its temporary file.
	if err := os.WriteFile(filepath.Join(dir, ".machines.json.tmp123"), []byte("[{"), 0o644); err != nil {
		t.Fatal(err)
	}
	inv, err = Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := inv.Get("52:54:00:00:00:01"); !ok {
		t.Error("machine lost across a restart")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 || entries[0].Name() != File {
		t.Errorf("state dir holds %v, want only %s", entries, File)
	}
}
