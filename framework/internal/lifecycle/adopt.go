package lifecycle

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/logkeys"
	"github.com/ephemera-csi/ephemera/framework/internal/metrics"
	"github.com/ephemera-csi/ephemera/framework/internal/stats"
	"github.com/ephemera-csi/ephemera/framework/internal/volume"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// This file holds what keeps a volume alive when its record is missing: the
// state file was lost, reset or damaged, or restored from an older copy. The
// rules (docs/design.md, "State is a cache of the node"):
//
//   - the node is the truth for what exists: mounts at targets under the
//     kubelet root, the kubelet's vol_data.json beside each target, and the
//     backends' inventories; a volume found there without a record is adopted
//     with a rebuilt record, never deleted and never mounted over;
//   - storage without a record is deleted only when the backend's storage area
//     carries the store's own stamp (the store has known all of it all along)
//     and nothing mounts it; otherwise it is kept as unclaimed;
//   - no storage is deleted while the mount table shows it mounted anywhere.

// kubelet is what the kubelet's directories say about this driver's volumes.
func (d *Engine) kubelet() volume.Kubelet {
	return volume.Kubelet{Root: d.cfg.Node.KubeletRootDir, Driver: d.cfg.DriverName, Windows: isWindows, Open: d.mounter.OpenTarget}
}

// finding is a volume the node shows without a record, for the reconcile
// event (lifecycle.go): the case it is and what its transition works on (the
// rebuilt record, not saved yet).
type finding struct {
	when cond
	op   op
}

// unrecordedMounts finds every volume of this driver that is published at
// its target (the mount table, or links on Windows) but has no record in
// known: the state was lost while pods used the volumes. Each gets a rebuilt
// record (whenFoundMounted).
func (d *Engine) unrecordedMounts(ctx context.Context, known map[string]bool) ([]finding, error) {
	log := d.cfg.Observability.Logger.WithName("reconcile")
	root := d.cfg.Node.KubeletRootDir
	targets, err := d.mounter.Published(root)
	if err != nil {
		return nil, fmt.Errorf("listing published targets: %w", err)
	}
	var found []finding
	for _, t := range targets {
		// Known volumes first, without reading their vol_data.json: at startup
		// on a full node nearly every target is.
		if pt, err := volume.ParseTarget(root, t, isWindows); err != nil || known[pt.Handle()] {
			continue
		}
		pt, id, ok := d.kubelet().Owned(t)
		if !ok || known[id] {
			continue
		}
		vlog := log.WithValues(logkeys.VolumeID, id, logkeys.TargetPath, t)
		mt, err := d.mounter.Inspect(root, t)
		if err != nil || mt == nil {
			continue
		}
		rec := &store.Record{
			VolumeID: id, VolumeName: pt.VolumeName, TargetPath: t,
			Pod:   api.Pod{UID: pt.PodUID},
			Phase: store.PhasePublished, Rebuilt: true, ReadOnly: mt.ReadOnly,
			Created: time.Now().UTC(), Updated: time.Now().UTC(),
		}
		for _, name := range backendNames(d.cfg.Backends) {
			v := &api.Volume{ID: id, Name: pt.VolumeName, TargetPath: t, Backend: name, Pod: rec.Pod}
			src, found, err := d.storage.Find(ctx, d.cfg.Backends[name], v)
			if err != nil || !found {
				continue
			}
			if ok, err := d.mounter.Shows(mt, src); err == nil && ok {
				rec.Backend, rec.Source = name, &src
				if src.FSType == "tmpfs" {
					rec.Source = &api.Source{Path: src.Path, FSType: src.FSType}
				}
				break
			}
		}
		if rec.Source != nil && !rec.Source.IsDir() {
			if r, err := d.mounter.OpenTarget(root, t); err == nil {
				if u, err := stats.Filesystem(r, t); err == nil {
					rec.Size = u.BytesTotal
				}
				r.Close()
			}
		}
		found = append(found, finding{when: whenFoundMounted, op: op{rec: rec, mt: mt, log: vlog}})
	}
	return found, nil
}

