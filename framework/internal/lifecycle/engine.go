package lifecycle

import (
	"context"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/capacity"
	"github.com/ephemera-csi/ephemera/framework/internal/fill"
	"github.com/ephemera-csi/ephemera/framework/internal/lanes"
	"github.com/ephemera-csi/ephemera/framework/internal/metrics"
	"github.com/ephemera-csi/ephemera/framework/internal/provision"
	"github.com/ephemera-csi/ephemera/framework/internal/reconcile"
	"github.com/ephemera-csi/ephemera/framework/internal/refresh"
	"github.com/ephemera-csi/ephemera/framework/internal/stats"
	"github.com/ephemera-csi/ephemera/framework/internal/storage"
	"github.com/ephemera-csi/ephemera/framework/internal/words"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// Config is what the lifecycle needs of framework.Options, validated and
// with defaults applied; the fields keep Options' names and paths.
type Config struct {
	DriverName string
	// Windows selects the Windows rules of the platform seam (framework's
	// isWindows), the paths and the stats: the logic behind them is tested
	// on Linux by setting it.
	Windows       bool
	Node          NodeConfig
	Backends      map[string]Backend
	Content       ContentProvider // Options.Content; nil: none
	Limits        LimitConfig
	Volumes       VolumeConfig
	GC            GCConfig
	Observability ObservabilityConfig
}

// NodeConfig is Options.Node's part the lifecycle reads.
type NodeConfig struct {
	KubeletRootDir string
}

// LimitConfig is Options.Limits' part the lifecycle reads.
type LimitConfig struct {
	OperationTimeout           time.Duration
	ProvisionTimeout           time.Duration
	MaxVolumesPerNode          int64
	MaxVolumesPerPod           int
	MaxInFlight                int
	MaxInFlightPerBackend      int
	InFlightReservedPerBackend int
	Capacity                   map[string]int64
	StatsWalk                  stats.Limits
}

// VolumeConfig is Options.Volumes' part the lifecycle reads.
type VolumeConfig struct {
	AcceptedAttributes   api.Attributes
	MountOptions         map[string][]string
	Authorizer           Authorizer // nil: none
	ContentTimeout       time.Duration
	ContentBytesInFlight int64
	ContentCapacity      int64 // lanes.NoContentCapacity: no bound
	PodCgroups           fill.PodCgroupConfig
	RefreshInterval      time.Duration
	RefreshConcurrency   int
}

// GCConfig is Options.GC.
type GCConfig struct {
	Interval          time.Duration
	OrphanGracePeriod time.Duration
	DryRun            bool
	MaxOrphanShare    float64
	Pods              PodChecker // nil: no API confirmation
}

// ObservabilityConfig is Options.Observability's part the lifecycle reads.
type ObservabilityConfig struct {
	Logger klog.Logger
	Events EventSink // nil: no events
}

// Engine runs the life of the driver's volumes: the events of lifecycle.go
// and the collaborators they call down into. Package framework builds one per
// Driver and feeds it the CSI calls, the startup, the GC and the refreshes.
type Engine struct {
	cfg     Config
	words   words.Words // the operator's words for Options' fields
	mounter mount.Interface
	store   store.Store // set by SetStore once the state is open
	running *atomic.Bool
	metrics *metrics.Metrics

	storage    *storage.Storage // the backends' calls and the records (internal/storage)
	lanes      *lanes.Lanes     // the volume locks and the bulkheads (internal/lanes, lanes.go)
	capacity   *capacity.Capacity
	fill       *fill.Filler // fsGroup and content (internal/fill)
	refresher  *refresh.Scheduler
	provisions *provision.Provisions // long provisioning (internal/provision, provisioning.go)
	node       *reconcile.Node       // the reconcile's view of the node (internal/reconcile, reconcile.go)
	gc         *reconcile.GC         // the orphan GC (internal/reconcile, reconcile.go)
	stats      *stats.Cache          // walks of directory volumes (internal/stats)
	// charging is how content in memory-backed volumes is paid for, and
	// chargingWhy what decided it (fill.OpenCharging).
	charging    fill.Charging
	chargingWhy string
}

// New builds the engine of a validated cfg. running tells whether the driver
// serves (Refresh needs it).
func New(cfg Config, w words.Words, mounter mount.Interface, running *atomic.Bool) (*Engine, error) {
	d := &Engine{
		cfg:      cfg,
		words:    w,
		mounter:  mounter,
		running:  running,
		capacity: capacity.New(cfg.Limits.MaxVolumesPerNode, cfg.Limits.MaxVolumesPerPod, cfg.Limits.Capacity).WithWords(w),
		stats:    stats.NewCache(cfg.Limits.StatsWalk),
		storage:  storage.New(cfg.Node.KubeletRootDir, cfg.Windows, mounter),
	}
	d.refresher = refresh.New(d.refreshVolume)
	d.provisions = newProvisions(d, &cfg)
	var err error
	if d.lanes, err = lanes.New(laneOptions(&cfg)); err != nil {
		return nil, err
	}
	d.node = newNode(d, &cfg)
	d.gc = newGC(d, &cfg, d.collectOrphan) // the gc event
	pods, charging, why, err := fill.OpenCharging(cfg.Volumes.PodCgroups)
	if err != nil {
		return nil, err
	}
	d.charging, d.chargingWhy = charging, why
	d.fill = fill.New(fill.Config{
		KubeletRootDir: cfg.Node.KubeletRootDir,
		ContentTimeout: cfg.Volumes.ContentTimeout,
		Windows:        cfg.Windows,
		Providers:      cfg.providers(),
		Mounter:        mounter,
		Content:        d.lanes.Content,
		Refresh:        d.lanes.Refresh,
		Held:           d.lanes.Held,
		PodCgroups:     pods,
		PodCgroupWait:  cfg.Volumes.PodCgroups.Wait,
		Refreshed:      d.refreshed,
		SaveHeld:       d.saveHeld,
	})
	return d, nil
}

// SetMetrics gives the engine the driver's metrics (they read the engine's
// usage, so they are made after it). Before Run.
func (d *Engine) SetMetrics(m *metrics.Metrics) {
	d.metrics = m
	d.storage.SetMetrics(m)
	d.provisions.SetMetrics(m)
	d.stats.Observe = func(b stats.Bound) { m.StatsWalked(b.Names()...) }
}

// SetStore sets the state store the engine reads and writes, and returns the
// one it replaces.
func (d *Engine) SetStore(st store.Store) store.Store {
	prev := d.store
	d.store = st
	d.storage.SetStore(st)
	return prev
}

// Store is the state store set by SetStore.
func (d *Engine) Store() store.Store { return d.store }

// Stats is the cache of the walks of directory volumes.
func (d *Engine) Stats() *stats.Cache { return d.stats }

// Mounter is the engine's mounter.
func (d *Engine) Mounter() mount.Interface { return d.mounter }

// providers are the content providers of c: Options.Content and the
// backends, each asked at each use whether it is one (internal/fill).
func (c *Config) providers() fill.Providers {
	backends := make(map[string]fill.Backend, len(c.Backends))
	for name, b := range c.Backends {
		backends[name] = b
	}
	return fill.Providers{Content: c.Content, Backends: backends}
}

// ContentProviders returns the content party of every provider of o,
// bounded or not (fill.Providers.Parties).
func ContentProviders(o *Config) []string { return o.providers().Parties() }

// backendNames returns the names of m, sorted.
func backendNames(m map[string]Backend) []string {
	return slices.Sorted(maps.Keys(m))
}

// Volumes returns the volume count and the bytes in use per backend.
func (d *Engine) Volumes() (int64, map[string]int64) { return d.capacity.Snapshot() }

// Usage is the capacity in use per backend, for the metrics.
func (d *Engine) Usage() map[string]metrics.Usage { return d.capacity.Usage() }

// InFlight returns the volume operations in flight, for the metrics.
func (d *Engine) InFlight() int { return d.inFlight() }

// HeldContent returns the bytes of content held (Options.Volumes.ContentCapacity).
func (d *Engine) HeldContent() int64 { return d.lanes.Held.InUse() }

// Charging is how the content in memory-backed volumes is paid for on this
// node, and what decided it.
func (d *Engine) Charging() (mode fill.Charging, why string) { return d.charging, d.chargingWhy }

// AnyContent reports whether any volume of this driver may have content.
func (d *Engine) AnyContent() bool { return d.fill.Any() }

// StartRefresher enables driver-initiated refreshes until ctx ends;
// StopRefresher waits for them.
func (d *Engine) StartRefresher(ctx context.Context) {
	var interval time.Duration
	if d.fill.Any() {
		interval = d.cfg.Volumes.RefreshInterval
	}
	d.refresher.Start(ctx, interval, d.refreshAll)
}

// StopRefresher waits for the refreshes StartRefresher allowed.
func (d *Engine) StopRefresher() { d.refresher.Stop() }

// HealthChecker is backend's HealthChecker, nil when it has none (for the
// stats and health calls, internal/volstats).
func (d *Engine) HealthChecker(backend string) HealthChecker {
	if b, ok := d.cfg.Backends[backend]; ok {
		return b.HealthChecker()
	}
	return nil
}

// Volume is the backend's view of rec: its declared attributes parsed again.
func (d *Engine) Volume(rec *store.Record) *api.Volume { return d.fromRecord(rec) }
