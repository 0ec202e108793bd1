// Command cozy-worker is the first-boot agent of Cozy's worker image
// (tenant/workerimage): /init runs it once the network and containerd are
// up, with the machine's cloud-init disk (a config drive or a NoCloud
// seed) mounted. It applies the seed
// (tenant/workeragent) and then keeps the kubelet running; it exits only
// if the seed cannot be applied, and /init then powers the VM off with
// the reason on the console.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"cozy.dev/cozy/tenant/workeragent"
)

func main() {
	seed := flag.String("seed", "/run/seed", "the mounted cloud-init disk: a NoCloud seed (meta-data, user-data) or a config drive (openstack/latest/)")
	kubelet := flag.String("kubelet", "/bin/kubelet", "the kubelet binary")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	a := &workeragent.Agent{
		Root:        "/",
		Shell:       "/bin/sh",
		Log:         os.Stdout,
		SetHostname: func(name string) error { return syscall.Sethostname([]byte(name)) },
	}
	// The kubelet runs beside the seed's commands: kubeadm join writes
	// its config and then waits for it to register.
	done := make(chan struct{})
	go func() {
		a.RunKubelet(ctx, *kubelet)
		close(done)
	}()
	if err := a.Apply(ctx, *seed); err != nil {
		fmt.Fprintf(os.Stdout, "cozy-worker: %v\n", err)
		// A failed command leaves a node that may still be usable (as
		// with cloud-init, the machine stays up); a seed that was not
		// applied leaves nothing to do.
		if errors.Is(err, workeragent.ErrSeed) {
			os.Exit(1)
		}
	} else {
		fmt.Fprintln(os.Stdout, "cozy-worker: seed applied")
	}
	<-done
}
