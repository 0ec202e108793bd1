package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"cozy.dev/cozy/tenant/workerimage"
)

func newTenantImageCommand(g *Globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "image",
		Short: "Build the worker images tenant clusters boot",
	}
	cmd.AddCommand(newTenantImageBuildCommand(g))
	return cmd
}

func newTenantImageBuildCommand(g *Globals) *cobra.Command {
	var o workerimage.Options
	var out string
	cmd := &cobra.Command{
		Use:   "build --version VERSION --out DIR --kernel DIR --kubernetes DIR --runtime DIR --syslinux DIR --agent FILE --crictl FILE",
		Short: "Build a tenant worker disk (KubeVirt containerDisk) for one Kubernetes version",
		Long: `Build Cozy's tenant worker image for one Kubernetes version into DIR, an
OCI image layout (for cozyctl images mirror --from DIR), with the qcow2
also at DIR/disk/ to boot without KubeVirt.

The disk boots (BIOS, ISOLINUX) a kernel and an initramfs that hold the
whole node: containerd, runc, the CNI plugins, crictl, conntrack,
iptables, kubelet and kubeadm of that version, and cozy-worker, which
applies the user-data on the cloud-init disk KubeVirt attaches (the
config drive of CAPK's VMs, or a NoCloud seed: the kubeadm bootstrap
provider's kubeadm join) and runs the kubelet. Its inputs are built binaries: hack/worker-image.sh (make
worker-image) builds them all from the Go module proxy and Debian and
runs this command. Same inputs, same digest.`,
		Example: `  hack/worker-image.sh v1.36.3     # builds the inputs, then runs this
  cozyctl images mirror --from "$(hack/worker-image.sh v1.36.3)" --to registry.rack.example:5000`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			im, err := workerimage.Build(cmd.Context(), o, out)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s in %s (disk %s)\n", im.Ref, im.Layout, im.Disk)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Version, "version", "", "Kubernetes version (v1.36.3); kubelet and kubeadm must be that version")
	f.StringVar(&out, "out", "", "directory to write the image layout into (must not exist)")
	f.StringVar(&o.KernelDir, "kernel", "", "kernel directory (hack/boot-assets.sh)")
	f.StringVar(&o.KubernetesDir, "kubernetes", "", "directory holding static kubelet and kubeadm (hack/envtest-assets.sh VERSION)")
	f.StringVar(&o.RuntimeDir, "runtime", "", "containerd and CNI plugins directory (hack/node-assets.sh)")
	f.StringVar(&o.Syslinux, "syslinux", "", "directory with isolinux.bin, ldlinux.c32 and isohdpfx.bin (Debian's isolinux, syslinux-common)")
	f.StringVar(&o.Agent, "agent", "", "static cozy-worker binary")
	f.StringVar(&o.Busybox, "busybox", "/bin/busybox", "static busybox (Debian busybox-static)")
	f.StringVar(&o.Crictl, "crictl", "", "static crictl (sigs.k8s.io/cri-tools)")
	f.StringVar(&o.Runc, "runc", "/usr/sbin/runc", "runc (Debian's; its libraries ride along)")
	f.StringVar(&o.Conntrack, "conntrack", "/usr/sbin/conntrack", "conntrack (Debian's; its libraries ride along)")
	f.StringVar(&o.Iptables, "iptables", "/usr/sbin/xtables-nft-multi", "iptables (Debian's xtables-nft-multi; its libraries ride along)")
	f.StringVar(&o.Xtables, "xtables", "/usr/lib/x86_64-linux-gnu/xtables", "iptables' extensions (Debian's)")
	f.StringVar(&o.Ref, "ref", "", "image name (default "+workerimage.DefaultRepository+":VERSION)")
	for _, name := range []string{"version", "out", "kernel", "kubernetes", "runtime", "syslinux", "agent", "crictl"} {
		_ = cmd.MarkFlagRequired(name)
	}
	_ = g
	return cmd
}
