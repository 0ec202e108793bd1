// Command cozy-operator is Cozy's controller manager: it turns
// TenantCluster objects into Cluster API resources (a Kamaji control
// plane, KubeVirt workers) and their add-ons. See docs/tenants.md.
package main

import (
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"

	"go.uber.org/zap/zapcore"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"cozy.dev/cozy/internal/imageref"
	"cozy.dev/cozy/internal/version"
	"cozy.dev/cozy/operators/tenantcluster"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "cozy-operator:", err)
		os.Exit(1)
	}
}

// options are the operator's flags, parsed and checked.
type options struct {
	leaderElect   bool
	leaderNS      string
	metricsAddr   string
	metricsSecure bool
	probeAddr     string
	pprofAddr     string
	logLevel      zapcore.Level
	concurrency   int
	qps           float64
	burst         int
	kubeconfig    string
	showVersion   bool
	addons        tenantcluster.AddonConfig
	workerImages  tenantcluster.WorkerImages
	permittedGPUs []string
	loadBalancer  bool
}

// parse reads the flags (the chart's Deployment passes them; a test
// keeps the two in step).
func parse(args []string) (*options, error) {
	o := &options{addons: tenantcluster.DefaultAddonConfig()}
	fs := flag.NewFlagSet("cozy-operator", flag.ContinueOnError)
	fs.BoolVar(&o.leaderElect, "leader-elect", false, "elect a leader among replicas (a Lease); only the leader reconciles")
	fs.StringVar(&o.leaderNS, "leader-election-namespace", "", "namespace of the leader Lease (default: the pod's namespace)")
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", ":8443", `address of /metrics ("0" turns it off)`)
	fs.BoolVar(&o.metricsSecure, "metrics-secure", true, "serve /metrics over HTTPS to authenticated, authorized clients only")
	fs.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", `address of /healthz and /readyz ("0" turns them off)`)
	fs.StringVar(&o.pprofAddr, "pprof-bind-address", "", `address of Go's /debug/pprof, for profiling (default off; never expose it)`)
	logLevel := fs.String("log-level", "info", "debug, info or error")
	fs.IntVar(&o.concurrency, "concurrency", 8, "TenantClusters reconciled at once")
	fs.Float64Var(&o.qps, "kube-api-qps", 100, "API requests per second the operator may send")
	fs.IntVar(&o.burst, "kube-api-burst", 200, "burst of API requests above --kube-api-qps")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the management cluster (default: in-cluster, or $KUBECONFIG)")
	fs.Func("addon-chart", "where a tenant add-on's chart comes from, ADDON=KIND/NAMESPACE/NAME/CHART[@VERSION] (repeatable; e.g. cilium=HelmRepository/cozy-addons/cilium/cilium@1.18.4)", func(s string) error {
		addon, ref, err := tenantcluster.ParseChartRef(s)
		if err == nil {
			o.addons.Charts[addon] = ref
		}
		return err
	})
	fs.BoolVar(&o.showVersion, "version", false, "print the version and exit")
	fs.StringVar(&o.addons.ClusterAutoscalerImage, "cluster-autoscaler-image", o.addons.ClusterAutoscalerImage, "image of the tenants' cluster-autoscaler")
	fs.StringVar(&o.addons.CCMImage, "kubevirt-ccm-image", o.addons.CCMImage, "image of the tenants' KubeVirt cloud-controller-manager")
	fs.StringVar(&o.addons.CSIDriverImage, "kubevirt-csi-driver-image", o.addons.CSIDriverImage, "image of the tenants' KubeVirt CSI controller")
	fs.StringVar(&o.workerImages.Repository, "worker-image-repository", "", "where node groups that name no image find Cozy's worker disk, HOST[:PORT]/PATH (tagged with the Kubernetes version); empty: every node group must name its image")
	fs.Func("permitted-gpu", "a GPU device name the platform's KubeVirt permits (its permittedHostDevices resourceName; repeatable); node groups asking for another wait", func(s string) error {
		if s == "" {
			return fmt.Errorf("empty device name")
		}
		o.permittedGPUs = append(o.permittedGPUs, s)
		return nil
	})
	fs.BoolVar(&o.loadBalancer, "load-balancer", true, "Services of type LoadBalancer get an address in this cluster (false: the platform has no load-balancer pool, and TenantClusters exposed so say why they wait)")
	fs.BoolVar(&o.workerImages.Insecure, "worker-image-insecure", false, "the worker image registry speaks plain HTTP")
	fs.StringVar(&o.workerImages.Mirror, "worker-registry-mirror", "", "the rack's registry mirror, http(s)://HOST[:PORT]: workers pull docker.io, ghcr.io, quay.io and registry.k8s.io images through it (HOST/v2/REGISTRY/...), and the operator looks there for the images of each tenant's control plane; empty: from those registries")
	fs.Func("worker-registry-mirror-for", "HOST=URL[,URL...]: workers pull HOST's images from these mirror endpoints, in order (the rack's registries.mirrors; HOST * for every other registry; repeatable)", func(s string) error {
		host, list, ok := strings.Cut(s, "=")
		if !ok || list == "" {
			return fmt.Errorf("want HOST=URL[,URL...], got %q", s)
		}
		if problems := imageref.CheckRegistryHost(host); len(problems) > 0 {
			return errors.New(strings.Join(problems, "; "))
		}
		if _, dup := o.workerImages.Mirrors[host]; dup {
			return fmt.Errorf("%s is given twice", host)
		}
		endpoints := strings.Split(list, ",")
		for _, ep := range endpoints {
			if !imageref.IsEndpointURL(ep) {
				return fmt.Errorf("%s: %q is not an http(s) URL with a host", host, ep)
			}
		}
		if o.workerImages.Mirrors == nil {
			o.workerImages.Mirrors = map[string][]string{}
		}
		o.workerImages.Mirrors[host] = endpoints
		return nil
	})
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if r := o.workerImages.Repository; r != "" {
		if _, err := name.NewRepository(r); err != nil || !strings.Contains(r, "/") {
			return nil, fmt.Errorf("--worker-image-repository %q: want HOST[:PORT]/PATH without a tag", r)
		}
	}
	if m := o.workerImages.Mirror; m != "" {
		if !imageref.IsMirrorURL(m) {
			return nil, fmt.Errorf("--worker-registry-mirror %q: want http(s)://HOST[:PORT], the registry's base URL", m)
		}
		o.workerImages.Mirror = strings.TrimSuffix(m, "/")
		for _, h := range imageref.MirrorHosts {
			if _, ok := o.workerImages.Mirrors[h]; ok {
				return nil, fmt.Errorf("--worker-registry-mirror-for %s: --worker-registry-mirror covers %s already; keep one of the two", h, h)
			}
		}
	}
	if o.concurrency < 1 {
		return nil, fmt.Errorf("--concurrency %d: want at least 1", o.concurrency)
	}
	var err error
	if o.logLevel, err = zapcore.ParseLevel(*logLevel); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	return o, nil
}

