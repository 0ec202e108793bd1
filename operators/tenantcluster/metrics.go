package tenantcluster

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Metrics, served on the manager's metrics endpoint beside
// controller-runtime's own (queue depth, controller_runtime_reconcile_*).
var (
	reconcileDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "cozy_operator_tenantcluster_reconcile_duration_seconds",
		Help:    "Time of one TenantCluster reconcile, by result (success, requeue, error).",
		Buckets: []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10},
	}, []string{"result"})
	writes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cozy_operator_writes_total",
		Help: "Write requests the operator sent to the API server, by verb (apply, delete, patch, status) and kind. Flat once every TenantCluster has converged.",
	}, []string{"verb", "kind"})
)

func init() {
	metrics.Registry.MustRegister(reconcileDuration, writes)
}

func observeReconcile(start time.Time, res ctrl.Result, err error) {
	result := "success"
	switch {
	case err != nil:
		result = "error"
	case res.RequeueAfter > 0:
		result = "requeue"
	}
	reconcileDuration.WithLabelValues(result).Observe(time.Since(start).Seconds())
}

func countWrite(verb, kind string) { writes.WithLabelValues(verb, kind).Inc() }
