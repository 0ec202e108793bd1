package cli

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"cozy.dev/cozy/bootstrap/power"
	"cozy.dev/cozy/bootstrap/rack"
	"cozy.dev/cozy/lab/redfishbmc"
	"cozy.dev/cozy/lab/redfishbmc/bmctest"
)

// bmcRack writes a rack of three machines: two with lab BMCs on loopback,
// one whose BMC address answers nothing.
func bmcRack(t *testing.T) (string, map[string]*bmctest.Machine) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "bmc.yaml"), []byte("username: admin\npassword: hunter2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	vms := map[string]*bmctest.Machine{}
	var machines strings.Builder
	for i, name := range []string{"cp1", "w1", "w2"} {
		addr := ""
		if name == "w2" {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr = "http://" + l.Addr().String()
			l.Close()
		} else {
			vms[name] = bmctest.NewMachine(false)
			srv := httptest.NewServer(redfishbmc.New(redfishbmc.Credentials{Username: "admin", Password: "hunter2"}, slog.New(slog.DiscardHandler),
				redfishbmc.System{ID: name, UUID: fmt.Sprintf("00000000-0000-4000-8000-00000000000%d", i), MAC: fmt.Sprintf("52:54:00:00:00:0%d", i+1), CPUs: 1, MemoryMiB: 2048, DiskBytes: 10 << 30, Machine: vms[name]}))
			t.Cleanup(srv.Close)
			addr = srv.URL
		}
		role := "worker"
		if name == "cp1" {
			role = "controlplane"
		}
		fmt.Fprintf(&machines, "  - hostname: %s\n    role: %s\n    mac: 52:54:00:00:00:0%d\n    install: {disk: /dev/vda}\n    bmc:\n      address: redfish+%s\n      credentialsFile: bmc.yaml\n", name, role, i+1, addr)
	}
	f := filepath.Join(dir, "rack.yaml")
	doc := "apiVersion: cozy.dev/v1alpha1\nkind: Rack\nmetadata: {name: bmc}\ncluster: {endpoint: \"https://192.168.100.11:6443\"}\nnetwork: {interface: eth1, subnet: 192.168.100.0/24}\nmachines:\n" + machines.String()
	if err := os.WriteFile(f, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	return f, vms
}

func TestMachineCommands(t *testing.T) {
	rackFile, vms := bmcRack(t)

	out, stderr, code := run("machine", "boot", "pxe", "--once", "cp1", "w1", "--rack", rackFile)
	if code != 0 || !strings.Contains(out, "Pxe Once") {
		t.Fatalf("boot pxe: exit %d\n%s%s", code, out, stderr)
	}
	out, stderr, code = run("machine", "power", "on", "cp1", "w1", "--rack", rackFile, "-o", "json")
	var rows []power.Row
	if code != 0 || json.Unmarshal([]byte(out), &rows) != nil || len(rows) != 2 || rows[0].Power != "On" || rows[1].Power != "On" {
		t.Fatalf("power on: exit %d\n%s%s", code, out, stderr)
	}
	for name, m := range vms {
		if got := m.Calls(); !slices.Equal(got, []string{"start net"}) {
			t.Errorf("%s: %q, want powered on into a network boot", name, got)
		}
	}

	// --all reaches w2's dead BMC: its row says why, the others are done,
	// and the command fails.
	out, stderr, code = run("machine", "power", "status", "--all", "--rack", rackFile, "--timeout", "5s")
	if code == 0 || !strings.Contains(stderr, "1 of 3 machines failed") {
		t.Errorf("status --all: exit %d, stderr %s", code, stderr)
	}
	for _, want := range []string{"cp1 ", "w1 ", "On", "w2 ", "cannot reach the BMC"} {
		if !strings.Contains(out, want) {
			t.Errorf("status table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out+stderr, "hunter2") {
		t.Error("the output carries the BMC password")
	}

	out, stderr, code = run("machine", "inspect", "w1", "--rack", rackFile)
	if code != 0 || !strings.Contains(out, "52:54:00:00:00:02") || !strings.Contains(out, "vda 10G") {
		t.Errorf("inspect: exit %d\n%s%s", code, out, stderr)
	}

	for _, tc := range []struct {
		args []string
		err  string
	}{
		{[]string{"power", "bounce", "cp1"}, `unknown power action "bounce"`},
		{[]string{"power", "on"}, "name the machines, or give --all"},
		{[]string{"power", "on", "cp9"}, `no machine "cp9" in the rack (it has cp1, w1, w2)`},
		{[]string{"power", "on", "--all", "cp1"}, "not both"},
		{[]string{"boot", "pxe", "cp1"}, "give --once"},
		{[]string{"boot", "disk", "--once", "cp1"}, `unknown boot device "disk"`},
	} {
		_, stderr, code := run(append(append([]string{"machine"}, tc.args...), "--rack", rackFile)...)
		if code == 0 || !strings.Contains(stderr, tc.err) {
			t.Errorf("machine %v: exit %d, stderr %s; want %q", tc.args, code, stderr, tc.err)
		}
	}
}

// TestRackRefusesOpenCredentials: a credentials file others can read
// fails rack validation, naming the fix.
func TestRackRefusesOpenCredentials(t *testing.T) {
	rackFile, _ := bmcRack(t)
	if err := os.Chmod(filepath.Join(filepath.Dir(rackFile), "bmc.yaml"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, stderr, code := run("rack", "validate", rackFile)
	if code == 0 || !strings.Contains(out, "machines[0].bmc.credentialsFile") || !strings.Contains(out, "chmod 600") {
		t.Errorf("exit %d\n%s%s", code, out, stderr)
	}
}

// TestRackInitFromBMC: a rack written from BMCs' inventories names each
// machine by its UUID and its linked NIC's MAC, drives it through its BMC,
// and validates as it stands.
func TestRackInitFromBMC(t *testing.T) {
	rackFile, _ := bmcRack(t)
	r, err := rack.Load(rackFile)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(rackFile)
	t.Chdir(dir)
	out, stderr, code := run("rack", "init", "--name", "found", "--bmc-credentials", "bmc.yaml",
		"--from-bmc", r.Machines[0].BMC.Address+","+r.Machines[1].BMC.Address)
	if code != 0 {
		t.Fatalf("rack init --from-bmc: exit %d\n%s", code, stderr)
	}
	f := filepath.Join(dir, "found.yaml")
	if err := os.WriteFile(f, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	found, err := rack.Load(f)
	if err != nil {
		t.Fatalf("the rack from BMCs does not validate: %v\n%s", err, out)
	}
	if len(found.Machines) != 2 || found.Machines[0].Role != rack.RoleControlPlane || found.Machines[1].Hostname != "w1" {
		t.Fatalf("machines: %+v", found.Machines)
	}
	for i, m := range found.Machines {
		want := fmt.Sprintf("52:54:00:00:00:0%d", i+1)
		if m.MAC != want || m.UUID != fmt.Sprintf("00000000-0000-4000-8000-00000000000%d", i) || m.BMC == nil ||
			!strings.HasPrefix(m.BMC.Address, r.Machines[i].BMC.Address+"/redfish/v1/Systems/") {
			t.Errorf("machine %d: mac %s uuid %s bmc %+v; want mac %s and its BMC with the system's path", i, m.MAC, m.UUID, m.BMC, want)
		}
	}
	if !strings.Contains(out, "vda 10 GiB QEMU HARDDISK") {
		t.Errorf("the disks the BMC lists are not in the comments:\n%s", out)
	}

	// w2's BMC answers nothing: no rack, and the BMC that failed is named.
	_, stderr, code = run("rack", "init", "--bmc-credentials", "bmc.yaml", "--timeout", "5s",
		"--from-bmc", r.Machines[0].BMC.Address+","+r.Machines[2].BMC.Address)
	if code == 0 || !strings.Contains(stderr, r.Machines[2].BMC.Address) || !strings.Contains(stderr, "1 of 2 BMCs failed") {
		t.Errorf("a dead BMC: exit %d, stderr %s", code, stderr)
	}
	if _, stderr, code := run("rack", "init", "--from-bmc", r.Machines[0].BMC.Address); code == 0 || !strings.Contains(stderr, "credentials file is required") {
		t.Errorf("no credentials: exit %d, stderr %s", code, stderr)
	}
}
