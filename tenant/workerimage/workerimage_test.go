package workerimage

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBuildRefusesBadOptions: every missing input is named at once, and
// nothing is written.
func TestBuildRefusesBadOptions(t *testing.T) {
	out := filepath.Join(t.TempDir(), "image")
	for _, tc := range []struct {
		name string
		o    Options
		want []string
	}{
		{name: "nothing", o: Options{}, want: []string{`version ""`, "no kernel", "no kubelet and kubeadm", "no containerd", "no cozy-worker", "no crictl", "no ISOLINUX"}},
		{name: "bad version", o: Options{Version: "1.36", KernelDir: "k", KubernetesDir: "k", RuntimeDir: "r", Agent: "a", Crictl: "c", Syslinux: "s"}, want: []string{`version "1.36" is not a Kubernetes version`}},
		{name: "kubelet of another version", o: Options{Version: "v1.36.3", KernelDir: "k", KubernetesDir: t.TempDir(), RuntimeDir: "r", Agent: "a", Crictl: "c", Syslinux: "s"}, want: []string{"kubelet"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Build(context.Background(), tc.o, out)
			if err == nil {
				t.Fatal("built")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if _, err := os.Stat(out); err == nil {
				t.Errorf("%s written", out)
			}
		})
	}
}

func TestDefaults(t *testing.T) {
	o, err := Options{Version: "v1.36.3", KernelDir: "k", KubernetesDir: "k", RuntimeDir: "r", Agent: "a", Crictl: "c", Syslinux: "s"}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if o.Ref != "cozy.dev/tenant-worker:v1.36.3" || o.Busybox != "/bin/busybox" || o.Runc != "/usr/sbin/runc" ||
		o.Conntrack != "/usr/sbin/conntrack" || o.Iptables != "/usr/sbin/xtables-nft-multi" || o.Xtables != "/usr/lib/x86_64-linux-gnu/xtables" {
		t.Errorf("defaults %+v", o)
	}
	if got := DiskName("v1.36.3"); got != "cozy-worker-v1.36.3.qcow2" {
		t.Errorf("disk name %q", got)
	}
}
