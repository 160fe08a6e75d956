package reconcile

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/framework/internal/admission"
	"github.com/ephemera-csi/ephemera/framework/internal/logkeys"
	"github.com/ephemera-csi/ephemera/framework/internal/metrics"
	"github.com/ephemera-csi/ephemera/framework/internal/words"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// gcConcurrency bounds the orphan GC's removals in flight, per backend.
const gcConcurrency = 8

// stopWait bounds how long Run, once its context ended, waits for the
// removals still running (cancelled with it) to return.
const stopWait = 10 * time.Second

// Result labels what one GC pass did with one volume (the result label of
// ephemera_gc_total).
type Result string

// The results of a pass.
const (
	Removed     Result = metrics.GCRemoved // torn down
	WouldRemove Result = "dry_run"         // would have been torn down
	Pending     Result = "pending"         // orphaned, within the grace period
	PodExists   Result = "pod_exists"      // pod dir gone but the API server has the pod
	Failed      Result = metrics.GCFailed  // teardown or check failed; retried next pass
	Refused     Result = "refused"         // the pass looked unsafe (see Collect)
	Busy        Result = "busy"            // due, but its backend's removals of an earlier pass still run; next pass
)

// PodChecker asks the API server whether a pod exists (framework.PodChecker).
type PodChecker interface {
	PodExists(ctx context.Context, uid string) (bool, error)
}

// Locks are the volume locks (lanes.Lanes.Locks).
type Locks interface {
	TryAcquire(id string) bool
	Release(id string)
}

// Teardowns are the teardown lanes by backend (lanes.Lanes.Teardowns).
type Teardowns interface {
	Acquire(ctx context.Context, party string, n int64) (*admission.Grant, error)
}

// GCConfig configures a GC: Options.GC, and what the GC reads and does to
// the driver's volumes. Every field is set.
type GCConfig struct {
	// KubeletRoot is the kubelet root directory, whose pods directory the
	// GC watches.
	KubeletRoot       string
	Interval          time.Duration
	OrphanGracePeriod time.Duration
	// OperationTimeout is Options.Limits.OperationTimeout: each Remove's
	// context ends after it, as an unpublish's does.
	OperationTimeout time.Duration
	DryRun           bool
	MaxOrphanShare   float64
	Pods             PodChecker // nil: no API confirmation
	// Logger is Options.Observability.Logger; the GC logs as "gc".
	Logger klog.Logger
	// Words are the operator's words for Options' fields.
	Words words.Words

	// List returns every record of the state store.
	List func(ctx context.Context) ([]*store.Record, error)
	// Remove tears down rec, whose pod is gone, while the GC holds its
	// lock and a teardown slot of its backend: the lifecycle's gc event.
	Remove func(ctx context.Context, rec *store.Record) error
	// Observe reports what a pass did with rec, once per volume and pass
	// (rec is nil for a pass refused as a whole).
	Observe func(rec *store.Record, result string)
	// Forget drops the cached stats of a removed volume.
	Forget    func(id string)
	Locks     Locks
	Teardowns Teardowns
}

// GC is the orphan GC (docs/design.md, "Orphan GC"): since when each
// volume has looked orphaned, the kubelet pods directory it first saw, the
// backends whose removals run, its passes (Collect) and its loop (Run).
type GC struct {
	cfg     GCConfig
	orphans orphans

	mu       sync.Mutex
	removing map[string]bool   // backends whose removals of a pass still run
	ended    map[string]uint64 // when each backend's removals last ended, in ends
	ends     uint64            // removals of a backend that ended, ever
	running  sync.WaitGroup    // every backend's removals
}

// NewGC returns the GC of a validated cfg.
func NewGC(cfg GCConfig) *GC {
	return &GC{cfg: cfg, removing: map[string]bool{}, ended: map[string]uint64{}}
}

// orphans remembers since when each volume has looked orphaned, and the
// kubelet pods directory the GC first saw.
type orphans struct {
	mu      sync.Mutex
	since   map[string]time.Time
	podsDir os.FileInfo
}

