package main

import (
	"strings"
	"testing"
)

func TestParseTags(t *testing.T) {
	for _, tt := range []struct{ in, err string }{
		{"source-controller=v1.9.6,kustomize-controller=v1.9.6,helm-controller=v1.6.4", ""},
		{"source-controller=v1.9.6,kustomize-controller=v1.9.6", "no tag for helm-controller"},
		{"source-controller=v1.9.6,kustomize-controller=v1.9.6,helm-controller=", `"helm-controller=" is not CONTROLLER=TAG`},
		{"source-controller=v1.9.6,kustomize-controller=v1.9.6,helm-controller=v1.6.4,notification-controller=v1.6.0", `"notification-controller=v1.6.0" is not`},
	} {
		tags, err := parseTags(tt.in)
		if tt.err == "" {
			if err != nil || tags["helm-controller"] != "v1.6.4" || len(tags) != 3 {
				t.Errorf("%q: %v, %v", tt.in, tags, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tt.err) {
			t.Errorf("%q: %v, want an error with %q", tt.in, err, tt.err)
		}
	}
}
