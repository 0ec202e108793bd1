package render

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"path"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// KustomizeAPIVersion is the apiVersion of kustomization.yaml files: they
// tell kustomize what to build and are not Kubernetes objects.
const KustomizeAPIVersion = "kustomize.config.k8s.io/v1beta1"

// Object is one Kubernetes object of a layout and the file it is in.
type Object struct {
	File string
	*unstructured.Unstructured
}

// Objects returns the Kubernetes objects in the cluster's folder, file by
// file in path order, leaving out kustomization.yaml files and values.yaml.
func (l *Layout) Objects() ([]Object, error) {
	var objs []Object
	for _, p := range l.Paths() {
		if !strings.HasPrefix(p, l.ClusterDir+"/") || path.Ext(p) != ".yaml" || p == path.Join(l.ClusterDir, ValuesFile) {
			continue
		}
		docs, err := Decode(l.Files[p])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		for _, u := range docs {
			if u.GetAPIVersion() == KustomizeAPIVersion {
				continue
			}
			objs = append(objs, Object{File: p, Unstructured: u})
		}
	}
	return objs, nil
}

// Decode reads every object of a multi-document YAML stream.
func Decode(data []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, err
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		if u.GetKind() == "" || u.GetAPIVersion() == "" {
			return nil, fmt.Errorf("a document without apiVersion and kind")
		}
		out = append(out, u)
	}
}

// DecodeChart reads the objects of a chart's rendered templates (Chart's
// or Template's result), template by template in the order of their
// paths.
func DecodeChart(files map[string]string) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	for _, f := range slices.Sorted(maps.Keys(files)) {
		objs, err := Decode([]byte(files[f]))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		out = append(out, objs...)
	}
	return out, nil
}

// Container is one container of a pod spec in a rendered object.
type Container struct{ Name, Image string }

// Containers finds the containers of every pod spec in an object (a Pod,
// a workload's template, a CronJob's job template) by their place in it:
// the lists named containers and initContainers.
func Containers(obj any) []Container {
	var out []Container
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for _, k := range slices.Sorted(maps.Keys(v)) {
				if k == "containers" || k == "initContainers" {
					if list, ok := v[k].([]any); ok {
						for _, c := range list {
							if m, ok := c.(map[string]any); ok {
								if img, ok := m["image"].(string); ok {
									name, _ := m["name"].(string)
									out = append(out, Container{name, img})
								}
							}
						}
					}
				}
				walk(v[k])
			}
		case []any:
			for _, e := range v {
				walk(e)
			}
		}
	}
	walk(obj)
	return out
}
