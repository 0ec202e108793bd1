// Package bmctest helps test BMC clients and servers: a machine that
// records what its BMC tells it, and a BMC quirk to put in front of a
// server.
package bmctest

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
)

// Machine is a machine's power as a BMC sees it (a redfishbmc.Machine),
// recording each call: "start net", "start disk", "off", "shutdown",
// "restart net", "restart disk".
type Machine struct {
	mu    sync.Mutex
	on    bool
	calls []string
}

// NewMachine is a machine that is on or off.
func NewMachine(on bool) *Machine { return &Machine{on: on} }

func (m *Machine) record(call string, on bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls = append(m.calls, call)
	m.on = on
	return nil
}

func boots(netboot bool) string {
	if netboot {
		return "net"
	}
	return "disk"
}

// Running says whether the machine is on.
func (m *Machine) Running(context.Context) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.on, nil
}

// Start powers it on.
func (m *Machine) Start(_ context.Context, netboot bool) error {
	return m.record("start "+boots(netboot), true)
}

// Stop powers it off.
func (m *Machine) Stop(_ context.Context, graceful bool) error {
	if graceful {
		return m.record("shutdown", false)
	}
	return m.record("off", false)
}

// Restart resets it.
func (m *Machine) Restart(_ context.Context, netboot bool) error {
	return m.record("restart "+boots(netboot), true)
}

// Calls lists what the machine was told, in order.
func (m *Machine) Calls() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.calls)
}

// RefuseOnce answers, for the systems whose path match accepts, a PATCH
// that sets a one-time boot override as some BMC firmware does: 400,
// with Redfish's error body.
func RefuseOnce(match func(path string) bool) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPatch && match(r.URL.Path) {
				body, _ := io.ReadAll(r.Body)
				if strings.Contains(string(body), `"Once"`) {
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(http.StatusBadRequest)
					_, _ = io.WriteString(w, `{"error":{"code":"Base.1.8.PropertyValueNotInList","message":"The value Once for BootSourceOverrideEnabled is not in the list of acceptable values."}}`)
					return
				}
				r.Body = io.NopCloser(strings.NewReader(string(body)))
			}
			next.ServeHTTP(w, r)
		})
	}
}
