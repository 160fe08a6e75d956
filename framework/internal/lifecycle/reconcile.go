package lifecycle

import (
	"context"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/reconcile"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// This file wires internal/reconcile: the startup reconcile's view of the
// node (reconcile.Node), whose findings Reconcile fires as reconcile events
// (lifecycle.go), and the orphan GC (reconcile.GC), whose removals are the gc
// event (collectOrphan, which New hands it).

// newNode returns the node view of the reconcile of a validated cfg.
func newNode(d *Engine, cfg *Config) *reconcile.Node {
	return reconcile.NewNode(reconcile.NodeConfig{
		KubeletRoot: cfg.Node.KubeletRootDir,
		Driver:      cfg.DriverName,
		Windows:     cfg.Windows,
		Backends:    backendNames(cfg.Backends),
		Logger:      cfg.Observability.Logger,
		Reconciled:  func(result string) { d.metrics.Reconciled(result) },
	}, d.mounter, nodeStorage{d})
}

// nodeStorage is the node view's reconcile.Storage: d.storage's calls over
// the backends of d's Config, by name.
type nodeStorage struct{ d *Engine }

// Find is storage.Storage.Find of the named backend.
func (s nodeStorage) Find(ctx context.Context, backend string, v *api.Volume) (api.Source, bool, error) {
	return s.d.storage.Find(ctx, s.d.cfg.Backends[backend], v)
}

// List is storage.Storage.List of the named backend, when it is a Lister.
func (s nodeStorage) List(ctx context.Context, backend string) ([]string, bool, error) {
	lister := s.d.cfg.Backends[backend].Lister()
	if lister == nil {
		return nil, false, nil
	}
	ids, err := s.d.storage.List(ctx, backend, lister)
	return ids, true, err
}

// Stamper is the named backend's Stamper.
func (s nodeStorage) Stamper(backend string) reconcile.Stamper {
	return s.d.cfg.Backends[backend].Stamper()
}

// StoreID is storage.Storage.StoreID.
func (s nodeStorage) StoreID() string { return s.d.storage.StoreID() }

// newGC returns the orphan GC of a validated cfg; remove is the gc event.
func newGC(d *Engine, cfg *Config, remove func(context.Context, *store.Record) error) *reconcile.GC {
	return reconcile.NewGC(reconcile.GCConfig{
		KubeletRoot:       cfg.Node.KubeletRootDir,
		Interval:          cfg.GC.Interval,
		OrphanGracePeriod: cfg.GC.OrphanGracePeriod,
		OperationTimeout:  cfg.Limits.OperationTimeout,
		DryRun:            cfg.GC.DryRun,
		MaxOrphanShare:    cfg.GC.MaxOrphanShare,
		Pods:              cfg.GC.Pods,
		Logger:            cfg.Observability.Logger,
		Words:             d.words,
		List:              func(ctx context.Context) ([]*store.Record, error) { return d.store.List(ctx) },
		Remove:            remove,
		Observe:           d.gcObserved,
		Forget:            d.stats.Forget,
		Locks:             &d.lanes.Locks,
		Teardowns:         d.lanes.Teardowns,
	})
}

// RunGC runs the orphan GC at startup and every GCConfig.Interval until ctx
// ends.
func (d *Engine) RunGC(ctx context.Context) { d.gc.Run(ctx) }

// CheckPodsDir fails unless the kubelet's pods directory exists and is the
// directory the orphan GC saw first (reconcile.GC.CheckPodsDir); the first
// call records it.
func (d *Engine) CheckPodsDir(podsDir string) error { return d.gc.CheckPodsDir(podsDir) }
