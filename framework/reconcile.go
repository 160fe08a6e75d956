package framework

import (
	"context"
	"errors"
	"fmt"

	"github.com/ephemera-csi/ephemera/framework/internal/logkeys"
	"github.com/ephemera-csi/ephemera/framework/metrics"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// reconcile runs at startup, before the driver serves. It compares the records
// (what the driver promised), the mount table (what is published) and the
// backends' inventories (what storage exists):
//
//   - a record not in phase Published belongs to an operation cut short by a crash;
//     the kubelet never got OK for a publish in that state, and an unpublish in
//     that state is idempotent, so both are rolled back completely;
//   - a Published record is kept whether or not its target is mounted: a
//     republish repairs it, NodeUnpublish or the orphan GC removes it;
//   - backend storage that no record refers to is deleted.
//
// Failures to clean one volume are logged and left for the next attempt (a later
// NodePublish/NodeUnpublish of that volume finishes the job); only an unreadable
// store fails the startup.
func (d *Driver) reconcile(ctx context.Context) error {
	log := d.opts.Logger.WithName("reconcile")
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
		if rec.Phase == store.PhasePublished {
			mounted, err := d.mounter.IsMountPoint(rec.TargetPath)
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
	for name, b := range d.opts.Backends {
		lister, ok := b.(Lister)
		if !ok {
			continue
		}
		ids, err := d.listStorage(ctx, name, lister)
		if err != nil {
			log.Error(err, "Listing backend inventory", logkeys.Backend, name)
			d.metrics.Reconciled(metrics.ReconcileFailed)
			continue
		}
		for _, id := range ids {
			if known[id] {
				continue
			}
			if err := d.deleteStorage(ctx, b, orphanVolume(id, name)); err != nil {
				log.Error(err, "Deleting storage without a record", logkeys.Backend, name, logkeys.VolumeID, id)
				d.metrics.Reconciled(metrics.ReconcileFailed)
				failed = append(failed, err)
				continue
			}
			d.metrics.Reconciled(metrics.ReconcileOrphanDeleted)
			log.Info("Deleted storage without a record", logkeys.Backend, name, logkeys.VolumeID, id)
		}
	}
	if len(failed) > 0 {
		log.Info("Reconcile left volumes to retry", logkeys.Count, len(failed), "err", errors.Join(failed...).Error())
	}
	return nil
}
