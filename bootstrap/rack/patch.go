package rack

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/siderolabs/talos/pkg/machinery/config/configpatcher"
	"go.yaml.in/yaml/v3"
)

// loadPatchFiles fills each patch's content from its file or inline YAML
// and checks that Talos can read it as a patch.
func (r *Rack) loadPatchFiles(dir string) []Problem {
	var ps []Problem
	load := func(p *Patch, path string) {
		switch {
		case p.File != "" && p.Patch.Kind != 0:
			ps = append(ps, Problem{Path: path, Message: "set either file or patch, not both"})
			return
		case p.File != "":
			f := p.File
			if !filepath.IsAbs(f) {
				f = filepath.Join(dir, f)
			}
			data, err := os.ReadFile(f)
			if err != nil {
				ps = append(ps, Problem{Path: path + ".file", Message: fmt.Sprintf("cannot read patch file: %v", err)})
				return
			}
			p.content = data
		case p.Patch.Kind != 0:
			data, err := yaml.Marshal(&p.Patch)
			if err != nil {
				ps = append(ps, Problem{Path: path + ".patch", Message: err.Error()})
				return
			}
			p.content = data
		default:
			ps = append(ps, Problem{Path: path, Message: "empty: set file (a patch file next to the rack) or patch (inline)"})
			return
		}
		if _, err := configpatcher.LoadPatch(p.content); err != nil {
			field := ".patch"
			if p.File != "" {
				field = ".file"
			}
			ps = append(ps, Problem{Path: path + field, Message: fmt.Sprintf("not a Talos config patch (strategic merge or JSON 6902): %v", err)})
		}
	}
	for i := range r.Patches {
		load(&r.Patches[i], fmt.Sprintf("patches[%d]", i))
	}
	for i := range r.Machines {
		for j := range r.Machines[i].Patches {
			load(&r.Machines[i].Patches[j], fmt.Sprintf("machines[%d].patches[%d]", i, j))
		}
	}
	return ps
}