// Collect runs one pass of the orphan GC: a volume whose pod directory
// <kubelet-root>/pods/<uid> is gone belongs to a pod the kubelet will never
// unpublish (deleted while the node or the driver was down, or its directory
// removed by hand). Once Options.GC.OrphanGracePeriod has passed since a pass
// first saw it that way (a time, whatever the passes in between) — and, with
// Options.GC.Pods, once the API server confirms the pod is gone — it is torn
// down like an unpublish (GCConfig.Remove). Volumes busy with another
// operation are skipped until the next pass.
//
// No pass waits on one backend. Collect decides and returns: the removals it
// starts run in a goroutine per backend (Pass.Wait waits for them), each
// Remove bounded by GCConfig.OperationTimeout. A backend whose removals of an
// earlier pass still run (a Delete that hangs) is skipped, its due volumes
// counted Busy, while the other backends' orphans are removed on time.
//
// The GC distrusts a sudden empty world. It acts only on the pods directory it
// first saw (same device and inode: a directory replaced, or a mount over it
// lazily unmounted, stops it), and a pass in which more than
// Options.GC.MaxOrphanShare of the volumes look orphaned at once removes only
// volumes the API server confirms gone (none without Options.GC.Pods). Storage
// still mounted anywhere is never deleted (the lifecycle's teardown).
func (g *GC) Collect(ctx context.Context, now time.Time) (*Pass, error) {
	log := g.cfg.Logger.WithName("gc")
	podsDir := filepath.Join(g.cfg.KubeletRoot, "pods")
	if err := g.CheckPodsDir(podsDir); err != nil {
		g.cfg.Observe(nil, string(Refused))
		return nil, err
	}
	g.mu.Lock()
	listed := g.ends
	g.mu.Unlock()
	recs, err := g.cfg.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("orphan GC: listing volumes: %w", err)
	}
	p := &Pass{g: g, log: log, results: map[string]Result{}, listed: listed}
	due, total := p.due(recs, podsDir, now)
	// A wholesale disappearance is more likely a replaced or hidden pods
	// directory than that many pods deleted behind the kubelet's back.
	if len(due) > max(1, int(g.cfg.MaxOrphanShare*float64(total))) {
		if g.cfg.Pods == nil {
			log.Error(nil, g.cfg.Words.Say("Orphan GC pass refused: too many volumes look orphaned at once, and without API confirmation that their pods are gone (Options.GC.Pods not set) nothing is removed"),
				logkeys.Orphaned, len(due), logkeys.Volumes, total, logkeys.MaxShare, g.cfg.MaxOrphanShare, logkeys.PodsDir, podsDir)
			for _, rec := range due {
				p.report(rec, Refused)
			}
			return p, nil
		}
		log.Info("Many volumes look orphaned at once; removing only those whose pods the API server confirms gone", logkeys.Orphaned, len(due), logkeys.Volumes, total)
	}
	for backend, recs := range p.confirmed(ctx, due, now) {
		p.start(ctx, backend, recs)
	}
	return p, nil
}

// Pass is one pass of the orphan GC: what it did with each volume, and the
// removals it started.
type Pass struct {
	g       *GC
	log     klog.Logger
	mu      sync.Mutex // report, from the removals in flight
	results map[string]Result
	started int
	listed  uint64         // GC.ends when the pass listed the records
	wg      sync.WaitGroup // the pass's removals
}

// Wait waits for the removals the pass started and returns what the pass did
// with each volume.
func (p *Pass) Wait() map[string]Result {
	p.wg.Wait()
	return p.Results()
}

// Results returns what the pass did with each volume so far: a volume whose
// removal still runs is not in it yet.
func (p *Pass) Results() map[string]Result {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.results)
}

// Started is how many volumes the pass started removing.
func (p *Pass) Started() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.started
}

// report records and reports what the pass did with rec.
func (p *Pass) report(rec *store.Record, r Result) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.results[rec.VolumeID] = r
	p.g.cfg.Observe(rec, string(r))
}

// due are the records whose pod directory has been gone for the grace
// period; total counts the records that belong to a pod. Volumes whose pod
// directory is back are no longer orphans; those within the grace period
// are pending.
func (p *Pass) due(recs []*store.Record, podsDir string, now time.Time) (due []*store.Record, total int) {
	g := p.g
	seen := map[string]bool{}
	for _, rec := range recs {
		seen[rec.VolumeID] = true
		if rec.Pod.UID == "" {
			continue // unclaimed storage: no pod to look for
		}
		total++
		_, err := os.Lstat(filepath.Join(podsDir, rec.Pod.UID))
		if err == nil {
			g.orphans.clear(rec.VolumeID)
			continue
		}
		if !errors.Is(err, fs.ErrNotExist) {
			p.report(rec, Failed)
			continue
		}
		first := g.orphans.mark(rec.VolumeID, now)
		if now.Sub(first) < g.cfg.OrphanGracePeriod {
			p.report(rec, Pending)
			continue
		}
		due = append(due, rec)
	}
	g.orphans.forgetExcept(seen)
	return due, total
}

