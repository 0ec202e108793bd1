package rack

import (
	"fmt"
	"net/url"
	"strings"
)

// ChartMirror is where a rack's platform.mirror says the upstream charts
// are: an OCI registry and a repository path in it.
type ChartMirror struct {
	// Host is HOST[:PORT].
	Host string
	// Path is the repository path the charts are under, without slashes
	// at either end: charts/cilium:1.20.2 is under "charts".
	Path string
	// Insecure is plain HTTP (the URL was http://).
	Insecure bool
}

// URL is the mirror as Flux's HelmRepository type oci takes it.
func (m ChartMirror) URL() string { return "oci://" + m.Host + "/" + m.Path }

// ParseChartMirror reads platform.mirror: http://, https:// or oci://
// (HTTPS), a host and a path, nothing else.
func ParseChartMirror(s string) (ChartMirror, error) {
	const want = "a registry path such as http://10.0.0.1:5000/charts (http for plain HTTP, https or oci for TLS; a host and a path)"
	u, err := url.Parse(s)
	if err != nil || u.Host == "" || u.Hostname() == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return ChartMirror{}, fmt.Errorf("%q is not %s", s, want)
	}
	m := ChartMirror{Host: u.Host, Path: strings.Trim(u.Path, "/")}
	switch u.Scheme {
	case "http":
		m.Insecure = true
	case "https", "oci":
	default:
		return ChartMirror{}, fmt.Errorf("%q is not %s", s, want)
	}
	if m.Path == "" {
		return ChartMirror{}, fmt.Errorf("%q has no path: give the repository path the charts are under, such as %s://%s/charts", s, u.Scheme, u.Host)
	}
	if strings.ToLower(m.Host) != m.Host || strings.Contains(m.Path, "//") || strings.ToLower(m.Path) != m.Path {
		return ChartMirror{}, fmt.Errorf("%q: write the host and path in lower case, without empty elements (OCI repository names)", s)
	}
	return m, nil
}