func run(args []string) error {
	o, err := parse(args)
	if err != nil {
		return err
	}
	if o.showVersion {
		fmt.Println(version.Version, version.Commit)
		return nil
	}
	ctrl.SetLogger(zap.New(zap.Level(o.logLevel)))

	if o.kubeconfig != "" {
		os.Setenv("KUBECONFIG", o.kubeconfig)
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = float32(o.qps), o.burst
	cfg.UserAgent = "cozy-operator/" + version.Version

	opts, err := tenantcluster.ManagerOptions()
	if err != nil {
		return err
	}
	opts.Metrics = metricsserver.Options{BindAddress: o.metricsAddr, SecureServing: o.metricsSecure}
	if o.metricsSecure {
		opts.Metrics.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	opts.HealthProbeBindAddress, opts.PprofBindAddress = o.probeAddr, o.pprofAddr
	opts.LeaderElection, opts.LeaderElectionID, opts.LeaderElectionNamespace = o.leaderElect, "cozy-operator.tenancy.cozy.dev", o.leaderNS
	// The Lease is given up on a clean stop, so a successor does not wait
	// out its duration.
	opts.LeaderElectionReleaseOnCancel = true
	mgr, err := ctrl.NewManager(cfg, opts)
	if err != nil {
		return err
	}
	r := &tenantcluster.Reconciler{Recorder: mgr.GetEventRecorder("cozy-operator"), Addons: o.addons, WorkerImages: o.workerImages, PermittedGPUs: o.permittedGPUs, NoLoadBalancer: !o.loadBalancer}
	if err := r.SetupWithManager(mgr, o.concurrency); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("cache", func(req *http.Request) error {
		if !mgr.GetCache().WaitForCacheSync(req.Context()) {
			return fmt.Errorf("cache not synced")
		}
		return nil
	}); err != nil {
		return err
	}
	ctrl.Log.Info("starting", "version", version.Version, "concurrency", o.concurrency)
	return mgr.Start(ctrl.SetupSignalHandler())
}
