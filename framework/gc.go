package framework

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/ephemera-csi/ephemera/framework/internal/logkeys"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// PodChecker confirms with the API server whether a pod still exists, by UID.
// The orphan GC asks it before tearing down a volume whose pod directory is
// gone; an error means "unknown" and the volume is kept for now. Package
// framework/kube has an implementation backed by a pod informer restricted to
// this node.
type PodChecker interface {
	PodExists(ctx context.Context, uid string) (bool, error)
}

// gcResult labels what one GC pass did with one volume.
type gcResult string

const (
	gcRemoved   gcResult = "removed"    // torn down
	gcWouldRm   gcResult = "dry_run"    // would have been torn down
	gcPending   gcResult = "pending"    // orphaned, within the grace period
	gcConfirmed gcResult = "pod_exists" // pod dir gone but the API server has the pod
	gcFailed    gcResult = "failed"     // teardown or check failed; retried next pass
)

// orphans remembers since when each volume has looked orphaned.
type orphans struct {
	mu    sync.Mutex
	since map[string]time.Time
}

// collectGarbage runs one pass of the orphan GC (DESIGN.md contract 7): a volume
// whose pod directory <kubelet-root>/pods/<uid> is gone belongs to a pod the
// kubelet will never unpublish (deleted while the node or the driver was down,
// or its directory removed by hand). After Options.OrphanGracePeriod of being
// seen that way — and, with Options.Pods, after the API server confirms the pod
// is gone — it is torn down like an unpublish. Volumes busy with another
// operation are skipped until the next pass. It returns what it did per volume.
func (d *Driver) collectGarbage(ctx context.Context, now time.Time) (map[string]gcResult, error) {
	log := d.opts.Logger.WithName("gc")
	podsDir := filepath.Join(d.opts.KubeletRootDir, "pods")
	if _, err := os.Stat(podsDir); err != nil {
		// Without the kubelet's pods directory every volume would look orphaned:
		// a wrong --kubelet-root must not delete everything.
		return nil, fmt.Errorf("orphan GC skipped: kubelet pods directory %s: %w", podsDir, err)
	}
	recs, err := d.store.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("orphan GC: listing volumes: %w", err)
	}
	results := map[string]gcResult{}
	report := func(rec *store.Record, r gcResult) {
		results[rec.VolumeID] = r
		d.gcObserved(rec, string(r))
	}
	seen := map[string]bool{}
	for _, rec := range recs {
		seen[rec.VolumeID] = true
		if rec.Pod.UID == "" {
			continue
		}
		_, err := os.Lstat(filepath.Join(podsDir, rec.Pod.UID))
		if err == nil {
			d.orphans.clear(rec.VolumeID)
			continue
		}
		if !errors.Is(err, fs.ErrNotExist) {
			report(rec, gcFailed)
			continue
		}
		vlog := log.WithValues(logkeys.VolumeID, rec.VolumeID, logkeys.PodUID, rec.Pod.UID, logkeys.Pod, rec.Pod.Namespace+"/"+rec.Pod.Name)
		first := d.orphans.mark(rec.VolumeID, now)
		if now.Sub(first) < d.opts.OrphanGracePeriod {
			report(rec, gcPending)
			continue
		}
		if d.opts.Pods != nil {
			exists, err := d.opts.Pods.PodExists(ctx, rec.Pod.UID)
			if err != nil {
				vlog.Error(err, "Cannot confirm the pod is gone; keeping the volume")
				report(rec, gcFailed)
				continue
			}
			if exists {
				report(rec, gcConfirmed)
				continue
			}
		}
		if d.opts.GCDryRun {
			vlog.Info("Dry run: would remove orphaned volume (pod directory gone)", "orphanedFor", now.Sub(first).Round(time.Second))
			report(rec, gcWouldRm)
			continue
		}
		if !d.locks.TryAcquire(rec.VolumeID) {
			continue // an operation is in progress: the kubelet is on it
		}
		err = d.teardown(ctx, rec)
		d.locks.Release(rec.VolumeID)
		if err != nil {
			vlog.Error(err, "Removing orphaned volume failed; will retry")
			report(rec, gcFailed)
			continue
		}
		d.orphans.clear(rec.VolumeID)
		vlog.Info("Removed orphaned volume (pod directory gone)")
		report(rec, gcRemoved)
	}
	d.orphans.forgetExcept(seen)
	return results, nil
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

// runGC runs the orphan GC at startup and every GCInterval until ctx ends.
func (d *Driver) runGC(ctx context.Context) {
	log := d.opts.Logger.WithName("gc")
	t := time.NewTicker(d.opts.GCInterval)
	defer t.Stop()
	for {
		results, err := d.collectGarbage(ctx, time.Now())
		switch {
		case errors.Is(err, fs.ErrNotExist):
			// A node whose kubelet has not created its pods directory yet.
			log.V(2).Info("Orphan GC pass skipped", "reason", err.Error())
		case err != nil && ctx.Err() == nil:
			log.Error(err, "Orphan GC pass")
		}
		counts := map[gcResult]int{}
		for _, r := range results {
			counts[r]++
		}
		if len(counts) > 0 {
			log.V(2).Info("Orphan GC pass", "removed", counts[gcRemoved], "dryRun", counts[gcWouldRm], "pending", counts[gcPending], "podExists", counts[gcConfirmed], "failed", counts[gcFailed])
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