// inventory is what unrecordedStorage found in one backend's inventory.
type inventory struct {
	name   string
	b      Backend
	found  []finding
	failed []error // the storage that could not be told apart, kept
	// stamp is set when the storage area may be stamped with the store's
	// identity once every finding has its transition done (stampArea).
	stamp bool
}

// unrecordedStorage compares one backend's inventory with the records in
// known. Storage whose pod still has the volume on this node (its
// vol_data.json) is whenFoundPodded. Other storage without a record is
// whenFoundProven only when the backend's stamp proves the store has known
// the area all along; otherwise it is whenFoundUnproven.
func (d *Engine) unrecordedStorage(ctx context.Context, name string, b Backend, known map[string]bool, index func() (map[string]string, error)) *inventory {
	inv := &inventory{name: name, b: b}
	log := d.cfg.Observability.Logger.WithName("reconcile").WithValues(logkeys.Backend, name)
	lister := b.Lister()
	if lister == nil {
		return inv
	}
	ids, err := d.storage.List(ctx, name, lister)
	if err != nil {
		log.Error(err, "Listing backend inventory")
		d.metrics.Reconciled(metrics.ReconcileFailed)
		inv.failed = []error{err}
		return inv
	}
	storeID := d.storage.StoreID()
	stamper := b.Stamper()
	isStamper := stamper != nil
	proven := false
	if isStamper && storeID != "" {
		st, err := stamper.Stamp(ctx)
		if err != nil {
			log.Error(err, "Reading the storage stamp; storage without a record is kept")
		}
		proven = err == nil && st == storeID
	}
	inv.stamp = isStamper && storeID != "" && !proven
	seen := map[string]bool{}
	for _, id := range ids {
		if known[id] || seen[id] {
			continue
		}
		seen[id] = true
		vlog := log.WithValues(logkeys.VolumeID, id)
		idx, err := index()
		if err != nil {
			vlog.Error(err, "Reading the kubelet's volumes; storage without a record is kept")
			inv.failed = append(inv.failed, err)
			continue
		}
		if t, ok := idx[id]; ok {
			pt, _ := volume.ParseTarget(d.cfg.Node.KubeletRootDir, t, isWindows)
			rec := d.rebuiltRecord(id, name, store.PhasePublished)
			rec.VolumeName, rec.TargetPath, rec.Pod = pt.VolumeName, t, api.Pod{UID: pt.PodUID}
			inv.found = append(inv.found, finding{when: whenFoundPodded, op: op{rec: rec, b: b, log: vlog}})
			continue
		}
		if proven {
			inv.found = append(inv.found, finding{when: whenFoundProven, op: op{rec: d.rebuiltRecord(id, name, ""), b: b, log: vlog}})
			continue
		}
		rec := d.rebuiltRecord(id, name, store.PhaseUnclaimed)
		inv.found = append(inv.found, finding{when: whenFoundUnproven, op: op{rec: rec, b: b, log: vlog}})
	}
	return inv
}

// stampArea stamps a backend's storage area with the state store's identity
// once every piece of its storage has a record (inv.stamp).
func (d *Engine) stampArea(ctx context.Context, inv *inventory) {
	if !inv.stamp {
		return
	}
	log := d.cfg.Observability.Logger.WithName("reconcile").WithValues(logkeys.Backend, inv.name)
	stamper := inv.b.Stamper()
	storeID := d.storage.StoreID()
	if err := stamper.SetStamp(ctx, storeID); err != nil {
		log.Error(err, "Stamping the storage area with the state store's identity; storage without a record stays protected")
	} else {
		log.Info("Stamped the storage area with the state store's identity", logkeys.Store, storeID)
	}
}

// volDataIndexOnce is volDataIndex, read at most once per reconcile.
func (d *Engine) volDataIndexOnce() func() (map[string]string, error) {
	return sync.OnceValues(d.kubelet().Index)
}

// rebuiltRecord is the record of storage found without one.
func (d *Engine) rebuiltRecord(id, backend string, phase store.Phase) *store.Record {
	now := time.Now().UTC()
	return &store.Record{VolumeID: id, Backend: backend, Phase: phase, Rebuilt: true, Created: now, Updated: now}
}
