package pxe

import (
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"cozy.dev/cozy/pxe/dhcp"
	"cozy.dev/cozy/pxe/inventory"
	"cozy.dev/cozy/pxe/lease"
)

// metrics are the server's Prometheus metrics, on its own registry (no
// process-wide state), served at /metrics on the HTTP port.
type metrics struct {
	registry     *prometheus.Registry
	dhcp         *prometheus.CounterVec
	tftpTransfer *prometheus.CounterVec
	tftpBytes    prometheus.Counter
	httpRequests *prometheus.CounterVec
	httpBytes    *prometheus.CounterVec
	journalSync  prometheus.Histogram

	// dhcpCounters caches the counters of dhcp by label values: looking
	// them up by strings for every packet costs more than the count.
	dhcpMu       sync.Mutex
	dhcpCounters map[dhcpLabels]prometheus.Counter
}

type dhcpLabels struct {
	port    int
	mt      dhcpv4.MessageType
	outcome dhcp.Outcome
}

// countDHCP counts one DHCP request.
func (m *metrics) countDHCP(port int, mt dhcpv4.MessageType, outcome dhcp.Outcome) {
	k := dhcpLabels{port, mt, outcome}
	m.dhcpMu.Lock()
	c, ok := m.dhcpCounters[k]
	if !ok {
		c = m.dhcp.WithLabelValues(strconv.Itoa(port), mt.String(), string(outcome))
		m.dhcpCounters[k] = c
	}
	m.dhcpMu.Unlock()
	c.Inc()
}

func newMetrics(inv *inventory.Inventory, leases *lease.Store) *metrics {
	m := &metrics{
		registry:     prometheus.NewRegistry(),
		dhcpCounters: map[dhcpLabels]prometheus.Counter{},
		dhcp: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cozy_pxe_dhcp_packets_total",
			Help: "DHCP requests received, by port, message type and what the server did with them.",
		}, []string{"port", "type", "outcome"}),
		tftpTransfer: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cozy_pxe_tftp_transfers_total",
			Help: "TFTP transfers, by result (sent or failed).",
		}, []string{"result"}),
		tftpBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cozy_pxe_tftp_bytes_total",
			Help: "Bytes of files sent completely over TFTP.",
		}),
		httpRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cozy_pxe_http_requests_total",
			Help: "HTTP requests, by what was asked for (script, asset, boot, config, other) and status code.",
		}, []string{"kind", "code"}),
		httpBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cozy_pxe_http_bytes_total",
			Help: "HTTP response bytes, by what was asked for.",
		}, []string{"kind"}),
		// A slow disk shows here first: every ACK of a batch waits for
		// its write and fdatasync, and a client gives up after a second
		// or so.
		journalSync: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "cozy_pxe_lease_journal_sync_seconds",
			Help:    "Time the ACKs of one batch waited for their leases to be written and synced to the journal (full mode).",
			Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5},
		}),
	}
	m.registry.MustRegister(m.dhcp, m.tftpTransfer, m.tftpBytes, m.httpRequests, m.httpBytes, m.journalSync)
	phases := prometheus.NewDesc("cozy_pxe_machines", "Machines seen, by boot phase.", []string{"phase"}, nil)
	m.registry.MustRegister(collectorFunc{desc: phases, collect: func(ch chan<- prometheus.Metric) {
		count := map[inventory.Phase]int{}
		for _, mc := range inv.List() {
			count[mc.Phase]++
		}
		for phase, n := range count {
			ch <- prometheus.MustNewConstMetric(phases, prometheus.GaugeValue, float64(n), string(phase))
		}
	}})
	if leases != nil {
		m.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "cozy_pxe_dhcp_leases",
			Help: "Leases not yet expired (full mode).",
		}, func() float64 {
			n, now := 0, time.Now()
			for _, l := range leases.Leases() {
				if now.Before(l.Expires) {
					n++
				}
			}
			return float64(n)
		}))
	}
	return m
}

// collectorFunc is a collector computed at scrape time.
type collectorFunc struct {
	desc    *prometheus.Desc
	collect func(chan<- prometheus.Metric)
}

func (c collectorFunc) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }
func (c collectorFunc) Collect(ch chan<- prometheus.Metric) { c.collect(ch) }

// handler serves /metrics and hands every other request to next.
func (m *metrics) handler(next http.Handler) http.Handler {
	metricsHandler := promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			metricsHandler.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// countHTTP records one answered request of the boot HTTP server.
func (m *metrics) countHTTP(path string, status int, bytes int64) {
	kind := "other"
	switch {
	case strings.HasPrefix(path, "/ipxe/"):
		kind = "script"
	case strings.HasPrefix(path, "/assets/"):
		kind = "asset"
	case strings.HasPrefix(path, "/boot/"):
		kind = "boot"
	case strings.HasPrefix(path, "/config/"):
		kind = "config"
	}
	m.httpRequests.WithLabelValues(kind, strconv.Itoa(status)).Inc()
	m.httpBytes.WithLabelValues(kind).Add(float64(bytes))
}
