package bootstrap

import "sync"

// etcdGate opens when the rack is whole enough to bootstrap etcd: every
// machine has taken its config and every control plane is installed. It
// does not wait for workers to finish installing, so the control plane's
// etcd and kube-apiserver start while workers reboot into Talos; a rack
// with a missing or broken machine still stops before etcd exists.
type etcdGate struct {
	applied  sync.WaitGroup
	cpsUp    sync.WaitGroup
	open     chan struct{}
	fail     chan struct{}
	failOnce sync.Once
	marks    sync.Map // hostname+mark -> func() (a sync.OnceFunc)
	cpByHost map[string]bool
}

func newEtcdGate(machines []string, controlPlanes []string) *etcdGate {
	g := &etcdGate{open: make(chan struct{}), fail: make(chan struct{}), cpByHost: map[string]bool{}}
	g.applied.Add(len(machines))
	g.cpsUp.Add(len(controlPlanes))
	for _, cp := range controlPlanes {
		g.cpByHost[cp] = true
	}
	go func() {
		g.applied.Wait()
		g.cpsUp.Wait()
		close(g.open)
	}()
	return g
}

// once runs done at most once per machine and mark.
func (g *etcdGate) once(host, mark string, done func()) {
	f, _ := g.marks.LoadOrStore(host+"\x00"+mark, sync.OnceFunc(done))
	f.(func())()
}

// appliedConfig records that a machine took its config (or had before).
func (g *etcdGate) appliedConfig(host string) { g.once(host, "applied", g.applied.Done) }

// installed records that a machine is configured.
func (g *etcdGate) installed(host string) {
	g.appliedConfig(host)
	if g.cpByHost[host] {
		g.once(host, "up", g.cpsUp.Done)
	}
}

// failed records that a machine will not get there: the gate then never
// lets etcd be bootstrapped in this run.
func (g *etcdGate) failed(host string) {
	g.failOnce.Do(func() { close(g.fail) })
	g.installed(host) // releases the waiter; wait reports the failure
}

// wait returns true once etcd may be bootstrapped, false if a machine
// failed first.
func (g *etcdGate) wait() bool {
	select {
	case <-g.open:
	case <-g.fail:
		return false
	}
	select {
	case <-g.fail: // failed and opened at once: the failure wins
		return false
	default:
		return true
	}
}
