package redfishbmc

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"cozy.dev/cozy/lab/redfishbmc/bmctest"
)

// TestRequests covers what a client can get wrong: credentials, paths,
// bodies. Each gets Redfish's error format and a status that says why.
func TestRequests(t *testing.T) {
	srv := httptest.NewServer(New(Credentials{"admin", "pw"}, slog.New(slog.DiscardHandler), System{ID: "n1", Machine: bmctest.NewMachine(false)}))
	defer srv.Close()
	for _, tc := range []struct {
		name, method, path, body string
		auth                     bool
		code                     int
		has                      string
	}{
		{"root without credentials", "GET", "/redfish/v1/", "", false, 200, `"Systems"`},
		{"root without slash", "GET", "/redfish/v1", "", false, 200, `"Systems"`},
		{"versions", "GET", "/redfish", "", false, 200, `"v1"`},
		{"systems without credentials", "GET", "/redfish/v1/Systems", "", false, 401, "NoValidSession"},
		{"systems", "GET", "/redfish/v1/Systems", "", true, 200, `"/redfish/v1/Systems/n1"`},
		{"system", "GET", "/redfish/v1/Systems/n1", "", true, 200, `"PowerState":"Off"`},
		{"unknown system", "GET", "/redfish/v1/Systems/n2", "", true, 404, "no system n2"},
		{"unknown resource", "GET", "/redfish/v1/Managers", "", false, 404, "ResourceMissingAtURI"},
		{"patch boot", "PATCH", "/redfish/v1/Systems/n1", `{"Boot":{"BootSourceOverrideTarget":"Pxe","BootSourceOverrideEnabled":"Once"}}`, true, 204, ""},
		{"patch unknown target", "PATCH", "/redfish/v1/Systems/n1", `{"Boot":{"BootSourceOverrideTarget":"Floppy"}}`, true, 400, "not one of None, Pxe"},
		{"patch read-only property", "PATCH", "/redfish/v1/Systems/n1", `{"PowerState":"On"}`, true, 400, "unknown field"},
		{"patch malformed", "PATCH", "/redfish/v1/Systems/n1", `{"Boot":`, true, 400, "not a valid request body"},
		{"reset", "POST", "/redfish/v1/Systems/n1/Actions/ComputerSystem.Reset", `{"ResetType":"On"}`, true, 204, ""},
		{"reset unknown type", "POST", "/redfish/v1/Systems/n1/Actions/ComputerSystem.Reset", `{"ResetType":"Nmi"}`, true, 400, "not one of On"},
		{"reset with two bodies", "POST", "/redfish/v1/Systems/n1/Actions/ComputerSystem.Reset", `{"ResetType":"On"}{}`, true, 400, "data after"},
		{"reset too large", "POST", "/redfish/v1/Systems/n1/Actions/ComputerSystem.Reset", `{"ResetType":"` + strings.Repeat("x", maxBody) + `"}`, true, 400, "too large"},
		{"nic", "GET", "/redfish/v1/Systems/n1/EthernetInterfaces/nic0", "", true, 200, "MACAddress"},
		{"unknown nic", "GET", "/redfish/v1/Systems/n1/EthernetInterfaces/nic9", "", true, 404, "no NIC"},
		{"disk", "GET", "/redfish/v1/Systems/n1/SimpleStorage/virtio", "", true, 200, "CapacityBytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequestWithContext(t.Context(), tc.method, srv.URL+tc.path, strings.NewReader(tc.body))
			if tc.auth {
				req.SetBasicAuth("admin", "pw")
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.code || !strings.Contains(string(body), tc.has) {
				t.Errorf("%s %s = %d %s; want %d with %q", tc.method, tc.path, resp.StatusCode, body, tc.code, tc.has)
			}
		})
	}
}

func FuzzDecodePatch(f *testing.F) {
	f.Add(`{"Boot":{"BootSourceOverrideTarget":"Pxe","BootSourceOverrideEnabled":"Once","BootSourceOverrideMode":"UEFI"}}`)
	f.Add(`{"Boot":null}`)
	f.Fuzz(func(t *testing.T, s string) {
		b, err := DecodePatch(strings.NewReader(s))
		if err != nil {
			return
		}
		if b.Target != "" && !slices.Contains(bootTargets, b.Target) || b.Enabled != "" && !slices.Contains(bootEnabled, b.Enabled) {
			t.Fatalf("accepted %+v from %q", b, s)
		}
	})
}

func FuzzDecodeReset(f *testing.F) {
	f.Add(`{"ResetType":"ForceRestart"}`)
	f.Fuzz(func(t *testing.T, s string) {
		r, err := DecodeReset(strings.NewReader(s))
		if err == nil && !slices.Contains(resetTypes, r) {
			t.Fatalf("accepted %q from %q", r, s)
		}
	})
}
