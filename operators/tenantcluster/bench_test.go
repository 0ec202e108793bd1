//go:build integration && bench

package tenantcluster

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"cozy.dev/cozy/internal/testenv"
	v1 "cozy.dev/cozy/operators/api/v1alpha1"
)

// Bench sizes: 1,000 TenantClusters with two node groups each, spread
// over 100 namespaces as tenants would be.
const (
	benchClusters   = 1000
	benchNamespaces = 100
	benchWorkers    = 8 // concurrent writers, and the operator's --concurrency
	benchQPS        = 2000
)

func benchTenantCluster(i int) *v1.TenantCluster {
	return &v1.TenantCluster{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("t%04d", i), Namespace: fmt.Sprintf("tenant-%03d", i%benchNamespaces)},
		Spec: v1.TenantClusterSpec{
			Version: "v1.36.3",
			NodeGroups: []v1.NodeGroup{
				{Name: "md0", Replicas: ptr.To[int32](2), Resources: &v1.Resources{CPU: 2, Memory: "4Gi"}, DiskSize: "20Gi"},
				{Name: "md1", MinReplicas: ptr.To[int32](1), MaxReplicas: ptr.To[int32](3), Resources: &v1.Resources{CPU: 4, Memory: "8Gi"}, DiskSize: "40Gi"},
			},
		},
	}
}

func benchEnv(t *testing.T) (*testenv.Env, *rest.Config) {
	env, scheme := startAPIServer(t)
	// As the platform installs it: TenantClusters get their finalizer
	// from the API server.
	installFinalizerPolicy(t, env)
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = benchQPS, benchQPS
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	for n := range benchNamespaces {
		if err := c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("tenant-%03d", n)}}); err != nil {
			t.Fatal(err)
		}
	}
	env.Client = c
	return env, cfg
}

// parallel runs f(i) for i in [0, n) on benchWorkers goroutines.
func parallel(n int, f func(i int) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, benchWorkers)
	for range benchWorkers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// TestBenchOperator: the time until every child of 1,000 TenantClusters
