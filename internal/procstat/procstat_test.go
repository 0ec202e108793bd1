package procstat

import (
	"os"
	"testing"
	"time"
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
