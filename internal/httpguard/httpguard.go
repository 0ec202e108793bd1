// Package httpguard keeps registry clients on HTTPS unless plain HTTP was
// asked for: go-containerregistry falls back to HTTP by itself for
// loopback and private addresses, which would send pulls and pushes meant
// for a TLS registry in the clear.
package httpguard

import (
	"cmp"
	"fmt"
	"net/http"
)

// Transport refuses plain HTTP unless AllowHTTP is set.
type Transport struct {
	// Base carries the requests (nil: http.DefaultTransport).
	Base      http.RoundTripper
	AllowHTTP bool
}

// RoundTrip sends req through Base, or refuses it.
func (g Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme == "http" && !g.AllowHTTP {
		return nil, fmt.Errorf("plain HTTP to %s refused: HTTPS only unless insecure (--insecure)", req.URL.Host)
	}
	return cmp.Or[http.RoundTripper](g.Base, http.DefaultTransport).RoundTrip(req)
}
