package metrics

import (
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc/codes"
)

// Metric names. Every metric of the framework is listed here and in
// docs/design.md ("Observability").
const (
	RPCDuration = "ephemera_rpc_duration_seconds"
	// CSIOperations is the kubernetes-csi standard operation histogram of a
	// CSI plugin, as csi-lib-utils' metrics manager names and labels it
	// (subsystem csi_plugin), so that existing CSI dashboards work.
	CSIOperations   = "csi_plugin_operations_seconds"
	BackendDuration = "ephemera_backend_operation_duration_seconds"
	Volumes         = "ephemera_volumes"
	VolumeBytes     = "ephemera_volume_bytes"
	CapacityBytes   = "ephemera_capacity_bytes"
	Reconcile       = "ephemera_reconcile_total"
	StateRecoveries = "ephemera_state_recoveries_total"
	GC              = "ephemera_gc_total"
	Refresh         = "ephemera_refresh_total"
	InflightOps     = "ephemera_inflight_operations"
	BuildInfo       = "ephemera_build_info"
	CSIDriverBad    = "ephemera_csidriver_misconfigured"
	StatsWalks      = "ephemera_stats_walks_total"
	ContentHeld     = "ephemera_content_held_bytes"
	ContentCapacity = "ephemera_content_capacity_bytes"
	ContentCharging = "ephemera_content_charging"
	// Provisioning and ProvisionsOutlived follow the creates of long
	// provisioning backends (framework.LongProvisioner).
	Provisioning       = "ephemera_provisioning_volumes"
	ProvisionsOutlived = "ephemera_provisions_outlived_call_total"
)

const (
	labelMethod  = "method"
	labelCode    = "code"
	labelBackend = "backend"
	labelOp      = "op"
	labelResult  = "result"
	labelDriver  = "driver"
	labelVersion = "version"
	labelCheck   = "check"
	labelMode    = "mode"

	// csi-lib-utils' labels of CSIOperations.
	labelCSIDriver = "driver_name"
	labelCSIMethod = "method_name"
	labelCSICode   = "grpc_status_code"

	maxGRPCCode  = codes.Unauthenticated
	numGRPCCodes = int(maxGRPCCode) + 1
)

// Values of the op label of BackendDuration.
const (
	OpCreate = "create" // Backend.Create: first publish, repair of a published volume
	OpDelete = "delete" // Backend.Delete: unpublish, rollback, reconcile, orphan GC
	OpList   = "list"   // Lister.List: startup reconcile
)

// Values of the result labels.
const (
	// ResultOK and ResultError label BackendDuration by outcome.
	ResultOK    = "ok"
	ResultError = "error"

	// ReconcileRolledBack counts records of operations cut short by a crash
	// that the startup reconcile rolled back; ReconcileOrphanDeleted counts
	// backend storage without a record that it deleted; ReconcileFailed counts
	// volumes (or backend inventories) it could not clean and left for later.
	ReconcileRolledBack    = "rolled_back"
	ReconcileOrphanDeleted = "orphan_deleted"
	ReconcileFailed        = "failed"
	// ReconcileAdopted counts volumes found on the node without a record
	// (mounted at their target, or storage whose pod still has the volume) that
	// were adopted with a rebuilt record; ReconcileUnclaimed counts storage
	// without a record or a pod that was kept as unclaimed instead of deleted;
	// ReconcileQuarantined counts records of the state file that could not be
	// read and were rebuilt from the node.
	ReconcileAdopted     = "adopted"
	ReconcileUnclaimed   = "unclaimed"
	ReconcileQuarantined = "quarantined"

	// GCRemoved and GCFailed are the GC results always exported (at 0 until
	// they happen); GC accepts the GC's other results too.
	GCRemoved = "removed"
	GCFailed  = "failed"

	// RefreshOK and RefreshFailed label content refreshes of live volumes.
	RefreshOK     = "ok"
	RefreshFailed = "failed"

	// StatsWalkComplete counts walks of directory volumes that counted
	// everything; the others count walks stopped short by a bound of
	// Options.Limits.StatsWalk (a walk can reach several), or canceled (its callers
	// gone, the volume unpublished).
	StatsWalkComplete   = "complete"
	StatsWalkMaxEntries = "max_entries"
	StatsWalkMaxDepth   = "max_depth"
	StatsWalkTimeout    = "timeout"
	StatsWalkCanceled   = "canceled"
	// StatsWalkMaxLinkedFiles: the walk met more files with several links
	// than it may remember (StatsWalkLimits.MaxLinkedFiles).
	StatsWalkMaxLinkedFiles = "max_linked_files"
)

