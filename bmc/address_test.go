package bmc

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestParseAddress(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Address
		err  string
	}{
		{in: "redfish+https://10.0.0.5", want: Address{Protocol: Redfish, Endpoint: "https://10.0.0.5"}},
		{in: "redfish+https://bmc1.example:8443/", want: Address{Protocol: Redfish, Endpoint: "https://bmc1.example:8443"}},
		{in: "redfish+http://[fd00::5]:8000/redfish/v1/Systems/System.Embedded.1", want: Address{Protocol: Redfish, Endpoint: "http://[fd00::5]:8000", System: "/redfish/v1/Systems/System.Embedded.1"}},
		{in: "ipmi://10.0.0.6", want: Address{Protocol: IPMI, Endpoint: "10.0.0.6:623"}},
		{in: "ipmi://10.0.0.6:6230", want: Address{Protocol: IPMI, Endpoint: "10.0.0.6:6230"}},
		{in: "https://10.0.0.5", err: `scheme "https" is not one of`},
		{in: "redfish+https://admin:hunter2@10.0.0.5", err: "must not hold credentials"},
		{in: "redfish+https:///redfish/v1", err: "has no host"},
		{in: "redfish+https://10.0.0.5/redfish/v1/Managers/1", err: "the path must be empty or a system"},
		{in: "redfish+https://10.0.0.5/redfish/v1/Systems/1/Bios", err: "the path must be empty or a system"},
		{in: "redfish+https://10.0.0.5?x=1", err: "no query"},
		{in: "redfish+https://10.0.0.5:99999", err: "not a port number"},
		{in: "ipmi://10.0.0.6/x", err: "no path"},
		{in: "::", err: "not a URL"},
	} {
		got, err := ParseAddress(tc.in)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("ParseAddress(%q) = %+v, %v; want error %q", tc.in, got, err, tc.err)
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("ParseAddress(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		case err != nil && strings.Contains(err.Error(), "hunter2"):
			t.Errorf("ParseAddress(%q) echoes the password: %v", tc.in, err)
		}
		if err == nil {
			if back, err := ParseAddress(got.String()); err != nil || back != got {
				t.Errorf("ParseAddress(%q).String() = %q does not parse back: %+v, %v", tc.in, got.String(), back, err)
			}
		}
	}
}

func TestLoadCredentials(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name, content string
		mode          os.FileMode
		err           string
	}{
		{"ok", "username: admin\npassword: hunter2\n", 0o600, ""},
		{"owner read only", "username: admin\npassword: hunter2\n", 0o400, ""},
		{"group readable", "username: admin\npassword: hunter2\n", 0o640, "chmod 600"},
		{"world readable", "username: admin\npassword: hunter2\n", 0o644, "mode 0644 lets others read them"},
		{"no password", "username: admin\n", 0o600, "password is empty"},
		{"unknown field", "username: admin\npasswd: hunter2\n", 0o600, "not a mapping of username and password"},
		{"not YAML", "hunter2: [", 0o600, "not a mapping of username and password"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := LoadCredentials(write(tc.name, tc.content, tc.mode))
			switch {
			case tc.err == "" && (err != nil || c != Credentials{Username: "admin", Password: "hunter2"}):
				t.Fatalf("LoadCredentials = %v, %v", c, err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("LoadCredentials error %v, want %q", err, tc.err)
			case err != nil && strings.Contains(err.Error(), "hunter2"):
				t.Fatalf("the error echoes the password: %v", err)
			}
		})
	}
	if _, err := LoadCredentials(filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("a missing file: %v", err)
	}
}

// TestCredentialsDoNotPrint: however credentials are formatted, the
// password stays out.
func TestCredentialsDoNotPrint(t *testing.T) {
	c := Credentials{Username: "admin", Password: "hunter2"}
	for _, s := range []string{c.String(), c.GoString(), c.LogValue().String(), fmtAll(c)} {
		if strings.Contains(s, "hunter2") {
			t.Errorf("printed the password: %s", s)
		}
	}
}

