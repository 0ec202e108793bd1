package output

import (
	"bytes"
	"strings"
	"testing"
)

type rows struct {
	Name   string `json:"name"`
	header []string
	rows   [][]string
}

func (r rows) Header() []string { return r.header }
func (r rows) Rows() [][]string { return r.rows }

func TestPrint(t *testing.T) {
	aligned := rows{Name: "x", header: []string{"NAME", "PHASE"}, rows: [][]string{{"node-1", "Installing"}, {"n2", "Ready"}}}
	tests := []struct {
		name    string
		format  Format
		value   any
		want    string
		wantErr string
	}{
		{"table aligns columns", Table, aligned, "NAME     PHASE\nnode-1   Installing\nn2       Ready\n", ""},
		{"empty format means table", "", aligned, "NAME     PHASE\n", ""},
		{"json uses tags, not the table", JSON, aligned, "{\n  \"name\": \"x\"\n}\n", ""},
		{"yaml uses tags", YAML, aligned, "name: x\n", ""},
		{"table needs Tabular", Table, struct{ A int }{1}, "", "cannot be shown as a table: use -o json or -o yaml"},
		{"ragged row", Table, rows{header: []string{"A", "B"}, rows: [][]string{{"1"}}}, "", "table row 0 has 1 cells, header has 2"},
		{"unknown format", Format("xml"), aligned, "", `unknown output format "xml"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			err := Print(&b, tc.format, tc.value)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(b.String(), tc.want) {
				t.Errorf("got:\n%s\nwant prefix:\n%s", b.String(), tc.want)
			}
		})
	}
}

func TestFormatSet(t *testing.T) {
	for _, s := range []string{"table", "json", "yaml"} {
		var f Format
		if err := f.Set(s); err != nil || f.String() != s {
			t.Errorf("Set(%q) = %v, format %q", s, err, f)
		}
	}
	var f Format = Table
	if err := f.Set("JSON"); err == nil {
		t.Error("Set(JSON) accepted; formats are lower case like kubectl's")
	}
	if f != Table {
		t.Errorf("a rejected Set changed the format to %q", f)
	}
}
