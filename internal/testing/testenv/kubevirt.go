package testenv

import (
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// KubeVirtModule is the module of KubeVirt's operator, at the platform's
// pin (PlatformCRDs, TestPlatformCRDsMatchThePins).
const (
	KubeVirtModule  = "kubevirt.io/kubevirt"
	KubeVirtVersion = "v1.9.0"
)

// kubeVirtValidations is the Go file where virt-operator keeps the schema
// of each of its CRDs, as YAML string literals keyed by the CRD's
// singular name.
const kubeVirtValidations = "pkg/virt-operator/resource/generate/components/validations_generated.go"

// KubeVirtVMCRDs returns the CRDs of VirtualMachine and
// VirtualMachineInstance as virt-operator installs them: KubeVirt ships
// no YAML for them, its operator builds them at run time. Here they are
// built the same way from the same data: the versions of kubevirt.io/api
// (ApiSupportedVersions), each with the schema of the module's
// validations_generated.go; VirtualMachine with a status subresource,
// VirtualMachineInstance without (virt-handler writes it whole). The
// printer columns are left out.
func KubeVirtVMCRDs(ctx context.Context) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	dir, err := ModuleDir(ctx, KubeVirtModule, KubeVirtVersion)
	if err != nil {
		return nil, err
	}
	schemas, err := readKubeVirtSchemas(filepath.Join(dir, kubeVirtValidations))
	if err != nil {
		return nil, err
	}
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, k := range []struct {
		kind, singular, plural string
		short                  []string
		status                 bool
	}{
		{"VirtualMachine", "virtualmachine", "virtualmachines", []string{"vm", "vms"}, true},
		{"VirtualMachineInstance", "virtualmachineinstance", "virtualmachineinstances", []string{"vmi", "vmis"}, false},
	} {
		schema, ok := schemas[k.singular]
		if !ok {
			return nil, fmt.Errorf("%s@%s %s: no schema for %s", KubeVirtModule, KubeVirtVersion, kubeVirtValidations, k.singular)
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		crd.APIVersion, crd.Kind = "apiextensions.k8s.io/v1", "CustomResourceDefinition"
		crd.Name = k.plural + "." + kubevirtv1.SchemeGroupVersion.Group
		crd.Labels = map[string]string{kubevirtv1.AppLabel: ""}
		crd.Spec = apiextensionsv1.CustomResourceDefinitionSpec{
			Group: kubevirtv1.SchemeGroupVersion.Group,
			Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{
				Kind: k.kind, ListKind: k.kind + "List", Singular: k.singular, Plural: k.plural,
				ShortNames: k.short, Categories: []string{"all"},
			},
		}
		for _, v := range kubevirtv1.ApiSupportedVersions {
			v := *v.DeepCopy()
			v.Schema = schema.DeepCopy()
			if k.status {
				v.Subresources = &apiextensionsv1.CustomResourceSubresources{Status: &apiextensionsv1.CustomResourceSubresourceStatus{}}
			}
			crd.Spec.Versions = append(crd.Spec.Versions, v)
		}
		crds = append(crds, crd)
	}
	return crds, nil
}

// readKubeVirtSchemas reads the map literal of validations_generated.go:
// each key a CRD's singular name, each value its validation as YAML.
func readKubeVirtSchemas(path string) (map[string]*apiextensionsv1.CustomResourceValidation, error) {
	file, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	schemas := map[string]*apiextensionsv1.CustomResourceValidation{}
	var derr error
	ast.Inspect(file, func(n ast.Node) bool {
		kv, ok := n.(*ast.KeyValueExpr)
		if !ok || derr != nil {
			return derr == nil
		}
		lit, ok := kv.Key.(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			return true
		}
		name, err := strconv.Unquote(lit.Value)
		if err != nil {
			return true
		}
		text, ok := stringConstant(kv.Value)
		if !ok {
			return true
		}
		var v apiextensionsv1.CustomResourceValidation
		if err := yaml.UnmarshalStrict([]byte(text), &v); err != nil {
			derr = fmt.Errorf("%s: the schema of %s: %w", filepath.Base(path), name, err)
			return false
		}
		schemas[name] = &v
		return false
	})
	if derr == nil && len(schemas) == 0 {
		derr = fmt.Errorf("%s holds no schema", filepath.Base(path))
	}
	return schemas, derr
}
