// Package output prints command results in the formats every cozyctl
// command accepts with -o: a human table, JSON or YAML.
//
// Data goes to the writer it is given (stdout in the CLI); progress and logs
// never pass through here.
package output

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"sigs.k8s.io/yaml"
)

// Format is an output format; it implements pflag.Value so it can be a flag.
type Format string

// The formats accepted by -o.
const (
	Table Format = "table"
	JSON  Format = "json"
	YAML  Format = "yaml"
)

// Formats lists the accepted formats, for help texts and completion.
var Formats = []Format{Table, JSON, YAML}

func (f *Format) String() string { return string(*f) }

// Type is the name pflag shows in help.
func (f *Format) Type() string { return "format" }

// Set parses a flag value.
func (f *Format) Set(s string) error {
	for _, ok := range Formats {
		if Format(s) == ok {
			*f = ok
			return nil
		}
	}
	return fmt.Errorf("unknown output format %q: use one of %s", s, joinFormats())
}

func joinFormats() string {
	names := make([]string, len(Formats))
	for i, f := range Formats {
		names[i] = string(f)
	}
	return strings.Join(names, ", ")
}

// Tabular is data that knows how to lay itself out as a table.
type Tabular interface {
	// Header returns the column names, conventionally upper case.
	Header() []string
	// Rows returns one slice of cells per row, as many as Header has.
	Rows() [][]string
}

// Print writes v to w in format f. JSON and YAML marshal v itself (use json
// tags); Table needs v to implement Tabular.
func Print(w io.Writer, f Format, v any) error {
	switch f {
	case JSON:
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case YAML:
		b, err := yaml.Marshal(v)
		if err != nil {
			return fmt.Errorf("encode yaml: %w", err)
		}
		_, err = w.Write(b)
		return err
	case Table, "":
		t, ok := v.(Tabular)
		if !ok {
			return fmt.Errorf("%T cannot be shown as a table: use -o json or -o yaml", v)
		}
		return printTable(w, t)
	default:
		return fmt.Errorf("unknown output format %q: use one of %s", f, joinFormats())
	}
}

func printTable(w io.Writer, t Tabular) error {
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	header := t.Header()
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for i, row := range t.Rows() {
		if len(row) != len(header) {
			return fmt.Errorf("table row %d has %d cells, header has %d", i, len(row), len(header))
		}
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	return tw.Flush()
}
