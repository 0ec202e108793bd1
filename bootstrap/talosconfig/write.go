package talosconfig

import (
	"fmt"
	"os"
	"path/filepath"

	"cozy.dev/cozy/bootstrap/rack"
)

// File names in an output dir besides SecretsFile and <hostname>.yaml.
const (
	TalosconfigFile = "talosconfig"
	SchematicFile   = "schematic.yaml"
)

// Written describes what Write produced.
type Written struct {
	Dir string `json:"dir"`
	// SecretsCreated is false when an existing bundle was reused.
	SecretsCreated bool `json:"secretsCreated"`
	// Configs maps hostname to its machine config file.
	Configs     map[string]string `json:"configs"`
	Talosconfig string            `json:"talosconfig"`
	Schematic   string            `json:"schematic"`
	// SchematicID and InstallImage are what the nodes install.
	SchematicID  string `json:"schematicID"`
	InstallImage string `json:"installImage"`
}

// Write generates everything for rack r into dir: the secrets bundle (kept
// if it exists), one machine config per machine named by hostname, the
// talosconfig, and the Image Factory schematic. Every file is 0600.
func Write(r *rack.Rack, dir string) (*Written, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	contract, err := Contract(r)
	if err != nil {
		return nil, err
	}
	w := &Written{Dir: dir, Configs: map[string]string{}}
	b, created, err := LoadOrCreateSecrets(filepath.Join(dir, SecretsFile), contract)
	if err != nil {
		return nil, err
	}
	w.SecretsCreated = created
	g := &Generator{Rack: r, Secrets: b}

	// Generate all before writing any, so a bad patch leaves no half set.
	configs := map[string][]byte{}
	for i := range r.Machines {
		m := &r.Machines[i]
		data, err := g.MachineConfig(m)
		if err != nil {
			return nil, err
		}
		configs[m.Hostname] = data
	}
	tc, err := g.Talosconfig()
	if err != nil {
		return nil, fmt.Errorf("talosconfig: %w", err)
	}
	tcData, err := tc.Bytes()
	if err != nil {
		return nil, fmt.Errorf("talosconfig: %w", err)
	}
	schematic, err := r.Talos.Schematic.SchematicDocument()
	if err != nil {
		return nil, err
	}
	if w.SchematicID, err = r.Talos.Schematic.SchematicID(); err != nil {
		return nil, err
	}
	if w.InstallImage, err = r.InstallImage(); err != nil {
		return nil, err
	}

	for host, data := range configs {
		path := filepath.Join(dir, host+".yaml")
		if err := WriteFile(path, data); err != nil {
			return nil, err
		}
		w.Configs[host] = path
	}
	w.Talosconfig = filepath.Join(dir, TalosconfigFile)
	if err := WriteFile(w.Talosconfig, tcData); err != nil {
		return nil, err
	}
	w.Schematic = filepath.Join(dir, SchematicFile)
	if r.Talos.Schematic.ID == "" {
		if err := WriteFile(w.Schematic, schematic); err != nil {
			return nil, err
		}
	} else {
		w.Schematic = "" // the rack names a schematic by ID only
	}
	return w, nil
}
