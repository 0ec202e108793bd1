package render

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"cozy.dev/cozy/charts"
	"cozy.dev/cozy/platform/status"
)

// ComponentsConfigMap is the ConfigMap, in Flux's namespace beside the
// component Kustomizations, that says which components are on and off
// ("on"/"off" by name): `platform status` reads it to show an off
// component as off, since it has no Kustomization.
const ComponentsConfigMap = status.ComponentsConfigMap

// switchOff drops the folders of the components the chart's values
// (comps, its components section with defaults) switch off
// (components.<name>.enabled: false; the chart already left out their
// Kustomizations) and refuses a component left on that depends on one
// switched off.
func switchOff(comps map[string]any, files map[string]string) error {
	var off []string
	for name, v := range comps {
		if m, _ := v.(map[string]any); m["enabled"] == false {
			off = append(off, name)
		}
	}
	for f := range files {
		for _, name := range off {
			if strings.HasPrefix(f, "components/"+name+"/") {
				delete(files, f)
			}
		}
	}
	objs, err := Decode([]byte(files["platform.yaml"]))
	if err != nil {
		return fmt.Errorf("platform.yaml: %w", err)
	}
	needs := map[string][]string{} // switched off -> those on that depend on it
	for _, o := range objs {
		deps, _, _ := unstructured.NestedSlice(o.Object, "spec", "dependsOn")
		for _, d := range deps {
			name, _ := d.(map[string]any)["name"].(string)
			if slices.Contains(off, name) {
				needs[name] = append(needs[name], o.GetName())
			}
		}
	}
	var problems []string
	for _, name := range sortedKeys(needs) {
		on := needs[name]
		slices.Sort(on)
		p := fmt.Sprintf("components.%s is switched off, but %s depend%s on it: switch %s off too, or keep %s",
			name, strings.Join(on, ", "), map[bool]string{true: "s", false: ""}[len(on) == 1], strings.Join(on, ", "), name)
		if name == "networking" {
			// The platform's chart drops these dependencies on a flannel cluster.
			p += ", or bootstrap with cluster.cni: flannel (Talos's flannel then stays the cluster's network)"
		}
		problems = append(problems, p)
	}
	if len(problems) > 0 {
		return fmt.Errorf("platform components:\n- %s", strings.Join(problems, "\n- "))
	}
	return nil
}

// Components are the platform's components by name, sorted: the
// components section of the platform chart's values.
func Components() ([]string, error) {
	c, err := LoadChart(charts.Platform)
	if err != nil {
		return nil, err
	}
	comps, _ := c.Values["components"].(map[string]any)
	if len(comps) == 0 {
		return nil, errors.New("the platform chart's values have no components")
	}
	return sortedKeys(comps), nil
}