// durationBuckets covers a fast tmpfs publish (well under a millisecond) up to
// the kubelet's 2 minute deadline (a slow mkfs, an unresponsive backend).
var durationBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}

// csiBuckets are csi-lib-utils' buckets of CSIOperations (kept equal by
// TestCSIOperationsMatchCSILibUtils).
var csiBuckets = []float64{.1, .25, .5, 1, 2.5, 5, 10, 15, 25, 50, 120, 300, 600}

// Usage is what one backend's volumes hold on the node.
type Usage struct {
	Volumes int64
	Bytes   int64
}

// Config describes the driver the metrics belong to.
type Config struct {
	// DriverName and Version label BuildInfo.
	DriverName string
	Version    string
	// Backends are exported in Volumes and VolumeBytes even while they hold
	// nothing.
	Backends []string
	// Capacity are the budgets of the backends that have one, exported as
	// CapacityBytes (compare with VolumeBytes).
	Capacity map[string]int64
	// Methods are the full gRPC method names ("/csi.v1.Node/NodePublishVolume")
	// served; their series are looked up without allocating. Others still work.
	Methods []string
	// Usage reports the volumes and bytes per backend. It is called at every
	// scrape, so the gauges are always the driver's own accounting. Nil: no
	// volume gauges.
	Usage func() map[string]Usage
	// Inflight reports the volume operations in progress; called at every
	// scrape. Nil: no inflight gauge.
	Inflight func() int
	// ContentHeld reports the memory the content in memory-backed volumes
	// takes (exported as ContentHeld), against ContentCapacity (exported
	// when positive). Nil: neither.
	ContentHeld     func() int64
	ContentCapacity int64
	// ContentCharging is who pays for the content in memory-backed
	// volumes (fill.Charging: "pod-cgroup" or "volume-size"), exported
	// with ContentHeld as ContentCharging{mode}.
	ContentCharging string
}

// Metrics are one driver's Prometheus metrics in their own registry (never the
// global default registry, so several drivers in one process do not collide).
// All methods are safe for concurrent use.
type Metrics struct {
	reg *prometheus.Registry

	rpcDuration     *prometheus.HistogramVec
	csiOperations   *prometheus.HistogramVec
	driverName      string
	backendDuration *prometheus.HistogramVec
	reconcile       *prometheus.CounterVec
	stateRecoveries prometheus.Counter
	gc              *prometheus.CounterVec
	refresh         *prometheus.CounterVec
	csiDriver       *prometheus.GaugeVec
	statsWalks      *prometheus.CounterVec
	provisioning    *prometheus.GaugeVec
	outlived        *prometheus.CounterVec

	methods map[string]*methodSeries // read-only after New
}

// methodSeries caches the series of one gRPC method per status code, so that
// the hot RPCs (NodeGetCapabilities, Probe) record without allocating.
type methodSeries struct {
	name   string
	byCode [numGRPCCodes]atomic.Pointer[rpcSeries]
}

type rpcSeries struct {
	duration prometheus.Observer
	csi      prometheus.Observer
}

