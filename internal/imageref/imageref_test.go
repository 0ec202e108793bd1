package imageref

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	tests := []struct {
		in, want string
		err      string
	}{
		{in: "registry.k8s.io/pause:3.10.1", want: "registry.k8s.io/pause:3.10.1"},
		{in: "alpine", want: "docker.io/library/alpine:latest"},
		{in: "docker.io/alpine:3.22", want: "docker.io/library/alpine:3.22"},
		{in: "index.docker.io/library/alpine:3.22", want: "docker.io/library/alpine:3.22"},
		{in: "flannelcni/flannel:v0.1", want: "docker.io/flannelcni/flannel:v0.1"},
		{in: "ghcr.io/siderolabs/flannel:v0.28.4", want: "ghcr.io/siderolabs/flannel:v0.28.4"},
		{in: "localhost:5000/a/b:c", want: "localhost:5000/a/b:c"},
		{in: "quay.io/a/b@sha256:" + strings.Repeat("ab", 32), want: "quay.io/a/b@sha256:" + strings.Repeat("ab", 32)},
		{in: "quay.io/a/b:v1@sha256:" + strings.Repeat("ab", 32), want: "quay.io/a/b:v1@sha256:" + strings.Repeat("ab", 32)},
		{in: "", err: "empty"},
		{in: " alpine", err: "spaces"},
		{in: "Registry.k8s.io/pause:1", err: "lower case"},
		{in: "registry.k8s.io/Pause:1", err: "not an image reference"},
		{in: "quay.io/a/b@sha256:12", err: "not an image reference"},
		{in: "quay.io/a/b:", err: "not an image reference"},
	}
	for _, tt := range tests {
		got, err := Parse(tt.in)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("Parse(%q) = %v, %v; want an error with %q", tt.in, got, err, tt.err)
			}
			continue
		}
		if err != nil || got.String() != tt.want {
			t.Errorf("Parse(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

func TestIn(t *testing.T) {
	tests := []struct {
		in, mirror, want, err string
	}{
		{in: "registry.k8s.io/pause:3.10.1", mirror: "10.0.0.1:5000", want: "10.0.0.1:5000/registry.k8s.io/pause:3.10.1"},
		{in: "alpine:3", mirror: "10.0.0.1:5000", want: "10.0.0.1:5000/docker.io/library/alpine:3"},
		{in: "factory.talos.dev/metal-installer/abc:v1.13.0", mirror: "mirror.example", want: "mirror.example/factory.talos.dev/metal-installer/abc:v1.13.0"},
		{in: "quay.io/a/b@sha256:" + strings.Repeat("cd", 32), mirror: "127.0.0.1:1", want: "127.0.0.1:1/quay.io/a/b@sha256:" + strings.Repeat("cd", 32)},
		{in: "localhost:5000/a:b", mirror: "10.0.0.1:5000", err: "cannot be named in the mirror"},
	}
	for _, tt := range tests {
		r, err := Parse(tt.in)
		if err != nil {
			t.Fatal(err)
		}
		got, err := r.In(tt.mirror)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%s.In(%s) = %v, %v; want an error with %q", tt.in, tt.mirror, got, err, tt.err)
			}
			continue
		}
		if err != nil || got.String() != tt.want {
			t.Errorf("%s.In(%s) = %q, %v; want %q", tt.in, tt.mirror, got, err, tt.want)
		}
	}
	if got := MirrorEndpoint("http://10.0.0.1:5000/", "registry.k8s.io"); got != "http://10.0.0.1:5000/v2/registry.k8s.io" {
		t.Errorf("MirrorEndpoint = %q", got)
	}
}

// Whatever Parse accepts prints in a form it reads back unchanged, and
// that form names the image in a mirror, unless its host has a port.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"alpine", "registry.k8s.io/pause:3.10.1", "localhost:5000/a:b", "quay.io/a/b:v1@sha256:" + strings.Repeat("ab", 32)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := Parse(s)
		if err != nil {
			return
		}
		back, err := Parse(r.String())
		if err != nil || back != r {
			t.Fatalf("Parse(%q) = %q, which reads back as %q, %v", s, r, back, err)
		}
		m, err := r.In("10.0.0.1:5000")
		if strings.Contains(r.Host, ":") {
			return
		}
		if err != nil || m.Tag != r.Tag || m.Digest != r.Digest || m.Repository != r.Host+"/"+r.Repository {
			t.Fatalf("%q in the mirror: %q, %v", r, m, err)
		}
	})
}

func TestIsMirrorURL(t *testing.T) {
	for s, want := range map[string]bool{
		"http://10.0.0.1:5000":              true,
		"https://registry.example.com/":     true,
		"10.0.0.1:5000":                     false,
		"ftp://10.0.0.1":                    false,
		"http://10.0.0.1:5000/v2/docker.io": false,
		"http://10.0.0.1:5000//":            false,
		"http://10.0.0.1:5000?x=1":          false,
		"http://10.0.0.1:5000#x":            false,
		"http://user@10.0.0.1:5000":         false,
		"http://:5000":                      false,
		"":                                  false,
	} {
		if got := IsMirrorURL(s); got != want {
			t.Errorf("IsMirrorURL(%q) = %v, want %v", s, got, want)
		}
	}
}
