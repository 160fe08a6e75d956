package framework

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/ephemera-csi/ephemera/framework/internal/logkeys"
	"github.com/ephemera-csi/ephemera/framework/internal/metrics"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// reconcile runs at startup, before the driver serves. It compares the records
// (what the driver promised), the mount table (what is published) and the
// backends' inventories (what storage exists):
//
//   - a record in phase Publishing (the intent of a backend that needs one, or
//     what a failed rollback left) or Unpublishing (written by older
//     versions) belongs to an operation cut short; the kubelet never got OK
//     for a publish in that state, and an unpublish is idempotent, so both are
//     rolled back completely (storage still mounted anywhere is not deleted:
//     see refuseIfMounted);
//   - a Published record is kept whether or not its target is mounted: a
//     republish repairs it, NodeUnpublish or the orphan GC removes it;
//   - a volume of this driver published at its target without a record (the
//     kubelet's vol_data.json names this driver and the handle) is adopted
//     with a rebuilt record (adopt.go);
//   - backend storage that no record refers to is adopted when its pod still
//     has the volume, deleted when the store can prove it a leftover, and kept
//     as unclaimed otherwise (adoptInventory).
//
// Failures to clean one volume are logged and left for the next attempt (a later
// NodePublish/NodeUnpublish of that volume finishes the job); only an unreadable
// store fails the startup. Nothing is ever deleted because a record is missing.
func (d *Driver) reconcile(ctx context.Context) error {
	log := d.opts.Observability.Logger.WithName("reconcile")
	recs, err := d.store.List(ctx)
	if err != nil {
		return fmt.Errorf("listing volume records: %w", err)
	}
	d.capacity.reset(recs)
	known := make(map[string]bool, len(recs))
	var failed []error
	for _, rec := range recs {
		known[rec.VolumeID] = true
		vlog := log.WithValues(logkeys.VolumeID, rec.VolumeID, logkeys.Phase, rec.Phase)
		switch rec.Phase {
		case store.PhaseUnclaimed:
			continue
		case store.PhasePublished:
			mounted, err := d.mounter.IsMountPoint(d.opts.Node.KubeletRootDir, rec.TargetPath)
			if err != nil {
				vlog.Error(err, "Checking target of published volume")
			} else if !mounted {
				vlog.Info("Published volume is not mounted; a republish repairs it, an unpublish or the orphan GC removes it", logkeys.TargetPath, rec.TargetPath)
			}
			continue
		}
		if err := d.teardown(ctx, rec); err != nil {
			vlog.Error(err, "Rolling back interrupted operation failed; will retry")
			d.metrics.Reconciled(metrics.ReconcileFailed)
			failed = append(failed, err)
			continue
		}
		d.metrics.Reconciled(metrics.ReconcileRolledBack)
		vlog.Info("Rolled back interrupted operation")
	}
	if err := d.adoptPublished(ctx, known); err != nil {
		log.Error(err, "Adopting published volumes without a record")
		d.metrics.Reconciled(metrics.ReconcileFailed)
		failed = append(failed, err)
	}
	index := sync.OnceValues(d.volDataIndex)
	for _, name := range backendNames(d.opts.Backends) {
		failed = append(failed, d.adoptInventory(ctx, name, d.opts.Backends[name], known, index)...)
	}
	if len(failed) > 0 {
		log.Info("Reconcile left volumes to retry", logkeys.Count, len(failed), logkeys.Err, errors.Join(failed...).Error())
	}
	return nil
}