// New creates the metrics of one driver and registers them, with the Go
// runtime and process collectors, in a new registry.
func New(c Config) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		rpcDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    RPCDuration,
			Help:    "Duration of CSI gRPC calls, by method and gRPC status code.",
			Buckets: durationBuckets,
		}, []string{labelMethod, labelCode}),
		csiOperations: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    CSIOperations,
			Help:    "Container Storage Interface operation duration with gRPC error code status total",
			Buckets: csiBuckets,
		}, []string{labelCSIDriver, labelCSIMethod, labelCSICode}),
		driverName: c.DriverName,
		backendDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    BackendDuration,
			Help:    "Duration of backend operations (create, delete, list), by backend, operation and result (ok, error).",
			Buckets: durationBuckets,
		}, []string{labelBackend, labelOp, labelResult}),
		reconcile: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: Reconcile,
			Help: "Volumes the startup reconcile acted on: rolled_back (interrupted operation undone), adopted (found on the node without a record, rebuilt), unclaimed (storage without a record or a pod, kept), quarantined (record unreadable, rebuilt from the node), orphan_deleted (storage proven a leftover), failed (left for later).",
		}, []string{labelResult}),
		stateRecoveries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: StateRecoveries,
			Help: "Damaged state files moved aside and rebuilt from the node at startup.",
		}),
		gc: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: GC,
			Help: "Orphan GC outcomes per volume and pass, by result (removed, failed, ...).",
		}, []string{labelResult}),
		refresh: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: Refresh,
			Help: "Content refreshes of live volumes (republish, Refresh, RefreshAll, RefreshInterval, retries), by result (ok, failed).",
		}, []string{labelResult}),
		csiDriver: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: CSIDriverBad,
			Help: "1 when the startup check found the driver's CSIDriver object failing a check (exists, volumeLifecycleModes, podInfoOnMount, fsGroupPolicy, attachRequired), 0 when it passed; absent without API access.",
		}, []string{labelCheck}),
		statsWalks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: StatsWalks,
			Help: "Walks of directory volumes by NodeGetVolumeStats, by result: complete, or the bound that stopped one short with a lower bound of the usage (max_entries, max_depth, timeout; a walk can reach several), or canceled.",
		}, []string{labelResult}),
		provisioning: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: Provisioning,
			Help: "Volumes whose Create runs in the background (long provisioning backends: past the kubelet's call, bounded by --provision-timeout), by backend.",
		}, []string{labelBackend}),
		outlived: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: ProvisionsOutlived,
			Help: "Creates of long provisioning backends that outlived the NodePublishVolume call that started them (a retry attached to them), by backend.",
		}, []string{labelBackend}),
		methods: map[string]*methodSeries{},
	}
	for _, full := range c.Methods {
		m.methods[full] = &methodSeries{name: shortMethod(full)}
	}
	for _, r := range []string{ReconcileRolledBack, ReconcileOrphanDeleted, ReconcileFailed,
		ReconcileAdopted, ReconcileUnclaimed, ReconcileQuarantined} {
		m.reconcile.WithLabelValues(r)
	}
	for _, r := range []string{GCRemoved, GCFailed} {
		m.gc.WithLabelValues(r)
	}
	for _, r := range []string{RefreshOK, RefreshFailed} {
		m.refresh.WithLabelValues(r)
	}
	for _, r := range []string{StatsWalkComplete, StatsWalkMaxEntries, StatsWalkMaxDepth, StatsWalkTimeout, StatsWalkCanceled, StatsWalkMaxLinkedFiles} {
		m.statsWalks.WithLabelValues(r)
	}
	buildInfo := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: BuildInfo,
		Help: "Always 1; labels name the driver and its version.",
	}, []string{labelDriver, labelVersion})
	buildInfo.WithLabelValues(c.DriverName, c.Version).Set(1)

	m.reg.MustRegister(
		m.rpcDuration, m.csiOperations, m.backendDuration, m.reconcile, m.stateRecoveries, m.gc, m.refresh, m.csiDriver, m.statsWalks, m.provisioning, m.outlived, buildInfo,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	if c.Usage != nil {
		m.reg.MustRegister(newUsageCollector(c.Backends, c.Capacity, c.Usage))
	}
	if c.Inflight != nil {
		inflight := c.Inflight
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: InflightOps,
			Help: "NodePublishVolume and NodeUnpublishVolume operations in progress (admitted under MaxInFlight).",
		}, func() float64 { return float64(inflight()) }))
	}
	if c.ContentHeld != nil {
		held := c.ContentHeld
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: ContentHeld,
			Help: "Node memory the content the driver wrote into memory-backed (tmpfs) volumes may take while they exist, charged by the kernel to the driver's memory cgroup: where no pod cgroup pays for it (ephemera_content_charging{mode=\"volume-size\"}), each such volume at its tmpfs's size (Options.Volumes.ContentCapacity, --content-capacity).",
		}, func() float64 { return float64(held()) }))
		if c.ContentCapacity > 0 {
			capacity := prometheus.NewGauge(prometheus.GaugeOpts{
				Name: ContentCapacity,
				Help: "The content capacity (--content-capacity): alert on ephemera_content_held_bytes / ephemera_content_capacity_bytes.",
			})
			capacity.Set(float64(c.ContentCapacity))
			m.reg.MustRegister(capacity)
		}
		if c.ContentCharging != "" {
			charging := prometheus.NewGaugeVec(prometheus.GaugeOpts{
				Name: ContentCharging,
				Help: "Always 1; mode says who pays for the content the driver writes into memory-backed volumes: pod-cgroup (each pod, from a writer in its memory cgroup; not counted in ephemera_content_held_bytes) or volume-size (the driver: each volume counted at its tmpfs's size in ephemera_content_held_bytes).",
			}, []string{labelMode})
			charging.WithLabelValues(c.ContentCharging).Set(1)
			m.reg.MustRegister(charging)
		}
	}
	return m
}

