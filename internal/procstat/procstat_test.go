package procstat

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"

	"cozy.dev/cozy/internal/testing/poll"
)

func TestParseStat(t *testing.T) {
	tests := []struct {
		name    string
		stat    string
		want    time.Duration
		wantErr bool
	}{
		{"qemu", "4242 (qemu-system-x86) S 1 4242 4242 0 -1 4194624 100 0 0 0 1234 56 0 0 20 0 3 0 100 0", 12900 * time.Millisecond, false},
		{"a name with spaces and parentheses", "7 (a (b) c) R 1 7 7 0 -1 0 0 0 0 0 3 4 0 0", 70 * time.Millisecond, false},
		{"no name", "7 R 1", 0, true},
		{"cut short", "7 (x) R 1 2 3", 0, true},
		{"not numbers", "7 (x) R 1 7 7 0 -1 0 0 0 0 0 a b 0 0", 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseStat([]byte(tc.stat))
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("parseStat = %v, %v; want %v (error %v)", got, err, tc.want, tc.wantErr)
			}
		})
	}
	if _, err := CPU(os.Getpid()); err != nil {
		t.Errorf("this process: %v", err)
	}
}

func TestParseMachineStat(t *testing.T) {
	tests := []struct {
		name    string
		stat    string
		want    time.Duration
		wantErr bool
	}{
		// user nice system idle iowait irq softirq steal guest guest_nice
		{"two cores", "cpu  100 2 30 9000 50 4 5 6 0 0\ncpu0 50 1 15 4500 25 2 2 3 0 0\n", 1470 * time.Millisecond, false},
		{"an old kernel's eight counters", "cpu 1 0 0 5 0 0 0 0\n", 10 * time.Millisecond, false},
		{"a cpuN line first", "cpu0 1 2 3 4 5 6 7 8\n", 0, true},
		{"cut short", "cpu 1 2 3\n", 0, true},
		{"not numbers", "cpu 1 x 3 4 5 6 7 8\n", 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseMachineStat([]byte(tc.stat))
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("parseMachineStat = %v, %v; want %v (error %v)", got, err, tc.want, tc.wantErr)
			}
		})
	}
	if _, err := MachineCPU(); err != nil {
		t.Errorf("this machine: %v", err)
	}
}

// TestChildrenCPU: a child that has burnt CPU is listed, and counted.
func TestChildrenCPU(t *testing.T) {
	busy := exec.Command("sh", "-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; exec sleep 60")
	if err := busy.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = busy.Process.Kill(); _ = busy.Wait() })
	poll.Within(t, time.Minute, 50*time.Millisecond, "the child's CPU counted", func() error {
		children, err := Children(os.Getpid())
		if err != nil {
			return err
		}
		if !slices.Contains(children, busy.Process.Pid) {
			return fmt.Errorf("children %v, want %d among them", children, busy.Process.Pid)
		}
		own, err := CPU(busy.Process.Pid)
		if err != nil {
			return err
		}
		all, err := ChildrenCPU(os.Getpid())
		if err != nil {
			return err
		}
		if own == 0 || all < own {
			return fmt.Errorf("the child used %v, all children %v", own, all)
		}
		return nil
	})
}