// confirmed are the volumes of due to remove, by backend: with
// Options.GC.Pods, those whose pod the API server confirms gone; in a dry run
// none (each is logged).
func (p *Pass) confirmed(ctx context.Context, due []*store.Record, now time.Time) map[string][]*store.Record {
	g, log := p.g, p.log
	byBackend := map[string][]*store.Record{}
	for _, rec := range due {
		vlog := log.WithValues(logkeys.VolumeID, rec.VolumeID, logkeys.PodUID, rec.Pod.UID, logkeys.Pod, rec.Pod.Namespace+"/"+rec.Pod.Name)
		if g.cfg.Pods != nil {
			exists, err := g.cfg.Pods.PodExists(ctx, rec.Pod.UID)
			if err != nil {
				vlog.Error(err, "Cannot confirm the pod is gone; keeping the volume")
				p.report(rec, Failed)
				continue
			}
			if exists {
				p.report(rec, PodExists)
				continue
			}
		}
		first := g.orphans.mark(rec.VolumeID, now)
		if g.cfg.DryRun {
			vlog.Info("Dry run: would remove orphaned volume (pod directory gone)", logkeys.OrphanedFor, now.Sub(first).Round(time.Second))
			p.report(rec, WouldRemove)
			continue
		}
		byBackend[rec.Backend] = append(byBackend[rec.Backend], rec)
	}
	return byBackend
}

// start removes recs, the due volumes of backend, in a goroutine of the
// backend's own, unless the backend's removals of an earlier pass still run,
// or ended after the pass listed the records (which may then be of volumes
// those removals tore down): then each is Busy, left to a later pass. The
// pass does not wait for it.
func (p *Pass) start(ctx context.Context, backend string, recs []*store.Record) {
	g := p.g
	g.mu.Lock()
	busy := g.removing[backend] || g.ended[backend] > p.listed
	if !busy {
		g.removing[backend] = true
		g.running.Add(1)
		p.wg.Add(1)
	}
	g.mu.Unlock()
	if busy {
		p.log.V(2).Info("Orphan GC: the backend's removals of an earlier pass still run, or ended since this pass listed the volumes; its orphans wait for a later pass", logkeys.Backend, backend, logkeys.Orphaned, len(recs))
		for _, rec := range recs {
			p.report(rec, Busy)
		}
		return
	}
	p.mu.Lock()
	p.started += len(recs)
	p.mu.Unlock()
	go func() {
		defer func() {
			g.mu.Lock()
			delete(g.removing, backend)
			g.ends++
			g.ended[backend] = g.ends
			g.mu.Unlock()
			g.running.Done()
			p.wg.Done()
		}()
		p.remove(ctx, backend, recs)
	}()
}

// remove tears the volumes of backend down, gcConcurrency at a time, in the
// backend's teardown lane (GCConfig.Teardowns): each is an unpublish (an
// unmount, a backend Delete, a record deleted) bounded by
// GCConfig.OperationTimeout, and concurrent record deletions share the
// store's commits. A volume busy with another operation is left to the next
// pass. It returns when every removal it started has.
func (p *Pass) remove(ctx context.Context, backend string, recs []*store.Record) {
	g, log := p.g, p.log
	var wg sync.WaitGroup
	var removed, failed atomic.Int64
	start := time.Now()
	defer func() {
		wg.Wait()
		log.V(2).Info("Orphan GC: the backend's removals of this pass ended", logkeys.Backend, backend, logkeys.Removed, removed.Load(), logkeys.Failed, failed.Load(), logkeys.Duration, time.Since(start))
	}()
	sem := make(chan struct{}, gcConcurrency)
	for _, rec := range recs {
		sem <- struct{}{}
		slot, err := g.cfg.Teardowns.Acquire(ctx, backend, 1)
		if err != nil {
			<-sem
			return // the GC is stopping
		}
		if !g.cfg.Locks.TryAcquire(rec.VolumeID) {
			slot.Release()
			<-sem
			continue // an operation is in progress: the kubelet is on it
		}
		vlog := log.WithValues(logkeys.VolumeID, rec.VolumeID, logkeys.PodUID, rec.Pod.UID, logkeys.Pod, rec.Pod.Namespace+"/"+rec.Pod.Name, logkeys.Backend, backend)
		wg.Go(func() {
			defer func() { <-sem }()
			rctx, cancel := context.WithTimeout(ctx, g.cfg.OperationTimeout)
			err := g.cfg.Remove(rctx, rec)
			cancel()
			g.cfg.Locks.Release(rec.VolumeID)
			slot.Release()
			if err != nil {
				vlog.Error(err, "Removing orphaned volume failed; will retry")
				failed.Add(1)
				p.report(rec, Failed)
				return
			}
			g.orphans.clear(rec.VolumeID)
			g.cfg.Forget(rec.VolumeID)
			vlog.Info("Removed orphaned volume (pod directory gone)")
			removed.Add(1)
			p.report(rec, Removed)
		})
	}
}

