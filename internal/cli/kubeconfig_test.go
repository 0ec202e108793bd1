package cli

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeKubeconfig(t *testing.T, server string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: ` + server + `}
users:
- name: u
  user: {token: t}
contexts:
- name: ctx
  context: {cluster: c, user: u}
current-context: ctx
`
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestRESTConfig(t *testing.T) {
	fromFlag := writeKubeconfig(t, "https://127.0.0.1:6443")
	fromEnv := writeKubeconfig(t, "https://127.0.0.1:7443")
	tests := []struct {
		name     string
		flag     string
		env      string
		wantHost string
		wantErr  string
	}{
		{name: "flag wins over KUBECONFIG", flag: fromFlag, env: fromEnv, wantHost: "https://127.0.0.1:6443"},
		{name: "KUBECONFIG without flag", env: fromEnv, wantHost: "https://127.0.0.1:7443"},
		{name: "missing file named by the flag", flag: "/nonexistent/kubeconfig", env: fromEnv, wantErr: "load kubeconfig from /nonexistent/kubeconfig"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("KUBECONFIG", tc.env)
			root, g := newRoot(io.Discard, io.Discard)
			args := []string{"version"}
			if tc.flag != "" {
				args = append(args, "--kubeconfig", tc.flag)
			}
			root.SetArgs(args)
			if err := root.Execute(); err != nil {
				t.Fatal(err)
			}
			cfg, err := g.RESTConfig()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Host != tc.wantHost || cfg.BearerToken != "t" {
				t.Errorf("host %q token %q, want %q", cfg.Host, cfg.BearerToken, tc.wantHost)
			}
		})
	}
}
