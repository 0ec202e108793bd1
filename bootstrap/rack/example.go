package rack

import (
	"bytes"
	_ "embed"
	"fmt"
	"text/template"
)

//go:embed example.yaml.tmpl
var exampleTemplate string

// Example returns a complete, commented rack file for a cluster called
// name that passes validation.
func Example(name string) ([]byte, error) {
	if !dnsLabel.MatchString(name) {
		return nil, fmt.Errorf("rack name %q must be a DNS label: lower-case letters, digits and '-'", name)
	}
	t, err := template.New("rack").Parse(exampleTemplate)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	err = t.Execute(&b, map[string]string{
		"Name":              name,
		"TalosVersion":      DefaultTalosVersion,
		"KubernetesVersion": DefaultKubernetesVersion,
	})
	return b.Bytes(), err
}
