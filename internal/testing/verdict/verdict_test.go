package verdict

import (
	"bytes"
	"testing"
)

func TestLines(t *testing.T) {
	var b bytes.Buffer
	old := Out
	Out = &b
	defer func() { Out = old }()
	AtLeast("cozy / kea", 1.62, 1.5, "%.2f")
	AtMost("RSS, MB", 180, 150, "%.0f")
	Report("a | b", "3 s", "≤ 5 s", true)
	AtLeast("cozy / nginx", 0.8996, 0.9, "%.2f") // a miss that %.2f would hide
	AtMost("RSS, MB", 150.2, 150, "%.0f")
	AtLeast("equal", 0.9, 0.9, "%.2f")
	want := "verdict | cozy / kea | 1.62 | ≥ 1.50 | PASS\n" +
		"verdict | RSS, MB | 180 | ≤ 150 | MISS: 180 vs ≤ 150\n" +
		"verdict | a / b | 3 s | ≤ 5 s | PASS\n" +
		"verdict | cozy / nginx | 0.8996 | ≥ 0.90 | MISS: 0.8996 vs ≥ 0.90\n" +
		"verdict | RSS, MB | 150.2 | ≤ 150 | MISS: 150.2 vs ≤ 150\n" +
		"verdict | equal | 0.90 | ≥ 0.90 | PASS\n"
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}
