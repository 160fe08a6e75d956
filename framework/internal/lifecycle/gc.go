package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/framework/internal/logkeys"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// gcConcurrency bounds the orphan GC's removals in flight.
const gcConcurrency = 8

// gcResult labels what one GC pass did with one volume.
type gcResult string

const (
	gcRemoved   gcResult = "removed"    // torn down
	gcWouldRm   gcResult = "dry_run"    // would have been torn down
	gcPending   gcResult = "pending"    // orphaned, within the grace period
	gcConfirmed gcResult = "pod_exists" // pod dir gone but the API server has the pod
	gcFailed    gcResult = "failed"     // teardown or check failed; retried next pass
	gcRefused   gcResult = "refused"    // the pass looked unsafe (see collectGarbage)
)

// orphans remembers since when each volume has looked orphaned, and the
// kubelet pods directory the GC first saw.
type orphans struct {
	mu      sync.Mutex
	since   map[string]time.Time
	podsDir os.FileInfo
}

// collectGarbage runs one pass of the orphan GC (docs/design.md, "Orphan GC"): a volume
// whose pod directory <kubelet-root>/pods/<uid> is gone belongs to a pod the
// kubelet will never unpublish (deleted while the node or the driver was down,
// or its directory removed by hand). After Options.GC.OrphanGracePeriod of being
// seen that way — and, with Options.GC.Pods, after the API server confirms the pod
// is gone — it is torn down like an unpublish. Volumes busy with another
// operation are skipped until the next pass. It returns what it did per volume.
//
// The GC distrusts a sudden empty world. It acts only on the pods directory it
// first saw (same device and inode: a directory replaced, or a mount over it
// lazily unmounted, stops it), and a pass in which more than
// Options.GC.MaxOrphanShare of the volumes look orphaned at once removes only
// volumes the API server confirms gone (none without Options.GC.Pods). Storage
// still mounted anywhere is never deleted (teardown).
func (d *Engine) collectGarbage(ctx context.Context, now time.Time) (map[string]gcResult, error) {
	log := d.cfg.Observability.Logger.WithName("gc")
	podsDir := filepath.Join(d.cfg.Node.KubeletRootDir, "pods")
	if err := d.CheckPodsDir(podsDir); err != nil {
		d.metrics.GC(string(gcRefused))
		return nil, err
	}
	recs, err := d.store.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("orphan GC: listing volumes: %w", err)
	}
	p := &gcPass{d: d, log: log, results: map[string]gcResult{}}
	due, total := p.due(recs, podsDir, now)
	// A wholesale disappearance is more likely a replaced or hidden pods
	// directory than that many pods deleted behind the kubelet's back.
	if len(due) > max(1, int(d.cfg.GC.MaxOrphanShare*float64(total))) {
		if d.cfg.GC.Pods == nil {
			log.Error(nil, d.words.Say("Orphan GC pass refused: too many volumes look orphaned at once, and without API confirmation that their pods are gone (Options.GC.Pods not set) nothing is removed"),
				logkeys.Orphaned, len(due), logkeys.Volumes, total, logkeys.MaxShare, d.cfg.GC.MaxOrphanShare, logkeys.PodsDir, podsDir)
			for _, rec := range due {
				p.report(rec, gcRefused)
			}
			return p.results, nil
		}
		log.Info("Many volumes look orphaned at once; removing only those whose pods the API server confirms gone", logkeys.Orphaned, len(due), logkeys.Volumes, total)
	}
	p.remove(ctx, p.confirmed(ctx, due, now))
	return p.results, nil
}

// gcPass is one pass of the orphan GC: what it did with each volume.
type gcPass struct {
	d       *Engine
	log     klog.Logger
	mu      sync.Mutex // report, from the removals in flight
	results map[string]gcResult
}

func (p *gcPass) report(rec *store.Record, r gcResult) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.results[rec.VolumeID] = r
	p.d.gcObserved(rec, string(r))
}

// due are the records whose pod directory has been gone for the grace
// period; total counts the records that belong to a pod. Volumes whose pod
// directory is back are no longer orphans; those within the grace period
// are pending.
func (p *gcPass) due(recs []*store.Record, podsDir string, now time.Time) (due []*store.Record, total int) {
	d := p.d
	seen := map[string]bool{}
	for _, rec := range recs {
		seen[rec.VolumeID] = true
		if rec.Pod.UID == "" {
			continue // unclaimed storage: no pod to look for
		}
		total++
		_, err := os.Lstat(filepath.Join(podsDir, rec.Pod.UID))
		if err == nil {
			d.orphans.clear(rec.VolumeID)
			continue
		}
		if !errors.Is(err, fs.ErrNotExist) {
			p.report(rec, gcFailed)
			continue
		}
		first := d.orphans.mark(rec.VolumeID, now)
		if now.Sub(first) < d.cfg.GC.OrphanGracePeriod {
			p.report(rec, gcPending)
			continue
		}
		due = append(due, rec)
	}
	d.orphans.forgetExcept(seen)
	return due, total
}

