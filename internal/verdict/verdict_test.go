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
	want := "verdict | cozy / kea | 1.62 | ≥ 1.50 | PASS\n" +
		"verdict | RSS, MB | 180 | ≤ 150 | MISS: 180 vs ≤ 150\n" +
		"verdict | a / b | 3 s | ≤ 5 s | PASS\n"
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}