// Registry is the driver's registry. Drivers may register their own metrics in
// it; they are then served with the framework's.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in the Prometheus exposition formats.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		ErrorHandling:       promhttp.ContinueOnError,
		MaxRequestsInFlight: 4,
		Timeout:             10 * time.Second,
	})
}

// ObserveRPC records one gRPC call's duration by method and code, in
// RPCDuration (whose method label is the last element of fullMethod) and in
// CSIOperations (whose method_name is fullMethod, "/csi.v1.Node/NodePublishVolume",
// as csi-lib-utils records it).
func (m *Metrics) ObserveRPC(fullMethod string, code codes.Code, d time.Duration) {
	s := m.rpcSeries(fullMethod, code)
	s.duration.Observe(d.Seconds())
	s.csi.Observe(d.Seconds())
}

func (m *Metrics) rpcSeries(fullMethod string, code codes.Code) *rpcSeries {
	ms := m.methods[fullMethod]
	if ms == nil || code > maxGRPCCode {
		return m.newRPCSeries(fullMethod, code)
	}
	if s := ms.byCode[code].Load(); s != nil {
		return s
	}
	// Two callers may race here; both get the same underlying series.
	s := m.newRPCSeries(fullMethod, code)
	ms.byCode[code].Store(s)
	return s
}

func (m *Metrics) newRPCSeries(fullMethod string, code codes.Code) *rpcSeries {
	return &rpcSeries{
		duration: m.rpcDuration.WithLabelValues(shortMethod(fullMethod), code.String()),
		csi:      m.csiOperations.WithLabelValues(m.driverName, fullMethod, code.String()),
	}
}

func shortMethod(full string) string {
	return full[strings.LastIndex(full, "/")+1:]
}

// ObserveBackend records one backend operation (OpCreate, OpDelete, OpList).
func (m *Metrics) ObserveBackend(backend, op string, err error, d time.Duration) {
	result := ResultOK
	if err != nil {
		result = ResultError
	}
	m.backendDuration.WithLabelValues(backend, op, result).Observe(d.Seconds())
}