// CheckPodsDir fails unless the kubelet's pods directory exists and is the
// directory the GC saw first (same device and inode). Without it every volume
// would look orphaned: a wrong --kubelet-root, a pods directory replaced by an
// empty one, or a mount over it lazily unmounted must not delete anything.
func (g *GC) CheckPodsDir(podsDir string) error {
	fi, err := os.Stat(podsDir)
	if err != nil {
		return fmt.Errorf("orphan GC skipped: kubelet pods directory %s: %w", podsDir, err)
	}
	g.orphans.mu.Lock()
	defer g.orphans.mu.Unlock()
	if g.orphans.podsDir == nil {
		g.orphans.podsDir = fi
		return nil
	}
	if !os.SameFile(g.orphans.podsDir, fi) {
		return fmt.Errorf("orphan GC skipped: kubelet pods directory %s is not the directory seen when the driver started (another device or inode: replaced, or a mount over it went away); restart the driver if the change is intended", podsDir)
	}
	return nil
}

// mark returns since when volume id has looked orphaned, now if it did not.
func (o *orphans) mark(id string, now time.Time) time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.since == nil {
		o.since = map[string]time.Time{}
	}
	if t, ok := o.since[id]; ok {
		return t
	}
	o.since[id] = now
	return now
}

// clear forgets that volume id looked orphaned.
func (o *orphans) clear(id string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.since, id)
}

// forgetExcept forgets every volume not in keep.
func (o *orphans) forgetExcept(keep map[string]bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for id := range o.since {
		if !keep[id] {
			delete(o.since, id)
		}
	}
}

// Run runs the orphan GC at startup and every GCConfig.Interval until ctx
// ends, on time whatever a backend's removals do (Collect). It then waits a
// little (stopWait) for the removals still running, cancelled with ctx.
func (g *GC) Run(ctx context.Context) {
	log := g.cfg.Logger.WithName("gc")
	defer g.stop(log)
	t := time.NewTicker(g.cfg.Interval)
	defer t.Stop()
	for {
		p, err := g.Collect(ctx, time.Now())
		switch {
		case errors.Is(err, fs.ErrNotExist):
			// A node whose kubelet has not created its pods directory yet.
			log.V(2).Info("Orphan GC pass skipped", logkeys.Reason, err.Error())
		case err != nil && ctx.Err() == nil:
			log.Error(err, "Orphan GC pass")
		}
		if p != nil {
			counts := map[Result]int{}
			for _, r := range p.Results() {
				counts[r]++
			}
			if started := p.Started(); len(counts) > 0 || started > 0 {
				log.V(2).Info("Orphan GC pass", logkeys.Removing, started, logkeys.DryRun, counts[WouldRemove], logkeys.Pending, counts[Pending], logkeys.PodExists, counts[PodExists], logkeys.Busy, counts[Busy], logkeys.Failed, counts[Failed])
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// stop waits at most stopWait for the removals still running.
func (g *GC) stop(log klog.Logger) {
	done := make(chan struct{})
	go func() {
		g.running.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(stopWait):
		log.Info("Stopping with orphan removals that did not return after their cancellation; the next start's GC retries them", logkeys.Timeout, stopWait)
	}
}
