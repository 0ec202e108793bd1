package leave

import (
	"errors"
	"strings"
	"testing"
)

func TestQuorumWithout(t *testing.T) {
	for _, tc := range []struct {
		name             string
		members, healthy []string
		remove           string
		refused          string // a part of the message; "" when allowed
	}{
		{"first of three", []string{"cp1", "cp2", "cp3"}, []string{"cp1", "cp2", "cp3"}, "cp3", ""},
		{"second of three: 1 of 2 is not a quorum", []string{"cp1", "cp2"}, []string{"cp1", "cp2"}, "cp2", "needs 2 of the 2 etcd members (cp1, cp2) healthy without it, and 1 are (cp1)"},
		{"a dead one of three", []string{"cp1", "cp2", "cp3"}, []string{"cp1", "cp2"}, "cp3", ""},
		{"a healthy one while another is dead", []string{"cp1", "cp2", "cp3"}, []string{"cp1", "cp3"}, "cp3", "needs 2 of the 3 etcd members"},
		{"the last one", []string{"cp1"}, []string{"cp1"}, "cp1", "and 0 are (none)"},
		{"one of five with one dead", []string{"a", "b", "c", "d", "e"}, []string{"a", "b", "c", "d"}, "d", ""},
		{"one of five with two dead", []string{"a", "b", "c", "d", "e"}, []string{"a", "b", "c"}, "c", "needs 3 of the 5"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := quorumWithout(tc.members, tc.healthy, tc.remove)
			switch {
			case tc.refused == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.refused != "" && err == nil:
				t.Fatal("allowed")
			case tc.refused != "" && (!errors.Is(err, ErrQuorum) || !strings.Contains(err.Error(), tc.refused)):
				t.Fatalf("message %q, want ErrQuorum and %q", err, tc.refused)
			}
		})
	}
}
