// Package procstat reads what /proc says a process has used.
package procstat

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"time"
)

// CPU is the user and system CPU time process pid has used so far, as
// /proc/PID/stat counts it (clock ticks, 100 per second on Linux).
func CPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStat(data)
}

func parseStat(data []byte) (time.Duration, error) {
	// The fields after the command name, which is in parentheses and may
	// itself hold spaces and parentheses.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc stat %q: no command name", data)
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc stat: %d fields after the command name, want at least 13", len(f))
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc stat: utime %q, stime %q", f[11], f[12])
	}
	return time.Duration(utime+stime) * time.Second / 100, nil
}

// MachineCPU is the CPU time all of the machine's processors have spent
// busy so far (user, nice, system, irq, softirq and steal of /proc/stat's
// cpu line; idle and iowait left out): what a span of work cost the
// machine, whoever did it.
func MachineCPU() (time.Duration, error) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	return parseMachineStat(data)
}

func parseMachineStat(data []byte) (time.Duration, error) {
	line, _, _ := bytes.Cut(data, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 9 || f[0] != "cpu" {
		return 0, fmt.Errorf("/proc/stat: first line %q, want cpu and at least 8 counters", line)
	}
	var busy int64
	// user nice system idle iowait irq softirq steal
	for _, i := range []int{1, 2, 3, 6, 7, 8} {
		n, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/stat: counter %d %q", i, f[i])
		}
		busy += n
	}
	return time.Duration(busy) * time.Second / 100, nil
}

// Children are the process IDs of pid's children, as the kernel lists
// them per thread in /proc/PID/task/TID/children.
func Children(pid int) ([]int, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return nil, err
	}
	var out []int
	for _, task := range tasks {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, task.Name()))
		if err != nil {
			continue // the thread has ended
		}
		for _, f := range strings.Fields(string(data)) {
			child, err := strconv.Atoi(f)
			if err != nil {
				return nil, fmt.Errorf("/proc/%d/task/%s/children: %q", pid, task.Name(), f)
			}
			out = append(out, child)
		}
	}
	return out, nil
}

// ChildrenCPU is the CPU time pid's children have used so far (not
// their own children's): a benchmark's servers, which it started. A
// child that ends while it is read is left out.
func ChildrenCPU(pid int) (time.Duration, error) {
	children, err := Children(pid)
	if err != nil {
		return 0, err
	}
	var total time.Duration
	for _, child := range children {
		cpu, err := CPU(child)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, err
		}
		total += cpu
	}
	return total, nil
}
