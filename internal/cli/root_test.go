package cli

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"cozy.dev/cozy/internal/version"
)

func run(args ...string) (stdout, stderr string, code int) {
	var out, errOut bytes.Buffer
	code = Execute(args, &out, &errOut)
	return out.String(), errOut.String(), code
}

func TestVersionFormats(t *testing.T) {
	want := version.Get()
	tests := []struct {
		name   string
		args   []string
		decode func([]byte, any) error
	}{
		{"json", []string{"version", "-o", "json"}, json.Unmarshal},
		{"yaml", []string{"version", "--output=yaml"}, func(b []byte, v any) error { return yaml.UnmarshalStrict(b, v) }},
		{"global flag before the command", []string{"-o", "json", "version"}, json.Unmarshal},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			stdout, stderr, code := run(tc.args...)
			if code != 0 {
				t.Fatalf("exit %d, stderr: %s", code, stderr)
			}
			var got version.Info
			if err := tc.decode([]byte(stdout), &got); err != nil {
				t.Fatalf("output does not decode: %v\n%s", err, stdout)
			}
			if got != want {
				t.Errorf("got %+v, want %+v", got, want)
			}
			if got.TalosVersion == "" || !strings.HasPrefix(got.KubernetesVersion, "v1.") {
				t.Errorf("pinned versions missing: %+v", got)
			}
		})
	}
}

func TestVersionTable(t *testing.T) {
	stdout, stderr, code := run("version")
	if code != 0 {
		t.Fatalf("exit %d, stderr: %s", code, stderr)
	}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if len(lines) != 7 || !strings.HasPrefix(lines[0], "FIELD") {
		t.Fatalf("want a header and 6 rows, got:\n%s", stdout)
	}
	if !strings.Contains(stdout, version.Get().TalosVersion) {
		t.Errorf("table lacks the Talos version:\n%s", stdout)
	}
}

func TestErrorsGoToStderr(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"unknown output format", []string{"version", "-o", "xml"}, `unknown output format "xml": use one of table, json, yaml`},
		{"unknown log level", []string{"--log-level", "loud", "version"}, `unknown log level "loud"`},
		{"unknown command", []string{"frobnicate"}, `unknown command "frobnicate"`},
		{"extra argument", []string{"version", "now"}, `unknown command "now"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			stdout, stderr, code := run(tc.args...)
			if code == 0 {
				t.Fatalf("exit 0, want failure; stdout: %s", stdout)
			}
			if stdout != "" {
				t.Errorf("stdout must stay clean on error, got %q", stdout)
			}
			if !strings.Contains(stderr, tc.wantErr) || strings.Count(stderr, "Error:") != 1 {
				t.Errorf("stderr = %q, want one error containing %q", stderr, tc.wantErr)
			}
		})
	}
}

func TestCompletion(t *testing.T) {
	for _, shell := range []string{"bash", "zsh", "fish", "powershell"} {
		t.Run(shell, func(t *testing.T) {
			stdout, stderr, code := run("completion", shell)
			if code != 0 || !strings.Contains(stdout, "cozyctl") {
				t.Fatalf("exit %d, stderr %q, stdout starts %.80q", code, stderr, stdout)
			}
		})
	}
	// Dynamic completion of -o values, as a shell asks for them.
	stdout, _, _ := run("__complete", "version", "-o", "")
	for _, f := range []string{"table", "json", "yaml"} {
		if !strings.Contains(stdout, f+"\n") {
			t.Errorf("completion of -o lacks %s:\n%s", f, stdout)
		}
	}
}

func TestLogLevel(t *testing.T) {
	tests := []struct {
		level     string
		wantDebug bool
		wantWarn  bool
	}{
		{"debug", true, true},
		{"info", false, true},
		{"WARN", false, true},
		{"error", false, false},
	}
	for _, tc := range tests {
		t.Run(tc.level, func(t *testing.T) {
			var out, errOut bytes.Buffer
			root, g := newRoot(&out, &errOut)
			root.AddCommand(&cobra.Command{Use: "probe", Run: func(*cobra.Command, []string) {
				g.Logger().Debug("debug-line")
				g.Logger().Warn("warn-line")
			}})
			root.SetArgs([]string{"probe", "--log-level", tc.level})
			if err := root.Execute(); err != nil {
				t.Fatal(err)
			}
			if got := strings.Contains(errOut.String(), "debug-line"); got != tc.wantDebug {
				t.Errorf("debug logged = %v, want %v", got, tc.wantDebug)
			}
			if got := strings.Contains(errOut.String(), "warn-line"); got != tc.wantWarn {
				t.Errorf("warn logged = %v, want %v", got, tc.wantWarn)
			}
			if out.Len() != 0 {
				t.Errorf("logs went to stdout: %q", out.String())
			}
		})
	}
}
