// Command cozy-talos-node is an emulated Talos Linux node: it serves
// Talos's machine API on --address:50000 in maintenance mode until a
// machine config is applied, then in configured mode, and runs etcd and
// kube-apiserver once bootstrapped. See lab/talosnode and
// docs/talos-node.md.
//
//	cozy-talos-node --address 10.0.0.11/24 --state-dir /var/lib/node \
//	    --mac 52:54:00:00:00:01 --uuid 6f1c... --disk vda:20GiB:virtio
//
// It runs until SIGTERM or SIGINT, or until the machine is shut down
// through the API. With --reboot=exit it also exits when the machine
// should reboot, with status 10 (talosnode.RebootExitCode), so a VM's init
// can reboot the VM; it exits 0 when the machine should power off.
package main

import (
	"os"

	"cozy.dev/cozy/lab/talosnode"
)

func main() {
	os.Exit(talosnode.Main(os.Args[1:], os.Stderr))
}
