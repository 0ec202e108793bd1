//go:build integration

package bmc_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"cozy.dev/cozy/bmc"
	"cozy.dev/cozy/internal/testing/prereq"
)

// ipmiSim runs OpenIPMI's BMC simulator (ipmi_sim, Debian's openipmi) on
// loopback: an IPMI implementation that is not Cozy's. Its chassis
// control program keeps the power and boot device in files and logs each
// call, as a board's power controller would act on them.
func ipmiSim(t *testing.T) (bmc.Target, func() []string) {
	t.Helper()
	for _, bin := range []string{bmc.IPMITool, "ipmi_sim"} {
		if _, err := exec.LookPath(bin); err != nil {
			prereq.Missing(t, "%s is not installed (hack/install-deps.sh: ipmitool, openipmi)", bin)
		}
	}
	dir := t.TempDir()
	l, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.LocalAddr().(*net.UDPAddr).Port
	l.Close()
	control := `#!/bin/sh
# ipmi_sim calls: control MC get PARAM... | set PARAM VALUE...
d=` + dir + `
echo "$*" >> $d/calls
mc=$1; op=$2; shift 2
case "$op" in
get) for p in "$@"; do case "$p" in
	power) echo "power:$(cat $d/power 2>/dev/null || echo 0)";;
	boot) echo "boot:$(cat $d/boot 2>/dev/null || echo default)";;
	esac; done;;
set) while [ $# -gt 1 ]; do case "$1" in
	power) echo "$2" > $d/power;;
	shutdown) echo 0 > $d/power;;
	boot) echo "$2" > $d/boot;;
	esac; shift 2; done;;
esac
`
	files := map[string]string{
		"control.sh": control,
		"lan.conf": fmt.Sprintf(`name "cozy-test"
set_working_mc 0x20
  startlan 1
    addr 127.0.0.1 %d
    priv_limit admin
    allowed_auths_callback none md2 md5 straight
    allowed_auths_user none md2 md5 straight
    allowed_auths_operator none md2 md5 straight
    allowed_auths_admin none md2 md5 straight
    guid a123456789abcdefa123456789abcdef
  endlan
  chassis_control "%s/control.sh 0x20"
  user 1 true  ""      "test"    user  10 none md2 md5 straight
  user 2 true  "%s" "%s" admin 10 none md2 md5 straight
`, port, dir, creds.Username, creds.Password),
		"sim.emu": "mc_setbmc 0x20\nmc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02 persist_sdr\nmc_enable 0x20\n",
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	sim := exec.CommandContext(ctx, "ipmi_sim", "-c", filepath.Join(dir, "lan.conf"), "-f", filepath.Join(dir, "sim.emu"), "-n", "-s", filepath.Join(dir, "state"))
	var log strings.Builder
	sim.Stdout, sim.Stderr = &log, &log
	if err := sim.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = sim.Wait()
		if t.Failed() {
			t.Logf("ipmi_sim:\n%s", log.String())
		}
	})
	a, err := bmc.ParseAddress(fmt.Sprintf("ipmi://127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	calls := func() []string {
		data, _ := os.ReadFile(filepath.Join(dir, "calls"))
		var sets []string
		for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
			if strings.Contains(l, " set ") {
				sets = append(sets, strings.TrimPrefix(l, "0x20 set "))
			}
		}
		return sets
	}
	// ipmi_sim needs a moment to bind its port.
	target := bmc.Target{Address: a, Credentials: creds, Timeout: 10 * time.Second}
	for deadline := time.Now().Add(10 * time.Second); ; {
		c, err := bmc.Dial(t.Context(), target)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ipmi_sim does not answer: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return target, calls
}

// TestIPMIAgainstOpenIPMI drives OpenIPMI's simulator through ipmitool:
// every power action, a one-time network boot and its restore, the
// inventory IPMI has, and wrong credentials.
func TestIPMIAgainstOpenIPMI(t *testing.T) {
	target, calls := ipmiSim(t)
	c, err := bmc.Dial(t.Context(), target)
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		action bmc.Action
		after  bmc.PowerState
	}{
		{bmc.On, bmc.PowerOn}, {bmc.On, bmc.PowerOn}, {bmc.Reset, bmc.PowerOn}, {bmc.Cycle, bmc.PowerOn},
		{bmc.Soft, bmc.PowerOff}, {bmc.Cycle, bmc.PowerOn}, {bmc.Off, bmc.PowerOff}, {bmc.Off, bmc.PowerOff},
	}
	for _, s := range steps {
		if err := c.Power(t.Context(), s.action); err != nil {
			t.Fatalf("%s: %v", s.action, err)
		}
		if got, err := c.PowerState(t.Context()); err != nil || got != s.after {
			t.Fatalf("after %s: %s, %v; want %s", s.action, got, err, s.after)
		}
	}
	if err := c.Power(t.Context(), bmc.Reset); err == nil || !strings.Contains(err.Error(), "the machine is off") {
		t.Errorf("reset when off: %v", err)
	}
	want := []string{"power 1", "reset 1", "power 0", "power 1", "shutdown 1", "power 1", "power 0"}
	defer func() { t.Logf("calls: %q", calls()) }()
	if got := calls(); !slices.Equal(got, want) {
		t.Errorf("the board's power controller saw %q, want %q", got, want)
	}

	// ipmi_sim hands the boot device to the board's control program and
	// keeps no valid or persistent bit of its own, so only the device is
	// checked (ParseIPMIBootFlags reads those bits as a BMC sets them).
	ch, err := c.BootPXEOnce(t.Context())
	if err != nil || ch.Now != (bmc.Boot{Target: "Pxe", Enabled: "Once"}) {
		t.Fatalf("BootPXEOnce: %+v, %v", ch, err)
	}
	if again, err := c.BootPXEOnce(t.Context()); err != nil || again.Previous.Target != "Pxe" {
		t.Errorf("the boot device after a network boot was set: %+v, %v; want Pxe", again.Previous, err)
	}
	if err := c.SetBoot(t.Context(), bmc.Boot{Target: "None", Enabled: "Disabled"}); err != nil {
		t.Fatal(err)
	}
	if got := calls(); !slices.Contains(got, "boot pxe") || got[len(got)-1] != "boot none" {
		t.Errorf("the board's boot control saw %q, want boot pxe, then boot none", got)
	}

	inv, err := c.Inspect(t.Context())
	if err != nil || inv.UUID == "" || inv.PowerState != bmc.PowerOff {
		t.Errorf("Inspect: %+v, %v; want the system GUID and the power state", inv, err)
	}

	wrong := target
	wrong.Credentials.Password = "not-it"
	_, err = bmc.Dial(t.Context(), wrong)
	if err == nil || !strings.Contains(err.Error(), "no IPMI session") || strings.Contains(err.Error(), "not-it") {
		t.Errorf("wrong password: %v", err)
	}
}