// confirmed are the volumes of due to remove, by backend: with
// Options.GC.Pods, those whose pod the API server confirms gone; in a dry run
// none (each is logged).
func (p *gcPass) confirmed(ctx context.Context, due []*store.Record, now time.Time) map[string][]*store.Record {
	d, log := p.d, p.log
	byBackend := map[string][]*store.Record{}
	for _, rec := range due {
		vlog := log.WithValues(logkeys.VolumeID, rec.VolumeID, logkeys.PodUID, rec.Pod.UID, logkeys.Pod, rec.Pod.Namespace+"/"+rec.Pod.Name)
		if d.cfg.GC.Pods != nil {
			exists, err := d.cfg.GC.Pods.PodExists(ctx, rec.Pod.UID)
			if err != nil {
				vlog.Error(err, "Cannot confirm the pod is gone; keeping the volume")
				p.report(rec, gcFailed)
				continue
			}
			if exists {
				p.report(rec, gcConfirmed)
				continue
			}
		}
		first := d.orphans.mark(rec.VolumeID, now)
		if d.cfg.GC.DryRun {
			vlog.Info("Dry run: would remove orphaned volume (pod directory gone)", logkeys.OrphanedFor, now.Sub(first).Round(time.Second))
			p.report(rec, gcWouldRm)
			continue
		}
		byBackend[rec.Backend] = append(byBackend[rec.Backend], rec)
	}
	return byBackend
}

// remove tears the volumes down, gcConcurrency at a time per backend, in the
// teardown lane of the volume's backend (lanes.go): each is an unpublish (an
// unmount, a backend Delete, a record deleted), concurrent record deletions
// share the store's commits, and a backend whose Delete hangs holds up only
// the removals of its own volumes. A volume busy with another operation is
// left to the next pass.
func (p *gcPass) remove(ctx context.Context, byBackend map[string][]*store.Record) {
	d, log := p.d, p.log
	var wg sync.WaitGroup
	for backend, recs := range byBackend {
		wg.Go(func() {
			var bwg sync.WaitGroup
			sem := make(chan struct{}, gcConcurrency)
			for _, rec := range recs {
				sem <- struct{}{}
				slot, err := d.lanes.Teardowns.Acquire(ctx, backend, 1)
				if err != nil {
					<-sem
					break // the GC is stopping
				}
				if !d.lanes.Locks.TryAcquire(rec.VolumeID) {
					slot.Release()
					<-sem
					continue // an operation is in progress: the kubelet is on it
				}
				vlog := log.WithValues(logkeys.VolumeID, rec.VolumeID, logkeys.PodUID, rec.Pod.UID, logkeys.Pod, rec.Pod.Namespace+"/"+rec.Pod.Name)
				bwg.Go(func() {
					defer func() { <-sem }()
					err := d.collectOrphan(ctx, rec)
					d.lanes.Locks.Release(rec.VolumeID)
					slot.Release()
					if err != nil {
						vlog.Error(err, "Removing orphaned volume failed; will retry")
						p.report(rec, gcFailed)
						return
					}
					d.orphans.clear(rec.VolumeID)
					d.stats.Forget(rec.VolumeID)
					vlog.Info("Removed orphaned volume (pod directory gone)")
					p.report(rec, gcRemoved)
				})
			}
			bwg.Wait()
		})
	}
	wg.Wait()
}

// CheckPodsDir fails unless the kubelet's pods directory exists and is the
// directory the GC saw first (same device and inode). Without it every volume
// would look orphaned: a wrong --kubelet-root, a pods directory replaced by an
// empty one, or a mount over it lazily unmounted must not delete anything.
func (d *Engine) CheckPodsDir(podsDir string) error {
	fi, err := os.Stat(podsDir)
	if err != nil {
		return fmt.Errorf("orphan GC skipped: kubelet pods directory %s: %w", podsDir, err)
	}
	d.orphans.mu.Lock()
	defer d.orphans.mu.Unlock()
	if d.orphans.podsDir == nil {
		d.orphans.podsDir = fi
		return nil
	}
	if !os.SameFile(d.orphans.podsDir, fi) {
		return fmt.Errorf("orphan GC skipped: kubelet pods directory %s is not the directory seen when the driver started (another device or inode: replaced, or a mount over it went away); restart the driver if the change is intended", podsDir)
	}
	return nil
}

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

func (o *orphans) clear(id string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.since, id)
}

func (o *orphans) forgetExcept(keep map[string]bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for id := range o.since {
		if !keep[id] {
			delete(o.since, id)
		}
	}
}

// RunGC runs the orphan GC at startup and every GCInterval until ctx ends.
func (d *Engine) RunGC(ctx context.Context) {
	log := d.cfg.Observability.Logger.WithName("gc")
	t := time.NewTicker(d.cfg.GC.Interval)
	defer t.Stop()
	for {
		results, err := d.collectGarbage(ctx, time.Now())
		switch {
		case errors.Is(err, fs.ErrNotExist):
			// A node whose kubelet has not created its pods directory yet.
			log.V(2).Info("Orphan GC pass skipped", logkeys.Reason, err.Error())
		case err != nil && ctx.Err() == nil:
			log.Error(err, "Orphan GC pass")
		}
		counts := map[gcResult]int{}
		for _, r := range results {
			counts[r]++
		}
		if len(counts) > 0 {
			log.V(2).Info("Orphan GC pass", logkeys.Removed, counts[gcRemoved], logkeys.DryRun, counts[gcWouldRm], logkeys.Pending, counts[gcPending], logkeys.PodExists, counts[gcConfirmed], logkeys.Failed, counts[gcFailed])
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