func fmtAll(c Credentials) string {
	var b strings.Builder
	for _, verb := range []string{"%v", "%+v", "%#v", "%s"} {
		b.WriteString(fmt.Sprintf(verb, c))
	}
	return b.String()
}

func FuzzParseAddress(f *testing.F) {
	for _, s := range []string{"redfish+https://10.0.0.5", "redfish+http://[::1]:80/redfish/v1/Systems/a", "ipmi://h:623", "redfish+https://u:p@h", "%zz"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := ParseAddress(s)
		if err != nil {
			return
		}
		if back, err := ParseAddress(a.String()); err != nil || back != a {
			t.Fatalf("%q parsed to %+v, whose String %q parses to %+v, %v", s, a, a.String(), back, err)
		}
	})
}

func FuzzParseCredentials(f *testing.F) {
	f.Add([]byte("username: admin\npassword: hunter2\n"))
	f.Add([]byte("{username: a, password: b, x: 1}"))
	messages := []string{"not a mapping of username and password (YAML)", "username is empty", "password is empty"}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseCredentials(data)
		if err == nil && (c.Username == "" || c.Password == "") {
			t.Fatalf("accepted empty credentials: %q", data)
		}
		// Only fixed messages: nothing of the file reaches an error.
		if err != nil && !slices.Contains(messages, err.Error()) {
			t.Fatalf("error %q is not one of the fixed messages", err)
		}
	})
}

func FuzzDecodeMembers(f *testing.F) {
	f.Add([]byte(`{"Members":[{"@odata.id":"/redfish/v1/Systems/1"}]}`))
	f.Add([]byte(`{"Members":[{"@odata.id":"/redfish/v1/Systems/../Managers"}]}`))
	f.Add([]byte(`{"Members":null}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		paths, err := DecodeMembers(data)
		if err != nil {
			return
		}
		for _, p := range paths {
			if a, err := ParseAddress("redfish+https://h" + p); err != nil || a.System != p {
				t.Fatalf("member %q is not a system path: %+v, %v", p, a, err)
			}
		}
	})
}

func TestParseIPMI(t *testing.T) {
	for _, tc := range []struct {
		out  string
		want Boot
	}{
		{"Boot Flags :\n   - Boot Flag Invalid\n   - Options apply to only next boot\n   - Boot Device Selector : No override\n", Boot{"None", "Disabled"}},
		{"Boot Flags :\n   - Boot Flag Valid\n   - Options apply to only next boot\n   - Boot Device Selector : Force PXE\n", Boot{"Pxe", "Once"}},
		{"Boot Flags :\n   - Boot Flag Valid\n   - Options apply to all future boots\n   - Boot Device Selector : Force Boot from default Hard-Drive\n", Boot{"Hdd", "Continuous"}},
	} {
		if got := ParseIPMIBootFlags(tc.out); got != tc.want {
			t.Errorf("ParseIPMIBootFlags(%q) = %+v, want %+v", tc.out, got, tc.want)
		}
	}
	for out, want := range map[string]PowerState{"Chassis Power is on\n": PowerOn, "Chassis Power is off": PowerOff, "garbage": ""} {
		if got, err := ParseIPMIPower(out); got != want || (want == "") != (err != nil) {
			t.Errorf("ParseIPMIPower(%q) = %s, %v; want %s", out, got, err, want)
		}
	}
}

func FuzzParseIPMIBootFlags(f *testing.F) {
	f.Add("   - Boot Flag Valid\n   - Options apply to all future boots\n   - Boot Device Selector : Force PXE\n")
	f.Fuzz(func(t *testing.T, out string) {
		b := ParseIPMIBootFlags(out)
		if !slices.Contains([]string{"None", "Pxe", "Hdd", "Cd"}, b.Target) || !slices.Contains([]string{"Disabled", "Once", "Continuous"}, b.Enabled) ||
			(b.Target == "None") != (b.Enabled == "Disabled") {
			t.Fatalf("%q read as %+v", out, b)
		}
		if _, err := ParseIPMIPower(out); err != nil && len(err.Error()) > 256 {
			t.Fatalf("error too long: %d bytes", len(err.Error()))
		}
	})
}
