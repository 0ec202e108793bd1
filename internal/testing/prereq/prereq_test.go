package prereq

import (
	"strings"
	"testing"
)

// recorder is a testing.TB that records how Missing stopped the test.
type recorder struct {
	testing.TB
	failed, skipped string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) { r.failed = format }

func (r *recorder) Skipf(format string, args ...any) { r.skipped = format }

func TestMissing(t *testing.T) {
	tests := []struct {
		ci       string
		wantFail bool
	}{
		{"true", true},
		{"", false},
		{"false", false},
	}
	for _, tc := range tests {
		t.Run("CI="+tc.ci, func(t *testing.T) {
			t.Setenv("CI", tc.ci)
			r := &recorder{TB: t}
			Missing(r, "qemu-system-x86_64 not found")
			if tc.wantFail && (r.failed == "" || r.skipped != "") {
				t.Errorf("under CI=%s a missing prerequisite must fail, got failed=%q skipped=%q", tc.ci, r.failed, r.skipped)
			}
			if !tc.wantFail && (r.skipped == "" || r.failed != "") {
				t.Errorf("outside CI a missing prerequisite skips, got failed=%q skipped=%q", r.failed, r.skipped)
			}
			if msg := r.failed + r.skipped; !strings.Contains(msg, "missing prerequisite") {
				t.Errorf("message %q does not say what is missing", msg)
			}
		})
	}
}
