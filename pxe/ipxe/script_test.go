package ipxe

import (
	"errors"
	"strings"
	"testing"
)

func TestScript(t *testing.T) {
	tests := []struct {
		name    string
		boot    Boot
		want    string
		wantErr error
	}{
		{
			name: "kernel and two initramfs",
			boot: Boot{
				KernelURL:  "http://10.8.0.1:8080/assets/vmlinuz",
				InitrdURLs: []string{"http://10.8.0.1:8080/assets/initrd0", "http://10.8.0.1:8080/assets/initrd1"},
				Cmdline:    "console=ttyS0 talos.platform=metal",
			},
			want: "#!ipxe\n" +
				"kernel --name kernel http://10.8.0.1:8080/assets/vmlinuz initrd=initrd0 initrd=initrd1 console=ttyS0 talos.platform=metal\n" +
				"initrd --name initrd0 http://10.8.0.1:8080/assets/initrd0\n" +
				"initrd --name initrd1 http://10.8.0.1:8080/assets/initrd1\n" +
				"boot kernel\n",
		},
		{
			name: "empty command line",
			boot: Boot{KernelURL: "http://h/k", InitrdURLs: []string{"http://h/i"}},
			want: "#!ipxe\nkernel --name kernel http://h/k initrd=initrd0\ninitrd --name initrd0 http://h/i\nboot kernel\n",
		},
		{name: "newline in cmdline injects a command", boot: Boot{KernelURL: "http://h/k", InitrdURLs: []string{"http://h/i"}, Cmdline: "quiet\nshell"}, wantErr: ErrUnsafe},
		{name: "settings expansion", boot: Boot{KernelURL: "http://h/k", InitrdURLs: []string{"http://h/i"}, Cmdline: "x=${password}"}, wantErr: ErrUnsafe},
		{name: "space in URL adds arguments", boot: Boot{KernelURL: "http://h/k extra", InitrdURLs: []string{"http://h/i"}}, wantErr: ErrUnsafe},
		{name: "relative URL", boot: Boot{KernelURL: "/k", InitrdURLs: []string{"http://h/i"}}},
		{name: "tftp URL", boot: Boot{KernelURL: "tftp://h/k", InitrdURLs: []string{"http://h/i"}}},
		{name: "no initramfs", boot: Boot{KernelURL: "http://h/k"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Script(tc.boot)
			if tc.want == "" {
				if err == nil {
					t.Fatalf("accepted:\n%s", got)
				}
				if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
					t.Fatalf("error = %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("got:\n%s\nwant:\n%s", got, tc.want)
			}
		})
	}
}

// FuzzScript: whatever the inputs, an accepted script has exactly the
// commands Script writes, one per line, and nothing expands.
func FuzzScript(f *testing.F) {
	f.Add("http://10.8.0.1/k", "http://10.8.0.1/i", "console=ttyS0")
	f.Add("http://h/k", "http://h/i", "a\nb")
	f.Add("http://h/k${x}", "http://h/i", "")
	f.Fuzz(func(t *testing.T, kernel, initrd, cmdline string) {
		s, err := Script(Boot{KernelURL: kernel, InitrdURLs: []string{initrd}, Cmdline: cmdline})
		if err != nil {
			return
		}
		lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
		if len(lines) != 4 || lines[0] != "#!ipxe" || !strings.HasPrefix(lines[1], "kernel --name kernel ") ||
			!strings.HasPrefix(lines[2], "initrd --name initrd0 ") || lines[3] != "boot kernel" {
			t.Fatalf("script has unexpected commands:\n%s", s)
		}
		if strings.Contains(s, "${") {
			t.Fatalf("script expands settings:\n%s", s)
		}
	})
}
