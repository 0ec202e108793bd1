//go:build integration

package render_test

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"testing"

	kubevirtv1 "kubevirt.io/api/core/v1"

	"cozy.dev/cozy/internal/testing/testenv"
)

// TestKubeVirtFeatureGatesCurrent: every feature gate the platform's
// KubeVirt resource enables is one the pinned KubeVirt registers as Alpha
// or Beta. A GA gate is a no-op, a Deprecated one is about to go (v1.9.0
// deprecates HotplugVolumes for DeclarativeHotplugVolumes). The states are
// read from the module's pkg/virt-config/featuregate, without compiling
// it (kubevirt.io/kubevirt is not a dependency of Cozy).
func TestKubeVirtFeatureGatesCurrent(t *testing.T) {
	var version string
	for _, src := range testenv.PlatformCRDs() {
		if src.Module == "kubevirt.io/kubevirt" {
			version = src.Version
		}
	}
	dir, err := testenv.ModuleDir(context.Background(), "kubevirt.io/kubevirt", version)
	if err != nil {
		t.Fatal(err)
	}
	states := featureGateStates(t, filepath.Join(dir, "pkg", "virt-config", "featuregate"))
	if len(states) < 10 {
		t.Fatalf("read only %d feature gates from kubevirt %s: %v", len(states), version, states)
	}
	// With host devices permitted, so the HostDevices gate they turn on
	// is checked too, and their shape decodes strictly as KubeVirt's.
	objs, err := mustRender(t, exampleRack(t, "prod", platformLine, platformLine+gpuValues)).Objects()
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, o := range objs {
		if o.GetKind() != "KubeVirt" {
			continue
		}
		kv := &kubevirtv1.KubeVirt{}
		strict(t, o, kv)
		if d := kv.Spec.Configuration.CommonInstancetypesDeployment; d == nil || d.Enabled == nil || !*d.Enabled {
			t.Error("the platform's KubeVirt does not deploy the common instance types node groups name")
		}
		if p := kv.Spec.Configuration.PermittedHostDevices; p == nil || len(p.PciHostDevices) != 1 || len(p.MediatedDevices) != 1 {
			t.Errorf("permittedHostDevices %+v, want the values' PCI and mediated device", p)
		}
		for _, g := range kv.Spec.Configuration.DeveloperConfiguration.FeatureGates {
			checked++
			switch s, ok := states[g]; {
			case !ok:
				t.Errorf("KubeVirt %s registers no feature gate %s", version, g)
			case s != "Alpha" && s != "Beta":
				t.Errorf("feature gate %s is %s in KubeVirt %s: drop it or take its successor", g, s, version)
			}
		}
	}
	if checked == 0 {
		t.Fatal("the platform's KubeVirt enables no feature gate")
	}
	// GPUs need no gate: GPU is GA in this KubeVirt, and only
	// permittedHostDevices decides.
	if s := states["GPU"]; s != "GA" {
		t.Errorf("feature gate GPU is %q in KubeVirt %s: the platform must turn it on for GPU node groups", s, version)
	}
}

// featureGateStates reads RegisterFeatureGate(FeatureGate{Name: X, State:
// Y}) calls and the string constants they name: gate name -> state
// constant ("Alpha", "Beta", "GA", "Deprecated", "Discontinued").
func featureGateStates(t *testing.T, dir string) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	consts := map[string]string{}
	var calls []*ast.CompositeLit
	for _, name := range []string{"active.go", "inactive.go"} {
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.ValueSpec:
				for i, id := range n.Names {
					if i < len(n.Values) {
						if lit, ok := n.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
							consts[id.Name], _ = strconv.Unquote(lit.Value)
						}
					}
				}
			case *ast.CallExpr:
				if id, ok := n.Fun.(*ast.Ident); ok && id.Name == "RegisterFeatureGate" && len(n.Args) == 1 {
					if cl, ok := n.Args[0].(*ast.CompositeLit); ok {
						calls = append(calls, cl)
					}
				}
			}
			return true
		})
	}
	states := map[string]string{}
	for _, cl := range calls {
		var name, state string
		for _, e := range cl.Elts {
			kv, ok := e.(*ast.KeyValueExpr)
			if !ok {
				continue
			}
			key, _ := kv.Key.(*ast.Ident)
			val, _ := kv.Value.(*ast.Ident)
			if key == nil || val == nil {
				continue
			}
			switch key.Name {
			case "Name":
				name = consts[val.Name]
			case "State":
				state = val.Name
			}
		}
		if name != "" {
			states[name] = state
		}
	}
	return states
}
