// Command tcgprobe is the /init of the VM that TestBenchLabKernelTCG
// boots under TCG: it prints, on one line, the kernel's clock source,
// whether page-table isolation is on, and what a clock read, a system
// call and a pipe round trip cost, then powers the VM off.
package main

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"
)

func main() {
	_ = os.MkdirAll("/sys", 0o755)
	_ = os.MkdirAll("/proc", 0o755)
	_ = syscall.Mount("sysfs", "/sys", "sysfs", 0, "")
	_ = syscall.Mount("proc", "/proc", "proc", 0, "")
	// The kernel first registers the TSC as "tsc-early" and replaces it
	// with "tsc" once it has refined its calibration, a second or more
	// after boot: wait for that, so that the probe measures the clock a
	// node runs on (and a run that reads too early does not miss).
	clock := clocksource()
	for deadline := time.Now().Add(20 * time.Second); clock == "tsc-early" && time.Now().Before(deadline); clock = clocksource() {
		time.Sleep(100 * time.Millisecond)
	}
	fmt.Printf("tcgprobe clocksource=%s pti=%t now_ns=%d syscall_ns=%d pipe_ns=%d\n",
		clock, pti(), perOp(200000, func() { _ = time.Now() }),
		perOp(100000, func() { _ = syscall.Getppid() }), pipeRoundTrip(20000))
	syscall.Sync()
	_ = syscall.Reboot(syscall.LINUX_REBOOT_CMD_POWER_OFF)
}

// clocksource is the kernel's current clock source.
func clocksource() string {
	b, _ := os.ReadFile("/sys/devices/system/clocksource/clocksource0/current_clocksource")
	return strings.TrimSpace(string(b))
}

// pti says whether the kernel isolates its page tables: the pti flag in
// /proc/cpuinfo.
func pti() bool {
	info, _ := os.ReadFile("/proc/cpuinfo")
	for _, line := range strings.Split(string(info), "\n") {
		if name, flags, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(name) == "flags" {
			return slices.Contains(strings.Fields(flags), "pti")
		}
	}
	return false
}

// perOp is the mean time of f over n calls, in nanoseconds.
func perOp(n int, f func()) int64 {
	start := time.Now()
	for range n {
		f()
	}
	return time.Since(start).Nanoseconds() / int64(n)
}

// pipeRoundTrip is the mean time of writing a byte to a pipe and reading
// it back, in nanoseconds.
func pipeRoundTrip(n int) int64 {
	var p [2]int
	if err := syscall.Pipe(p[:]); err != nil {
		return -1
	}
	b := make([]byte, 1)
	return perOp(n, func() {
		_, _ = syscall.Write(p[1], b)
		_, _ = syscall.Read(p[0], b)
	})
}
