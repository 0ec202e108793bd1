// Command cozy-operator is Cozy's controller manager: it turns
// TenantCluster objects into Cluster API resources (a Kamaji control
// plane, KubeVirt workers) and their add-ons. See docs/tenants.md.
package main

import (
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"

	"go.uber.org/zap/zapcore"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"cozy.dev/cozy/internal/version"
	"cozy.dev/cozy/operators/tenantcluster"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "cozy-operator:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("cozy-operator", flag.ContinueOnError)
	var (
		leaderElect   = fs.Bool("leader-elect", false, "elect a leader among replicas (a Lease); only the leader reconciles")
		leaderNS      = fs.String("leader-election-namespace", "", "namespace of the leader Lease (default: the pod's namespace)")
		metricsAddr   = fs.String("metrics-bind-address", ":8443", `address of /metrics ("0" turns it off)`)
		metricsSecure = fs.Bool("metrics-secure", true, "serve /metrics over HTTPS to authenticated, authorized clients only")
		probeAddr     = fs.String("health-probe-bind-address", ":8081", `address of /healthz and /readyz ("0" turns them off)`)
		logLevel      = fs.String("log-level", "info", "debug, info or error")
		concurrency   = fs.Int("concurrency", 8, "TenantClusters reconciled at once")
		qps           = fs.Float64("kube-api-qps", 100, "API requests per second the operator may send")
		burst         = fs.Int("kube-api-burst", 200, "burst of API requests above --kube-api-qps")
		kubeconfig    = fs.String("kubeconfig", "", "kubeconfig of the management cluster (default: in-cluster, or $KUBECONFIG)")
		chartSource   = fs.String("addon-charts", "", "HelmRepository NAMESPACE/NAME serving the add-on charts (default cozy-system/cozy-addons)")
		showVersion   = fs.Bool("version", false, "print the version and exit")
	)
	addons := tenantcluster.DefaultAddonConfig()
	fs.StringVar(&addons.ClusterAutoscalerImage, "cluster-autoscaler-image", addons.ClusterAutoscalerImage, "image of the tenants' cluster-autoscaler")
	fs.StringVar(&addons.CCMImage, "kubevirt-ccm-image", addons.CCMImage, "image of the tenants' KubeVirt cloud-controller-manager")
	fs.StringVar(&addons.CSIDriverImage, "kubevirt-csi-driver-image", addons.CSIDriverImage, "image of the tenants' KubeVirt CSI controller")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *showVersion {
		fmt.Println(version.Version, version.Commit)
		return nil
	}
	if *chartSource != "" {
		ns, name, ok := strings.Cut(*chartSource, "/")
		if !ok || ns == "" || name == "" {
			return fmt.Errorf("--addon-charts %q: want NAMESPACE/NAME of a HelmRepository", *chartSource)
		}
		addons.ChartSource.Namespace, addons.ChartSource.Name = ns, name
	}
	level, err := zapcore.ParseLevel(*logLevel)
	if err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	ctrl.SetLogger(zap.New(zap.Level(level)))

	if *kubeconfig != "" {
		os.Setenv("KUBECONFIG", *kubeconfig)
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = float32(*qps), *burst
	cfg.UserAgent = "cozy-operator/" + version.Version

	scheme, err := tenantcluster.Scheme()
	if err != nil {
		return err
	}
	metrics := metricsserver.Options{BindAddress: *metricsAddr, SecureServing: *metricsSecure}
	if *metricsSecure {
		metrics.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  scheme,
		Cache:                   tenantcluster.CacheOptions(),
		Client:                  client.Options{Cache: &client.CacheOptions{Unstructured: true}},
		Metrics:                 metrics,
		HealthProbeBindAddress:  *probeAddr,
		LeaderElection:          *leaderElect,
		LeaderElectionID:        "cozy-operator.tenancy.cozy.dev",
		LeaderElectionNamespace: *leaderNS,
		// The Lease is given up on a clean stop, so a successor does not
		// wait out its duration.
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		return err
	}
	r := &tenantcluster.Reconciler{Recorder: mgr.GetEventRecorder("cozy-operator"), Addons: addons}
	if err := r.SetupWithManager(mgr, *concurrency); err != nil {
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
	ctrl.Log.Info("starting", "version", version.Version, "concurrency", *concurrency)
	return mgr.Start(ctrl.SetupSignalHandler())
}
