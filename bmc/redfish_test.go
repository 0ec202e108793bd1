package bmc_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"cozy.dev/cozy/bmc"
	"cozy.dev/cozy/internal/testing/prereq"
	"cozy.dev/cozy/lab/redfishbmc"
	"cozy.dev/cozy/lab/redfishbmc/bmctest"
)

var creds = bmc.Credentials{Username: "admin", Password: "s3cret-Pa55"}

// labBMC serves one lab BMC on loopback, through wrap if given.
func labBMC(t *testing.T, m *bmctest.Machine, wrap func(http.Handler) http.Handler) bmc.Target {
	t.Helper()
	var h http.Handler = redfishbmc.New(redfishbmc.Credentials(creds), slog.New(slog.DiscardHandler), redfishbmc.System{
		ID: "cp1", UUID: "0a0b0c0d-0000-4000-8000-000000000001", MAC: "52:54:00:aa:bb:01",
		CPUs: 2, MemoryMiB: 3072, DiskBytes: 8 << 30, Machine: m,
	})
	if wrap != nil {
		h = wrap(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	addr, err := bmc.ParseAddress("redfish+" + srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	return bmc.Target{Address: addr, Credentials: creds, Timeout: 5 * time.Second}
}

func dial(t *testing.T, target bmc.Target) bmc.Controller {
	t.Helper()
	c, err := bmc.Dial(t.Context(), target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func TestPowerActions(t *testing.T) {
	for _, tc := range []struct {
		on     bool
		action bmc.Action
		calls  []string
		after  bmc.PowerState
		err    string
	}{
		{on: false, action: bmc.On, calls: []string{"start disk"}, after: bmc.PowerOn},
		{on: true, action: bmc.On, after: bmc.PowerOn},
		{on: true, action: bmc.Off, calls: []string{"off"}, after: bmc.PowerOff},
		{on: false, action: bmc.Off, after: bmc.PowerOff},
		{on: true, action: bmc.Soft, calls: []string{"shutdown"}, after: bmc.PowerOff},
		// The lab BMC, like sushy-tools, offers no PowerCycle: off, then on.
		{on: true, action: bmc.Cycle, calls: []string{"off", "start disk"}, after: bmc.PowerOn},
		{on: false, action: bmc.Cycle, calls: []string{"start disk"}, after: bmc.PowerOn},
		{on: true, action: bmc.Reset, calls: []string{"restart disk"}, after: bmc.PowerOn},
		{on: false, action: bmc.Reset, after: bmc.PowerOff, err: "the machine is off"},
	} {
		t.Run(fmt.Sprintf("%s_when_on=%v", tc.action, tc.on), func(t *testing.T) {
			m := bmctest.NewMachine(tc.on)
			c := dial(t, labBMC(t, m, nil))
			err := c.Power(t.Context(), tc.action)
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("Power(%s) = %v, want error %q", tc.action, err, tc.err)
			}
			if got := m.Calls(); !slices.Equal(got, tc.calls) {
				t.Errorf("machine calls %q, want %q", got, tc.calls)
			}
			state, err := c.PowerState(t.Context())
			if err != nil || state != tc.after {
				t.Errorf("PowerState = %s, %v; want %s", state, err, tc.after)
			}
		})
	}
}

func TestBootPXEOnce(t *testing.T) {
	m := bmctest.NewMachine(false)
	c := dial(t, labBMC(t, m, nil))
	ch, err := c.BootPXEOnce(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	want := bmc.BootChange{Previous: bmc.Boot{Target: "None", Enabled: "Disabled"}, Now: bmc.Boot{Target: "Pxe", Enabled: "Once"}}
	if ch != want {
		t.Errorf("BootPXEOnce = %+v, want %+v", ch, want)
	}
	// Once: the next boot netboots, the one after boots the disk.
	for _, a := range []bmc.Action{bmc.On, bmc.Cycle} {
		if err := c.Power(t.Context(), a); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := m.Calls(), []string{"start net", "off", "start disk"}; !slices.Equal(got, want) {
		t.Errorf("machine calls %q, want %q", got, want)
	}
}

func TestBootOnceRefusedFallsBackToContinuous(t *testing.T) {
	m := bmctest.NewMachine(false)
	c := dial(t, labBMC(t, m, bmctest.RefuseOnce(func(string) bool { return true })))
	ch, err := c.BootPXEOnce(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !ch.Fallback || ch.Now != (bmc.Boot{Target: "Pxe", Enabled: "Continuous"}) {
		t.Fatalf("BootPXEOnce = %+v, want a fallback to Continuous", ch)
	}
	if err := c.Power(t.Context(), bmc.On); err != nil {
		t.Fatal(err)
	}
	if err := c.Power(t.Context(), bmc.Cycle); err != nil {
		t.Fatal(err)
	}
	// The caller restores the previous override once the machine netbooted.
	if err := c.SetBoot(t.Context(), ch.Previous); err != nil {
		t.Fatal(err)
	}
	if err := c.Power(t.Context(), bmc.Cycle); err != nil {
		t.Fatal(err)
	}
	if got, want := m.Calls(), []string{"start net", "off", "start net", "off", "start disk"}; !slices.Equal(got, want) {
		t.Errorf("machine calls %q, want %q", got, want)
	}
}

func TestInspect(t *testing.T) {
	c := dial(t, labBMC(t, bmctest.NewMachine(true), nil))
	inv, err := c.Inspect(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	want := bmc.Inventory{
		Manufacturer: "QEMU", Model: "Standard PC", SerialNumber: "0a0b0c0d-0000-4000-8000-000000000001",
		UUID: "0a0b0c0d-0000-4000-8000-000000000001", PowerState: bmc.PowerOn,
		CPUs: 2, CPUModel: "QEMU Virtual CPU", MemoryGiB: 3,
		NICs:  []bmc.NIC{{Name: "nic0", MAC: "52:54:00:aa:bb:01", LinkStatus: "LinkUp"}},
		Disks: []bmc.Disk{{Name: "vda", Model: "QEMU HARDDISK", CapacityBytes: 8 << 30}},
	}
	if fmt.Sprintf("%+v", inv) != fmt.Sprintf("%+v", want) {
		t.Errorf("Inspect =\n %+v\nwant\n %+v", inv, want)
	}
}

// TestErrors: every failure is a clear message naming the BMC, in
// bounded time, and never carries the password.
func TestErrors(t *testing.T) {
	closed := func(t *testing.T) bmc.Target {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		a, _ := bmc.ParseAddress("redfish+http://" + addr)
		return bmc.Target{Address: a, Credentials: creds, Timeout: 5 * time.Second}
	}
	serve := func(h http.HandlerFunc) func(t *testing.T) bmc.Target {
		return func(t *testing.T) bmc.Target {
			srv := httptest.NewServer(h)
			t.Cleanup(srv.Close)
			a, _ := bmc.ParseAddress("redfish+" + srv.URL)
			return bmc.Target{Address: a, Credentials: creds, Timeout: 500 * time.Millisecond}
		}
	}
	withTarget := func(f func(*bmc.Target)) func(t *testing.T) bmc.Target {
		return func(t *testing.T) bmc.Target {
			target := labBMC(t, bmctest.NewMachine(false), nil)
			f(&target)
			return target
		}
	}
	tlsBMC := func(insecure bool) func(t *testing.T) bmc.Target {
		return func(t *testing.T) bmc.Target {
			srv := httptest.NewTLSServer(redfishbmc.New(redfishbmc.Credentials(creds), slog.New(slog.DiscardHandler),
				redfishbmc.System{ID: "s", Machine: bmctest.NewMachine(false)}))
			t.Cleanup(srv.Close)
			a, _ := bmc.ParseAddress("redfish+" + srv.URL)
			return bmc.Target{Address: a, Credentials: creds, InsecureSkipVerify: insecure, Timeout: 5 * time.Second}
		}
	}
	for _, tc := range []struct {
		name   string
		target func(t *testing.T) bmc.Target
		err    string // "" means the call works
	}{
		{"unreachable", closed, "cannot reach the BMC"},
		{"wrong password", withTarget(func(t *bmc.Target) { t.Credentials.Password = "nope" }), "refused the credentials (401)"},
		{"self-signed without insecure", tlsBMC(false), "set insecureSkipVerify: true"},
		{"self-signed with insecure", tlsBMC(true), ""},
		{"https to a plain HTTP BMC", withTarget(func(t *bmc.Target) { t.Address.Endpoint = strings.Replace(t.Address.Endpoint, "http:", "https:", 1) }), "does not speak TLS"},
		{"slow BMC", serve(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-time.After(time.Minute):
			case <-r.Context().Done():
			}
		}), "did not answer in time"},
		{"malformed JSON", serve(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, `{"@odata.id": "/redfish/v1/", "Systems": {`)
		}), "is this a Redfish service?"},
		{"no such system", withTarget(func(t *bmc.Target) { t.Address.System = "/redfish/v1/Systems/other" }), "answered 404"},
		{"IPMI, nothing answers", func(t *testing.T) bmc.Target {
			if _, err := exec.LookPath(bmc.IPMITool); err != nil {
				prereq.Missing(t, "ipmitool is not installed (hack/install-deps.sh)")
			}
			l, err := net.ListenPacket("udp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := l.LocalAddr().String()
			l.Close()
			a, _ := bmc.ParseAddress("ipmi://" + addr)
			return bmc.Target{Address: a, Credentials: creds, Timeout: 3 * time.Second}
		}, "did not answer in time (is IPMI over LAN on"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			target := tc.target(t)
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			c, err := bmc.Dial(ctx, target)
			if err == nil {
				defer c.Close()
				_, err = c.PowerState(ctx)
			}
			switch {
			case tc.err == "" && err != nil:
				t.Fatalf("want success, got %v", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("error %v, want one containing %q", err, tc.err)
			case err != nil && strings.Contains(err.Error(), creds.Password):
				t.Fatalf("the error carries the password: %v", err)
			case err != nil && !strings.Contains(err.Error(), target.Address.String()):
				t.Errorf("the error does not name the BMC %s: %v", target.Address, err)
			}
			t.Logf("%v", err)
		})
	}
}

// TestEachGoesOnPastAHungBMC: one BMC that never answers holds up
// neither the others nor the call beyond its own timeout.
func TestEachGoesOnPastAHungBMC(t *testing.T) {
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }))
	defer hung.Close()
	targets := map[string]bmc.Target{}
	var names []string
	for i := range 8 {
		name := fmt.Sprintf("m%d", i)
		names = append(names, name)
		targets[name] = labBMC(t, bmctest.NewMachine(false), nil)
	}
	a, _ := bmc.ParseAddress("redfish+" + hung.URL)
	targets["m3"] = bmc.Target{Address: a, Credentials: creds, Timeout: 300 * time.Millisecond}
	results := bmc.Each(t.Context(), names, 2, func(ctx context.Context, name string) (bmc.PowerState, error) {
		c, err := bmc.Dial(ctx, targets[name])
		if err != nil {
			return "", err
		}
		defer c.Close()
		if err := c.Power(ctx, bmc.On); err != nil {
			return "", err
		}
		return c.PowerState(ctx)
	})
	for i, r := range results {
		if r.Machine != names[i] {
			t.Errorf("result %d is for %s, want %s", i, r.Machine, names[i])
		}
		switch {
		case r.Machine == "m3" && (r.Err == nil || !strings.Contains(r.Err.Error(), "did not answer in time")):
			t.Errorf("m3: %v, want a timeout", r.Err)
		case r.Machine != "m3" && (r.Err != nil || r.Value != bmc.PowerOn):
			t.Errorf("%s: %s, %v; want On", r.Machine, r.Value, r.Err)
		}
	}
}