// Reconciled counts one outcome of the startup reconcile (ReconcileRolledBack,
// ReconcileOrphanDeleted, ReconcileFailed).
func (m *Metrics) Reconciled(result string) { m.reconcile.WithLabelValues(result).Inc() }

// CSIDriverChecked sets the result of one check of the CSIDriver object.
func (m *Metrics) CSIDriverChecked(check string, failed bool) {
	v := 0.0
	if failed {
		v = 1
	}
	m.csiDriver.WithLabelValues(check).Set(v)
}

// StateRecovered counts a damaged state file moved aside and rebuilt.
func (m *Metrics) StateRecovered() { m.stateRecoveries.Inc() }

// GC counts one outcome of the orphan GC for one volume (GCRemoved, GCFailed,
// or another of the GC's results). Results are a small fixed set chosen by the
// framework, never a volume or pod name.
func (m *Metrics) GC(result string) { m.gc.WithLabelValues(result).Inc() }

// Refreshed counts one content refresh of a live volume by its outcome.
func (m *Metrics) Refreshed(err error) {
	if err != nil {
		m.refresh.WithLabelValues(RefreshFailed).Inc()
		return
	}
	m.refresh.WithLabelValues(RefreshOK).Inc()
}

// StatsWalked counts one walk of a directory volume under each of results
// (StatsWalkComplete, or the bounds it reached).
func (m *Metrics) StatsWalked(results ...string) {
	for _, r := range results {
		m.statsWalks.WithLabelValues(r).Inc()
	}
}

// usageCollector reports the volume gauges from the driver's own accounting at
// scrape time, so they can never drift from it.
type usageCollector struct {
	backends []string
	capacity map[string]int64
	usage    func() map[string]Usage
	volumes  *prometheus.Desc
	bytes    *prometheus.Desc
	budget   *prometheus.Desc
}

func newUsageCollector(backends []string, capacity map[string]int64, usage func() map[string]Usage) *usageCollector {
	return &usageCollector{
		backends: backends,
		capacity: capacity,
		usage:    usage,
		budget: prometheus.NewDesc(CapacityBytes,
			"The budget of a backend's volume sizes on this node (Options.Limits.Capacity, --capacity), for backends that have one; alert on ephemera_volume_bytes / ephemera_capacity_bytes.",
			[]string{labelBackend}, nil),
		volumes: prometheus.NewDesc(Volumes,
			"Volumes on this node (published, or being published or torn down), by backend.",
			[]string{labelBackend}, nil),
		bytes: prometheus.NewDesc(VolumeBytes,
			"Sum of the sizes of the volumes on this node, by backend (what Options.Limits.Capacity budgets).",
			[]string{labelBackend}, nil),
	}
}

func (c *usageCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.volumes
	ch <- c.bytes
	ch <- c.budget
}

func (c *usageCollector) Collect(ch chan<- prometheus.Metric) {
	u := c.usage()
	emit := func(backend string, n Usage) {
		ch <- prometheus.MustNewConstMetric(c.volumes, prometheus.GaugeValue, float64(n.Volumes), backend)
		ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.GaugeValue, float64(n.Bytes), backend)
	}
	for _, b := range c.backends {
		emit(b, u[b])
	}
	for b, n := range c.capacity {
		ch <- prometheus.MustNewConstMetric(c.budget, prometheus.GaugeValue, float64(n), b)
	}
	// Volumes of a backend the driver no longer has (kept for cleanup).
	for b, n := range u {
		if !slices.Contains(c.backends, b) {
			emit(b, n)
		}
	}
}

// Provisioning adds delta (1 at the start of a background Create, -1 when it
// returned) to backend's Provisioning gauge.
func (m *Metrics) Provisioning(backend string, delta float64) {
	m.provisioning.WithLabelValues(backend).Add(delta)
}

// ProvisionOutlived counts a Create of backend that outlived its call.
func (m *Metrics) ProvisionOutlived(backend string) { m.outlived.WithLabelValues(backend).Inc() }