// exists, the operator against a plain client that creates the same
// TenantClusters and children itself (each on a fresh API server, same
// concurrency and client rate), then the operator's writes per minute
// once converged and its peak RSS.
func TestBenchOperator(t *testing.T) {
	ctx := context.Background()
	one, err := Desired(benchTenantCluster(0), "v1.36.3")
	if err != nil {
		t.Fatal(err)
	}
	perCluster := len(one.All())
	kinds := map[schema.GroupVersionKind]bool{}
	for _, u := range one.All() {
		kinds[u.GroupVersionKind()] = true
	}

	// The peer: a plain client.
	env, _ := benchEnv(t)
	cpu0 := childrenCPU(t)
	profileAPIServer(t, env, "plain")
	start := time.Now()
	err = parallel(benchClusters, func(i int) error {
		tc := benchTenantCluster(i)
		if err := env.Client.Create(ctx, tc); err != nil {
			return err
		}
		c, err := Desired(tc, tc.Spec.Version)
		if err != nil {
			return err
		}
		for _, u := range c.All() {
			if err := env.Client.Create(ctx, u); err != nil {
				return fmt.Errorf("%s %s: %w", u.GetKind(), u.GetName(), err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	plain := time.Since(start)
	t.Logf("plain client: %d TenantClusters and %d children created in %v; CPU of kube-apiserver+etcd %v",
		benchClusters, benchClusters*perCluster, plain.Round(time.Millisecond), (childrenCPU(t) - cpu0).Round(time.Second))

	// The operator, as its own process, on a fresh API server.
	env, cfg := benchEnv(t)
	op := startOperatorProcess(t, env)
	cpu0 = childrenCPU(t)
	opCPU0 := processCPU(t, op.cmd.Process.Pid)
	profileAPIServer(t, env, "operator")
	profileOperator(t, op)
	start = time.Now()
	if err := parallel(benchClusters, func(i int) error { return env.Client.Create(ctx, benchTenantCluster(i)) }); err != nil {
		t.Fatal(err)
	}
	created := time.Since(start)
	for {
		n, err := countChildren(ctx, cfg, kinds, false)
		if err != nil {
			t.Fatal(err)
		}
		if n >= benchClusters*perCluster {
			break
		}
		if time.Since(start) > 20*time.Minute {
			t.Fatalf("after 20 minutes only %d of %d children exist", n, benchClusters*perCluster)
		}
		time.Sleep(200 * time.Millisecond)
	}
	operator := time.Since(start)
	if n, err := countChildren(ctx, cfg, kinds, true); err != nil || n != benchClusters*perCluster {
		t.Fatalf("listing every child found %d, want %d (%v)", n, benchClusters*perCluster, err)
	}
	t.Logf("operator: %d TenantClusters created in %v, all %d children existed after %v; CPU of kube-apiserver+etcd %v, of the operator %v",
		benchClusters, created.Round(time.Millisecond), benchClusters*perCluster, operator.Round(time.Millisecond),
		(childrenCPU(t) - cpu0 - (processCPU(t, op.cmd.Process.Pid) - opCPU0)).Round(time.Second), (processCPU(t, op.cmd.Process.Pid) - opCPU0).Round(time.Second))

	// Settle (statuses, the finalizers, the events), then count a
	// minute of writes.
	settled := op.waitQuiet(t, 10*time.Second, 5*time.Minute)
	before := op.writes(t)
	time.Sleep(time.Minute)
	idle := op.writes(t) - before
	rss := op.peakRSS(t)

	t.Logf("BENCH operator children of %d TenantClusters (%d objects): operator %.1fs, plain client %.1fs, ratio %.2f (plain/operator, goal >= 0.7)",
		benchClusters, benchClusters*perCluster, operator.Seconds(), plain.Seconds(), plain.Seconds()/operator.Seconds())
	t.Logf("BENCH operator writes after convergence (settled %v after the last child): %d in 60s (goal 0)", settled.Round(time.Second), idle)
	t.Logf("BENCH operator peak RSS %d MB (goal <= 150 MB), total writes %d", rss>>20, before)
	if idle != 0 {
		t.Errorf("the operator wrote %d times in a minute after converging", idle)
	}
}

// profileSeconds is how long a profile taken during the bench lasts:
// most of a phase.
const profileSeconds = "40"

// profileAPIServer saves a CPU profile of the API server's next 40
// seconds as $COZY_BENCH_PROFILE/apiserver-NAME.pprof, when that
// variable names a directory: where the server's time goes, for
// "go tool pprof".
func profileAPIServer(t *testing.T, env *testenv.Env, name string) {
	dir := os.Getenv("COZY_BENCH_PROFILE")
	if dir == "" {
		return
	}
	c, err := rest.UnversionedRESTClientFor(withCodecs(env.Config))
	if err != nil {
		t.Fatal(err)
	}
	go saveProfile(t, filepath.Join(dir, "apiserver-"+name+".pprof"), func() ([]byte, error) {
		return c.Get().AbsPath("/debug/pprof/profile").Param("seconds", profileSeconds).Timeout(time.Minute).DoRaw(context.Background())
	})
}

// profileOperator does the same for the operator, through its
// --pprof-bind-address.
func profileOperator(t *testing.T, p *operatorProcess) {
	dir := os.Getenv("COZY_BENCH_PROFILE")
	if dir == "" {
		return
	}
	go saveProfile(t, filepath.Join(dir, "operator.pprof"), func() ([]byte, error) {
		// The process may not listen yet.
		var resp *http.Response
		var err error
		for range 50 {
			if resp, err = http.Get(p.pprof + "/debug/pprof/profile?seconds=" + profileSeconds); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		return io.ReadAll(resp.Body)
	})
}

func saveProfile(t *testing.T, file string, get func() ([]byte, error)) {
	data, err := get()
	if err == nil {
		err = os.WriteFile(file, data, 0o644)
	}
	if err != nil {
		t.Logf("profile %s: %v", filepath.Base(file), err)
	}
}

func withCodecs(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.NegotiatedSerializer = clientgoscheme.Codecs.WithoutConversion()
	return cfg
}

// processCPU is a process's user+system CPU time so far.
func processCPU(t *testing.T, pid int) time.Duration {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the command name, which is in parentheses.
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / 100 // USER_HZ
}

// childrenCPU is the CPU time of this test's child processes (the
// envtest kube-apiserver and etcd, and the operator).
func childrenCPU(t *testing.T) time.Duration {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var total time.Duration
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+2:]))
		if ppid, _ := strconv.Atoi(f[1]); ppid == os.Getpid() {
			total += processCPU(t, pid)
		}
	}
	return total
}

// countChildren counts the objects of the kinds the bench expects,
// across namespaces. Polling asks for one item per kind and reads how
// many remain, which the API server answers from its watch cache: it
// must not take the server time the operator is measured by. exact
// lists them all.
func countChildren(ctx context.Context, cfg *rest.Config, kinds map[schema.GroupVersionKind]bool, exact bool) (int, error) {
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return 0, err
	}
	n := 0
	for gvk := range kinds {
		l := &metav1.PartialObjectMetadataList{}
		l.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		var opts []client.ListOption
		if !exact {
			opts = append(opts, client.Limit(1))
		}
		if err := c.List(ctx, l, opts...); err != nil {
			return 0, err
		}
		n += len(l.Items)
		if l.RemainingItemCount != nil {
			n += int(*l.RemainingItemCount)
		} else if l.Continue != "" {
			return 0, fmt.Errorf("list %s: no remainingItemCount", gvk.Kind)
		}
	}
	return n, nil
}

type operatorProcess struct {
	cmd     *exec.Cmd
	metrics string
	pprof   string
}

// startOperatorProcess builds cmd/cozy-operator and runs it against the
// API server, metrics on a loopback port.
func startOperatorProcess(t *testing.T, env *testenv.Env) *operatorProcess {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "cozy-operator")
	build := exec.Command("go", "build", "-o", bin, "../../cmd/cozy-operator")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build cozy-operator: %v\n%s", err, out)
	}
	addr, pprofAddr := freeLoopbackPort(t), freeLoopbackPort(t)
	logFile, err := os.Create(filepath.Join(t.TempDir(), "operator.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin,
		"--kubeconfig", env.WriteKubeconfig(t),
		"--metrics-bind-address", addr, "--metrics-secure=false",
		"--health-probe-bind-address", "0",
		"--pprof-bind-address", pprofAddr,
		"--concurrency", strconv.Itoa(benchWorkers),
		"--kube-api-qps", strconv.Itoa(benchQPS), "--kube-api-burst", strconv.Itoa(benchQPS),
		"--log-level", "error")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		logFile.Close()
		if t.Failed() {
			t.Logf("operator log (tail):\n%s", fileTail(logFile.Name(), 40))
		}
	})
	return &operatorProcess{cmd: cmd, metrics: "http://" + addr + "/metrics", pprof: "http://" + pprofAddr}
}

func freeLoopbackPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// writes is every write request the operator's client sent, from
// client-go's own counter (rest_client_requests_total), not ours.
func (p *operatorProcess) writes(t *testing.T) int {
	t.Helper()
	resp, err := http.Get(p.metrics)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	total := 0.0
	s := bufio.NewScanner(resp.Body)
	for s.Scan() {
		line := s.Text()
		if !strings.HasPrefix(line, "rest_client_requests_total{") {
			continue
		}
		if strings.Contains(line, `method="GET"`) {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatal(err)
		}
		total += v
	}
	return int(total)
}

// waitQuiet waits until the operator has written nothing for quiet.
func (p *operatorProcess) waitQuiet(t *testing.T, quiet, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	last, lastChange := p.writes(t), time.Now()
	for time.Since(lastChange) < quiet {
		if time.Since(start) > limit {
			t.Fatalf("the operator kept writing for %v after every child existed", limit)
		}
		time.Sleep(time.Second)
		if n := p.writes(t); n != last {
			last, lastChange = n, time.Now()
		}
	}
	return lastChange.Sub(start)
}

// peakRSS is the process's high-water resident set (VmHWM).
func (p *operatorProcess) peakRSS(t *testing.T) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			kb, err := strconv.ParseInt(strings.Fields(line)[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmHWM in /proc status")
	return 0
}
