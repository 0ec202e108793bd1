//go:build integration && lab && bench

package lab_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"cozy.dev/cozy/internal/testing/verdict"
	"cozy.dev/cozy/lab/initramfs"
	"cozy.dev/cozy/lab/nodeimage"
	"cozy.dev/cozy/pxe"
	"cozy.dev/cozy/pxe/dhcp"
)

// TestBenchLabKernelTCG boots the lab's kernel under TCG (2 vCPUs, as a
// control plane gets) with lab/internal/tcgprobe as its /init, three
// times with the command line the netboot server gives Talos (its
// default arguments: pti=on among them) and three times with the lab's
// nodeimage.TCGArgs after it, alternating, and compares the median cost of a clock
// read and of a system call. Goal: each ≥ 2× cheaper with TCGArgs, the
// clock read from the TSC and page-table isolation off.
func TestBenchLabKernelTCG(t *testing.T) {
	requireLab(t)
	dir := t.TempDir()
	probe := filepath.Join(dir, "tcgprobe")
	build := exec.Command("go", "build", "-trimpath", "-o", probe, "cozy.dev/cozy/lab/internal/tcgprobe")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build tcgprobe: %v\n%s", err, out)
	}
	bin, err := os.ReadFile(probe)
	if err != nil {
		t.Fatal(err)
	}
	var a initramfs.Archive
	a.File("init", 0o755, bin)
	var img bytes.Buffer
	if _, err := a.WriteTo(&img); err != nil {
		t.Fatal(err)
	}
	initrd := filepath.Join(dir, "initrd")
	if err := os.WriteFile(initrd, img.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	talos := pxe.TalosCmdline(dhcp.AMD64, nodeimage.Cmdline)
	if !strings.Contains(talos, "pti=on") {
		t.Logf("Talos's default arguments no longer hold pti=on: %s", talos)
	}
	runs := map[bool][]probeResult{}
	// A boot whose probe prints nothing in time is counted and tried
	// again, once per boot: on 2026-12-07 one of three boots with
	// Talos's arguments stopped after "pnp: PnP ACPI: found 6 devices"
	// and printed nothing for 5 minutes, which ended the whole bench.
	hung := map[bool]int{}
	name := map[bool]string{false: "Talos's arguments", true: "with " + nodeimage.TCGArgs}
	kernel := filepath.Join(os.Getenv("COZY_BOOT_ASSETS"), "vmlinuz")
	for i := range 6 {
		withArgs := i%2 == 1
		cmdline := talos
		if withArgs {
			cmdline += " " + nodeimage.TCGArgs
		}
		r, err := bootProbe(kernel, initrd, cmdline)
		if err != nil {
			hung[withArgs]++
			t.Logf("%s, boot %d: %v; booting again", name[withArgs], i+1, err)
			if r, err = bootProbe(kernel, initrd, cmdline); err != nil {
				t.Fatalf("%s, boot %d, twice: %v", name[withArgs], i+1, err)
			}
		}
		t.Logf("%-24s %+v", name[withArgs], r)
		runs[withArgs] = append(runs[withArgs], r)
	}
	median := func(rs []probeResult, f func(probeResult) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	now := func(r probeResult) float64 { return r.nowNs }
	sys := func(r probeResult) float64 { return r.syscallNs }
	pipe := func(r probeResult) float64 { return r.pipeNs }
	fmt.Printf("lab kernel under TCG, 2 vCPUs, medians of 3 boots each (ns):\n  %-22s %12s %12s %8s\n", "", "Talos's args", "+"+nodeimage.TCGArgs, "ratio")
	for _, row := range []struct {
		name string
		f    func(probeResult) float64
	}{{"time.Now", now}, {"getppid", sys}, {"pipe round trip", pipe}} {
		a, b := median(runs[false], row.f), median(runs[true], row.f)
		fmt.Printf("  %-22s %12.0f %12.0f %7.1fx\n", row.name, a, b, a/b)
	}
	fmt.Printf("  boots whose probe printed nothing within %v, booted again: %d with Talos's args, %d %s\n",
		probeTimeout, hung[false], hung[true], name[true])
	last := runs[true][len(runs[true])-1]
	verdict.Report("lab kernel under TCG: clock source and PTI with "+nodeimage.TCGArgs,
		fmt.Sprintf("%s, pti %t", last.clock, last.pti), "tsc, pti false", last.clock == "tsc" && !last.pti)
	verdict.AtLeast("lab kernel under TCG: time.Now, Talos's args / with "+nodeimage.TCGArgs,
		median(runs[false], now)/median(runs[true], now), 2, "%.1f")
	verdict.AtLeast("lab kernel under TCG: getppid, Talos's args / with "+nodeimage.TCGArgs,
		median(runs[false], sys)/median(runs[true], sys), 2, "%.1f")
}

type probeResult struct {
	clock                    string
	pti                      bool
	nowNs, syscallNs, pipeNs float64
}

var probeLine = regexp.MustCompile(`tcgprobe clocksource=(\S+) pti=(\S+) now_ns=(\d+) syscall_ns=(\d+) pipe_ns=(\d+)`)

// probeTimeout bounds one boot: a boot that completes takes about 10 s.
const probeTimeout = 2 * time.Minute

// bootProbe boots the kernel with the probe as /init under TCG and
// returns what it printed, or an error with the console's end if the
// probe printed nothing within probeTimeout.
func bootProbe(kernelPath, initrd, cmdline string) (probeResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, "qemu-system-x86_64", "-machine", "pc", "-accel", "tcg", "-cpu", "max", "-smp", "2",
		"-m", "512", "-display", "none", "-serial", "stdio", "-monitor", "none", "-nic", "none", "-no-reboot",
		"-kernel", kernelPath, "-initrd", initrd, "-append", cmdline).CombinedOutput()
	m := probeLine.FindStringSubmatch(string(out))
	if m == nil {
		return probeResult{}, fmt.Errorf("the probe printed nothing (qemu: %v); the console's end:\n%s", err, tail(string(out), 3000))
	}
	num := func(s string) float64 { f, _ := strconv.ParseFloat(s, 64); return f }
	return probeResult{clock: m[1], pti: m[2] == "true", nowNs: num(m[3]), syscallNs: num(m[4]), pipeNs: num(m[5])}, nil
}
