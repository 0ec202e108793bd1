package rack

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Problem is one thing wrong with a rack file.
type Problem struct {
	// Path is the field, as in machines[1].install.disk; empty for the file.
	Path string `json:"path,omitempty"`
	// Line is the 1-based line of Path, or of its nearest ancestor present
	// in the file; 0 when unknown.
	Line    int    `json:"line,omitempty"`
	Message string `json:"message"`
}

func (p Problem) String() string {
	var b strings.Builder
	if p.Line > 0 {
		fmt.Fprintf(&b, "line %d: ", p.Line)
	}
	if p.Path != "" {
		b.WriteString(p.Path + ": ")
	}
	b.WriteString(p.Message)
	return b.String()
}

// Problems is the error Load returns for a file that is not a valid rack.
type Problems struct {
	// File is the rack file's name, for messages.
	File string
	List []Problem
}

func (e *Problems) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d problem", e.File, len(e.List))
	if len(e.List) != 1 {
		b.WriteString("s")
	}
	for _, p := range e.List {
		b.WriteString("\n  " + p.String())
	}
	return b.String()
}

// Load reads, defaults and validates the rack file at path. Patch files
// are read relative to its directory. A rack that is not valid gives a
// *Problems listing everything wrong with it.
func Load(path string) (*Rack, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read rack file: %w", err)
	}
	return Parse(data, filepath.Base(path), filepath.Dir(path))
}

// Parse is Load for bytes already read; name labels messages and dir is
// where patch files are looked up.
func Parse(data []byte, name, dir string) (*Rack, error) {
	fail := func(ps ...Problem) error { return &Problems{File: name, List: ps} }

	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fail(Problem{Message: "the file is empty; `cozyctl rack init` prints an example"})
		}
		return nil, fail(yamlProblem(err))
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return nil, fail(Problem{Line: extra.Line, Message: "a rack file holds one YAML document; found a second one"})
	}
	if len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, fail(Problem{Line: doc.Line, Message: "the file is not a YAML mapping; `cozyctl rack init` prints an example"})
	}

	lines := map[string]int{}
	var ps []Problem
	checkShape(doc.Content[0], reflect.TypeFor[Rack](), "", lines, &ps)
	if len(ps) > 0 {
		return nil, fail(ps...)
	}
	var r Rack
	if err := doc.Content[0].Decode(&r); err != nil {
		return nil, fail(yamlProblem(err))
	}

	ps = append(ps, r.loadPatchFiles(dir)...)
	ps = append(ps, r.checkBMCs(dir)...)
	r.setDefaults()
	ps = append(ps, r.validate()...)
	if len(ps) > 0 {
		for i := range ps {
			ps[i].Line = lineOf(lines, ps[i].Path)
		}
		sort.SliceStable(ps, func(i, j int) bool { return ps[i].Line < ps[j].Line })
		return nil, fail(ps...)
	}
	r.lines = lines
	return &r, nil
}

var yamlLine = regexp.MustCompile(`line (\d+): `)

// yamlProblem turns a yaml.v3 error into a Problem with its line.
func yamlProblem(err error) Problem {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	var te *yaml.TypeError
	if errors.As(err, &te) && len(te.Errors) > 0 {
		msg = te.Errors[0]
	}
	p := Problem{Message: "not valid YAML: " + msg}
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		p.Line, _ = strconv.Atoi(m[1])
		p.Message = "not valid YAML: " + yamlLine.ReplaceAllString(msg, "")
	}
	return p
}

// ProblemAt is a problem of the field at path, with its line in the
// file: for checks made after Load (what the rack runs, say).
func (r *Rack) ProblemAt(path, message string) Problem {
	return Problem{Path: path, Line: lineOf(r.lines, path), Message: message}
}

// lineOf finds the line of path or of its nearest ancestor in the file.
func lineOf(lines map[string]int, path string) int {
	for path != "" {
		if l, ok := lines[path]; ok {
			return l
		}
		i := strings.LastIndexAny(path, ".[")
		if i < 0 {
			break
		}
		path = path[:i]
	}
	return 0
}

var nodeType = reflect.TypeFor[yaml.Node]()

// checkShape walks the YAML tree alongside the Go type it decodes into,
// recording each field's line and reporting unknown fields and values of
// the wrong kind by path, which yaml.v3's own errors do not name.
func checkShape(n *yaml.Node, t reflect.Type, path string, lines map[string]int, ps *[]Problem) {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if _, ok := lines[path]; !ok && path != "" {
		lines[path] = n.Line // a list item; fields record their key's line
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nodeType || t.Kind() == reflect.Interface {
		return // free-form: patches and platform values
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return // an empty value leaves the default
	}
	bad := func(want string) {
		*ps = append(*ps, Problem{Path: path, Line: n.Line, Message: fmt.Sprintf("must be %s, not %s", want, describe(n))})
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			bad("a mapping of fields")
			return
		}
		fields := map[string]reflect.Type{}
		var names []string
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if name == "" || name == "-" {
				continue
			}
			fields[name] = f.Type
			names = append(names, name)
		}
		first := map[string]int{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			key, val := n.Content[i], n.Content[i+1]
			p := join(path, key.Value)
			if twice(first, key, p, ps) {
				continue
			}
			ft, ok := fields[key.Value]
			if !ok {
				msg := "unknown field"
				if s := closest(key.Value, names); s != "" {
					msg += fmt.Sprintf(" (did you mean %q?)", s)
				}
				*ps = append(*ps, Problem{Path: p, Line: key.Line, Message: msg})
				continue
			}
			lines[p] = key.Line
			checkShape(val, ft, p, lines, ps)
		}
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			bad("a mapping")
			return
		}
		first := map[string]int{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			p := join(path, n.Content[i].Value)
			if twice(first, n.Content[i], p, ps) {
				continue
			}
			lines[p] = n.Content[i].Line
			checkShape(n.Content[i+1], t.Elem(), p, lines, ps)
		}
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			bad("a list")
			return
		}
		for i, c := range n.Content {
			checkShape(c, t.Elem(), fmt.Sprintf("%s[%d]", path, i), lines, ps)
		}
	case reflect.String:
		if n.Kind != yaml.ScalarNode {
			bad("a string")
		}
	case reflect.Bool:
		if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" {
			bad("true or false")
		}
	case reflect.Int:
		if n.Kind != yaml.ScalarNode || n.Tag != "!!int" {
			bad("an integer")
		}
	}
}

// twice reports a mapping key given a second time (yaml.v3 would refuse
// the file too, but without saying which field), recording first lines in
// first.
func twice(first map[string]int, key *yaml.Node, path string, ps *[]Problem) bool {
	if line, ok := first[key.Value]; ok {
		*ps = append(*ps, Problem{Path: path, Line: key.Line, Message: fmt.Sprintf("%q is given twice (first on line %d); keep one", key.Value, line)})
		return true
	}
	first[key.Value] = key.Line
	return false
}

func join(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	return strconv.Quote(n.Value)
}

// closest suggests the known field a misspelt one was meant to be.
func closest(s string, names []string) string {
	best, bestD := "", 3
	for _, n := range names {
		if d := distance(strings.ToLower(s), strings.ToLower(n)); d < bestD {
			best, bestD = n, d
		}
	}
	return best
}

// distance is the Levenshtein edit distance.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
