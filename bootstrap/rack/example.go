package rack

import (
	"bytes"
	_ "embed"
	"fmt"
	"strings"
	"text/template"
)

//go:embed example.yaml.tmpl
var exampleTemplate string

// Example returns a complete, commented rack file for a cluster called
// name that passes validation.
func Example(name string) ([]byte, error) { return ExampleWith(name, nil) }

// FoundMachine is a machine `cozyctl rack init --from-bmc` found through
// its BMC, to write in place of the example's machines.
type FoundMachine struct {
	Hostname, Role, MAC, UUID string
	BMC                       BMC
	// NICs and Disks describe what the BMC reported, as comments for the
	// person who finishes the rack (which NIC netboots, which disk Talos
	// installs to: a BMC cannot say).
	NICs, Disks string
}

// ExampleWith is Example with the given machines instead of the
// example's; none means the example's.
func ExampleWith(name string, machines []FoundMachine) ([]byte, error) {
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
		"Machines":          foundMachines(machines),
	})
	return b.Bytes(), err
}

// foundMachines writes machines found through BMCs as the rack's
// machines section.
func foundMachines(ms []FoundMachine) string {
	if len(ms) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("machines:                       # found through their BMCs (cozyctl rack init --from-bmc): check each mac and install disk\n")
	for _, m := range ms {
		fmt.Fprintf(&b, "  - hostname: %s\n    role: %s\n", m.Hostname, m.Role)
		if m.MAC != "" {
			fmt.Fprintf(&b, "    mac: %q            # the NIC it netboots from; the BMC lists: %s\n", m.MAC, m.NICs)
		}
		fmt.Fprintf(&b, "    uuid: %s\n", m.UUID)
		fmt.Fprintf(&b, "    install:\n      disk: /dev/sda            # the BMC lists: %s\n", m.Disks)
		fmt.Fprintf(&b, "    bmc:\n      address: %s\n      credentialsFile: %s\n", m.BMC.Address, m.BMC.CredentialsFile)
		if m.BMC.InsecureSkipVerify {
			b.WriteString("      insecureSkipVerify: true\n")
		}
	}
	return strings.TrimSuffix(b.String(), "\n")
}
