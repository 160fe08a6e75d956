package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/errkind"
	"github.com/ephemera-csi/ephemera/framework/internal/metrics"
	"github.com/ephemera-csi/ephemera/framework/internal/volume"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// This file holds the lifecycle's calls into the backend and the store
// (lifecycle.go names them): Create, Delete and List timed, what a Finder
// finds, the refusal to delete storage that is mounted anywhere, and how a
// record is written (durably, or relaxed).

// createStorage is Backend.Create, timed.
func (d *Engine) createStorage(ctx context.Context, b Backend, v *api.Volume) (api.Source, error) {
	start := time.Now()
	src, err := b.Create(ctx, v)
	d.metrics.ObserveBackend(v.Backend, metrics.OpCreate, err, time.Since(start))
	return src, err
}

// deleteStorage is Backend.Delete, timed.
func (d *Engine) deleteStorage(ctx context.Context, b Backend, v *api.Volume) error {
	start := time.Now()
	err := b.Delete(ctx, v)
	d.metrics.ObserveBackend(v.Backend, metrics.OpDelete, err, time.Since(start))
	return err
}

// listStorage is Lister.List, timed.
func (d *Engine) listStorage(ctx context.Context, backend string, l Lister) ([]string, error) {
	start := time.Now()
	ids, err := l.List(ctx)
	d.metrics.ObserveBackend(backend, metrics.OpList, err, time.Since(start))
	return ids, err
}

// storeID returns the state store's identity, "" for a store without one.
func (d *Engine) storeID() string {
	if s, ok := d.store.(store.Identifier); ok {
		return s.ID()
	}
	return ""
}

// findStorage asks a Finder backend which source v's existing storage is
// mounted from. found is false when the backend has none (or cannot tell).
func (d *Engine) findStorage(ctx context.Context, b Backend, v *api.Volume) (src api.Source, found bool, err error) {
	f := b.Finder()
	if f == nil {
		return api.Source{}, false, nil
	}
	src, err = f.Find(ctx, v)
	switch {
	case err == nil:
		return src, true, nil
	case errors.Is(err, api.ErrNotFound):
		return api.Source{}, false, nil
	default:
		return api.Source{}, false, fmt.Errorf("backend %s: finding the storage of volume %s: %w", v.Backend, v.ID, err)
	}
}

// refuseIfMounted fails with ErrBusy (Aborted: the kubelet retries) when the
// mount table shows v's storage mounted anywhere: deleting it would take data
// from whoever uses that mount. The source checked is what the backend finds
// now (a Finder), else the one recorded at publish.
func (d *Engine) refuseIfMounted(ctx context.Context, b Backend, v *api.Volume, recorded *api.Source) error {
	src, found, err := d.findStorage(ctx, b, v)
	if err != nil {
		return errkind.Transient(err)
	}
	if b.Finder() == nil && recorded != nil {
		src, found = *recorded, true
	}
	if !found {
		return nil
	}
	all, err := d.mounter.MountedAt(src)
	if err != nil {
		return errkind.Transient(fmt.Errorf("checking whether the storage of volume %s is mounted: %w", v.ID, err))
	}
	var where []string
	for _, p := range all {
		// A backend may publish one source for several volumes (a shared
		// directory); another volume's target showing it does not pin it.
		if !d.otherVolumesTarget(p, v.ID) {
			where = append(where, p)
		}
	}
	if len(where) > 0 {
		sort.Strings(where)
		return fmt.Errorf("%w: the storage of volume %s is still mounted at %s; it is not deleted while mounted (unmount it, or wait for the pod using it to end)",
			api.ErrBusy, v.ID, strings.Join(where, ", "))
	}
	return nil
}

// otherVolumesTarget reports whether p (a mount point as the mount table
// shows it) is the target of an inline volume other than id.
func (d *Engine) otherVolumesTarget(p, id string) bool {
	for _, root := range []string{d.cfg.Node.KubeletRootDir, d.realRoot()} {
		if t, err := volume.ParseTarget(root, p, isWindows); err == nil {
			return t.Handle() != id
		}
	}
	return false
}

// realRoot is the kubelet root with symbolic links resolved, as the mount
// table shows paths below it.
func (d *Engine) realRoot() string {
	if r, err := filepath.EvalSymlinks(d.cfg.Node.KubeletRootDir); err == nil {
		return r
	}
	return d.cfg.Node.KubeletRootDir
}

// needsIntent reports whether the first publish of a volume of b writes its
// record before creating anything. It need not when the node itself shows
// everything a crash can leave behind: b recognises its storage by source
// (Finder) and either lists it (Lister) or has none outside the mount
// (MountOnly), and a mount at the target is adopted from the mount table; the
// kubelet's vol_data.json, written before it calls NodePublishVolume and
// removed only after a successful NodeUnpublishVolume, names the pod. The
// startup reconcile then rebuilds the record (unrecordedMounts,
// unrecordedStorage) and the kubelet's retry finishes the publish (the
// republish of a rebuilt record: completeMounted, completeUnmounted), or the
// storage goes with its pod. One durable commit less per publish.
func needsIntent(b Backend) bool {
	if b.Finder() == nil {
		return true
	}
	lists, mountOnly := b.Lister() != nil, b.MountOnly()
	return !lists && !mountOnly
}

// relaxed reports whether the records of backend b are written without waiting
// for the disk (store.Relaxed): its volumes are nothing but their mounts
// (MountOnly, with a Finder). A power loss takes such a volume anyway, and
// after a crash of the driver its record is in the page cache, or rebuilt from
// the mount table (needsIntent). The fdatasync a durable commit waits for was
// the largest single cost of a tmpfs publish and unpublish (docs/design.md,
// "Durability").
func relaxed(b Backend) bool {
	finds, mountOnly := b.Finder() != nil, b.MountOnly()
	return finds && mountOnly
}

// putRecord saves rec of a volume of backend b: relaxed when b allows it and
// the store can, durably otherwise.
func (d *Engine) putRecord(ctx context.Context, b Backend, rec *store.Record) error {
	return d.putRecordRelaxed(ctx, relaxed(b), rec)
}

// putRecordRelaxed saves rec, relaxed when relax and the store can.
func (d *Engine) putRecordRelaxed(ctx context.Context, relax bool, rec *store.Record) error {
	if rs, ok := d.store.(store.Relaxed); ok && relax {
		return rs.PutRelaxed(ctx, rec)
	}
	return d.store.Put(ctx, rec)
}

// deleteRecord deletes the record id of a volume of backend b (nil when the
// driver no longer has it), as putRecord saves it.
func (d *Engine) deleteRecord(ctx context.Context, b Backend, id string) error {
	if rs, ok := d.store.(store.Relaxed); ok && b != nil && relaxed(b) {
		return rs.DeleteRelaxed(ctx, id)
	}
	return d.store.Delete(ctx, id)
}
