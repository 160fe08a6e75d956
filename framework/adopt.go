package framework

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/logkeys"
	"github.com/ephemera-csi/ephemera/framework/internal/metrics"
	"github.com/ephemera-csi/ephemera/framework/internal/volume"
	"github.com/ephemera-csi/ephemera/framework/mount"
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

// volDataMax bounds what is read of a vol_data.json (the kubelet's is ~300 bytes).
const volDataMax = 64 << 10

// sameTarget reports whether two target paths name the same target.
func sameTarget(a, b string) bool { return volume.SameTarget(a, b, isWindows) }

// storeID returns the state store's identity, "" for a store without one.
func (d *Driver) storeID() string {
	if s, ok := d.store.(store.Identifier); ok {
		return s.ID()
	}
	return ""
}

// findStorage asks a Finder backend which source v's existing storage is
// mounted from. found is false when the backend has none (or cannot tell).
func (d *Driver) findStorage(ctx context.Context, b Backend, v *api.Volume) (src api.Source, found bool, err error) {
	f, ok := As[Finder](b)
	if !ok {
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
func (d *Driver) refuseIfMounted(ctx context.Context, b Backend, v *api.Volume, recorded *api.Source) error {
	src, found, err := d.findStorage(ctx, b, v)
	if err != nil {
		return transient(err)
	}
	if !implements[Finder](b) && recorded != nil {
		src, found = *recorded, true
	}
	if !found {
		return nil
	}
	all, err := d.mounter.MountedAt(src)
	if err != nil {
		return transient(fmt.Errorf("checking whether the storage of volume %s is mounted: %w", v.ID, err))
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
func (d *Driver) otherVolumesTarget(p, id string) bool {
	for _, root := range []string{d.opts.Node.KubeletRootDir, d.realRoot()} {
		if t, err := volume.ParseTarget(root, p, isWindows); err == nil {
			return t.Handle() != id
		}
	}
	return false
}

// realRoot is the kubelet root with symbolic links resolved, as the mount
// table shows paths below it.
func (d *Driver) realRoot() string {
	if r, err := filepath.EvalSymlinks(d.opts.Node.KubeletRootDir); err == nil {
		return r
	}
	return d.opts.Node.KubeletRootDir
}

// publishOverMount handles a first publish whose target is already a mount
// point, which Ephemera never mounts over. When the mount shows this volume's
// own storage (its record was lost), the volume is adopted: recorded as
// published for this request, refreshed like a republish, and answered OK.
// Anything else is refused with FailedPrecondition and left as it is. handled
// is false when the target is not a mount point.
func (d *Driver) publishOverMount(ctx context.Context, pr *publishRequest) (resp *csi.NodePublishVolumeResponse, handled bool, err error) {
	v := pr.vol
	root := d.opts.Node.KubeletRootDir
	mounted, err := d.mounter.IsMountPoint(root, v.TargetPath)
	if err != nil {
		if errors.Is(err, mount.ErrSymlink) {
			return nil, true, err
		}
		return nil, true, transient(fmt.Errorf("checking target: %w", err))
	}
	if !mounted {
		return nil, false, nil
	}
	mt, err := d.mounter.Inspect(root, v.TargetPath)
	if err != nil {
		return nil, true, transient(fmt.Errorf("inspecting the mount at the target: %w", err))
	}
	if mt == nil {
		return nil, false, nil // unmounted meanwhile
	}
	src, found, err := d.findStorage(ctx, pr.backend, v)
	if err != nil {
		return nil, true, transient(err)
	}
	ours := false
	if found {
		if ours, err = d.mounter.Shows(mt, src); err != nil {
			return nil, true, transient(fmt.Errorf("comparing the mount at the target with the volume's storage: %w", err))
		}
	}
	if !ours {
		return nil, true, kindf(errFailedPrecondition,
			"target %s is already a mount point (%s %s) that is not this volume's %s storage; Ephemera never mounts over another mount: unmount it, or delete and recreate the pod",
			v.TargetPath, mt.FSType, mt.Source, v.Backend)
	}
	// Whatever mounted it may not have finished (fsGroup, content, read-only).
	if err := d.finishMounted(ctx, pr, nil); err != nil {
		return nil, true, transient(fmt.Errorf("finishing the publish of the volume mounted at its target: %w", err))
	}
	rec := newRecord(pr, store.PhasePublished)
	rec.Source, rec.State = &src, v.State
	if err := d.store.Put(ctx, rec); err != nil {
		return nil, true, transient(fmt.Errorf("saving adopted volume: %w", err))
	}
	d.capacity.adopt(v.Backend, v.Size)
	if d.contentFor(v.Backend) != nil {
		d.refresher.remember(v)
	}
	d.metrics.Reconciled(metrics.ReconcileAdopted)
	klog.FromContext(ctx).Info("Adopted the volume already mounted at its target (its record was missing)")
	return &csi.NodePublishVolumeResponse{}, true, nil
}

// newRecord is the record of a validated request.
func newRecord(pr *publishRequest, phase store.Phase) *store.Record {
	v, now := pr.vol, time.Now().UTC()
	return &store.Record{
		VolumeID:   v.ID,
		VolumeName: v.Name,
		TargetPath: v.TargetPath,
		Pod:        v.Pod,
		Backend:    v.Backend,
		Params:     pr.params,
		Hash:       pr.hash,
		Size:       v.Size,
		FSType:     v.FSType,
		ReadOnly:   v.ReadOnly,
		FSGroup:    v.FSGroup,
		Phase:      phase,
		Created:    now,
		Updated:    now,
	}
}

// completed is a rebuilt (or unclaimed) record filled from the first request
// that names its volume: everything the node could not tell. The backend must
// be the one the storage was found in (when it was identified).
func completed(pr *publishRequest, rec *store.Record) (*store.Record, error) {
	v := pr.vol
	if rec.Backend != "" && rec.Backend != v.Backend {
		return nil, kindf(api.ErrAlreadyExists, "volume %s exists on this node with backend %s, and the request asks for %s; the volume of a running pod cannot change: delete and recreate the pod",
			v.ID, rec.Backend, v.Backend)
	}
	full := newRecord(pr, store.PhasePublished)
	full.Source, full.State, full.Created = rec.Source, rec.State, rec.Created
	return full, nil
}

// needsIntent reports whether the first publish of a volume of b writes its
// record before creating anything. It need not when the node itself shows
// everything a crash can leave behind: b recognises its storage by source
// (Finder) and either lists it (Lister) or has none outside the mount
// (MountOnly), and a mount at the target is adopted from the mount table; the
// kubelet's vol_data.json, written before it calls NodePublishVolume and
// removed only after a successful NodeUnpublishVolume, names the pod. The
// startup reconcile then rebuilds the record (adoptPublished, adoptInventory)
// and the kubelet's retry finishes the publish (publishRebuilt), or the
// storage goes with its pod. One durable commit less per publish.
func needsIntent(b Backend) bool {
	if !implements[Finder](b) {
		return true
	}
	lists, mountOnly := implements[Lister](b), implements[MountOnly](b)
	return !lists && !mountOnly
}

// readVolData reads the kubelet's vol_data.json beside target (resolved
// beneath the kubelet root) and returns its driver name and volume handle.
func (d *Driver) readVolData(target string) (driver, handle string, err error) {
	r, err := d.mounter.OpenTarget(d.opts.Node.KubeletRootDir, filepath.Dir(target))
	if err != nil {
		return "", "", err
	}
	defer r.Close()
	f, err := r.Open(volume.VolDataFile)
	if err != nil {
		return "", "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, volDataMax))
	if err != nil {
		return "", "", err
	}
	var m map[string]string
	if err := json.Unmarshal(b, &m); err != nil {
		return "", "", fmt.Errorf("%s beside %s: %w", volume.VolDataFile, target, err)
	}
	return m["driverName"], m["volumeHandle"], nil
}

// ownedTarget reports whether target is one of this driver's inline volumes
// according to the kubelet: its vol_data.json names this driver and the handle
// derived from the target. It returns the parsed target and the handle.
func (d *Driver) ownedTarget(t string) (volume.Target, string, bool) {
	pt, err := volume.ParseTarget(d.opts.Node.KubeletRootDir, t, isWindows)
	if err != nil {
		return volume.Target{}, "", false
	}
	id := pt.Handle()
	driver, handle, err := d.readVolData(t)
	if err != nil || driver != d.opts.DriverName || handle != id {
		return volume.Target{}, "", false
	}
	return pt, id, true
}

// volDataIndex maps the handles of this driver's inline volumes that the
// kubelet has on this node (pods/*/volumes/kubernetes.io~csi/*/vol_data.json)
// to their targets.
func (d *Driver) volDataIndex() (map[string]string, error) {
	root := d.opts.Node.KubeletRootDir
	podsDir := filepath.Join(root, volume.PodsDir)
	r, err := d.mounter.OpenTarget(root, podsDir)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]string{}, nil
	}
	if err != nil {
		return nil, err
	}
	defer r.Close()
	fsys := r.FS()
	uids, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, err
	}
	index := map[string]string{}
	for _, u := range uids {
		if !u.IsDir() || !volume.ValidUID(u.Name()) {
			continue
		}
		csiDir := path.Join(u.Name(), volume.VolumesDir, volume.PluginDir)
		vols, err := fs.ReadDir(fsys, csiDir)
		if err != nil {
			continue
		}
		for _, vol := range vols {
			if !vol.IsDir() {
				continue
			}
			t := volume.TargetPath(root, u.Name(), vol.Name())
			if _, id, ok := d.ownedTarget(t); ok {
				index[id] = t
			}
		}
	}
	return index, nil
}

// adoptPublished records every volume of this driver that is published at its
// target (the mount table, or links on Windows) but has no record: the state
// was lost while pods used the volumes.
func (d *Driver) adoptPublished(ctx context.Context, known map[string]bool) error {
	log := d.opts.Observability.Logger.WithName("reconcile")
	root := d.opts.Node.KubeletRootDir
	targets, err := d.mounter.Published(root)
	if err != nil {
		return fmt.Errorf("listing published targets: %w", err)
	}
	for _, t := range targets {
		// Known volumes first, without reading their vol_data.json: at startup
		// on a full node nearly every target is.
		if pt, err := volume.ParseTarget(root, t, isWindows); err != nil || known[pt.Handle()] {
			continue
		}
		pt, id, ok := d.ownedTarget(t)
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
		for _, name := range backendNames(d.opts.Backends) {
			v := &api.Volume{ID: id, Name: pt.VolumeName, TargetPath: t, Backend: name, Pod: rec.Pod}
			src, found, err := d.findStorage(ctx, d.opts.Backends[name], v)
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
				if u, err := filesystemUsage(r, t); err == nil {
					rec.Size = u.bytesTotal
				}
				r.Close()
			}
		}
		if err := d.store.Put(ctx, rec); err != nil {
			return fmt.Errorf("saving the rebuilt record of volume %s: %w", id, err)
		}
		known[id] = true
		d.capacity.adopt(rec.Backend, rec.Size)
		d.metrics.Reconciled(metrics.ReconcileAdopted)
		if rec.Backend == "" {
			vlog.Info("Adopted a published volume without a record; its backend could not be identified, so its storage (if any) is not freed at unpublish", logkeys.FSType, mt.FSType, logkeys.Source, mt.Source)
			continue
		}
		vlog.Info("Adopted a published volume without a record", logkeys.Backend, rec.Backend, logkeys.Size, rec.Size)
	}
	return nil
}

// adoptInventory compares one backend's inventory with the records. Storage
// whose pod still has the volume on this node (its vol_data.json) is adopted as
// a published volume that is not mounted (a republish mounts it again, an
// unpublish or the orphan GC removes it). Other storage without a record is
// deleted only when the backend's stamp proves the store has known the area
// all along and nothing mounts it; otherwise it is kept as unclaimed. When
// every piece of storage has a record afterwards, the area is stamped with the
// store's identity.
func (d *Driver) adoptInventory(ctx context.Context, name string, b Backend, known map[string]bool, index func() (map[string]string, error)) (failed []error) {
	log := d.opts.Observability.Logger.WithName("reconcile").WithValues(logkeys.Backend, name)
	lister, ok := As[Lister](b)
	if !ok {
		return nil
	}
	ids, err := d.listStorage(ctx, name, lister)
	if err != nil {
		log.Error(err, "Listing backend inventory")
		d.metrics.Reconciled(metrics.ReconcileFailed)
		return []error{err}
	}
	storeID := d.storeID()
	stamper, isStamper := As[Stamper](b)
	proven := false
	if isStamper && storeID != "" {
		st, err := stamper.Stamp(ctx)
		if err != nil {
			log.Error(err, "Reading the storage stamp; storage without a record is kept")
		}
		proven = err == nil && st == storeID
	}
	for _, id := range ids {
		if known[id] {
			continue
		}
		vlog := log.WithValues(logkeys.VolumeID, id)
		idx, err := index()
		if err != nil {
			vlog.Error(err, "Reading the kubelet's volumes; storage without a record is kept")
			failed = append(failed, err)
			continue
		}
		if t, ok := idx[id]; ok {
			pt, _ := volume.ParseTarget(d.opts.Node.KubeletRootDir, t, isWindows)
			rec := d.rebuiltRecord(id, name, store.PhasePublished)
			rec.VolumeName, rec.TargetPath, rec.Pod = pt.VolumeName, t, api.Pod{UID: pt.PodUID}
			if err := d.keep(ctx, rec); err != nil {
				failed = append(failed, err)
				continue
			}
			known[id] = true
			d.metrics.Reconciled(metrics.ReconcileAdopted)
			vlog.Info("Adopted storage without a record: its pod still has the volume (a republish mounts it again)", logkeys.TargetPath, t)
			continue
		}
		if proven {
			v := volume.Orphan(id, name)
			err := d.refuseIfMounted(ctx, b, v, nil)
			if err == nil {
				err = d.deleteStorage(ctx, b, v)
			}
			if err != nil {
				vlog.Error(err, "Deleting storage without a record")
				d.metrics.Reconciled(metrics.ReconcileFailed)
				failed = append(failed, err)
				continue
			}
			d.metrics.Reconciled(metrics.ReconcileOrphanDeleted)
			vlog.Info("Deleted storage without a record")
			continue
		}
		rec := d.rebuiltRecord(id, name, store.PhaseUnclaimed)
		if err := d.keep(ctx, rec); err != nil {
			failed = append(failed, err)
			continue
		}
		known[id] = true
		d.metrics.Reconciled(metrics.ReconcileUnclaimed)
		vlog.Info("Kept storage without a record or a pod as unclaimed: this state store cannot prove it a leftover (see docs/operations.md, 'Unclaimed storage')")
	}
	if isStamper && storeID != "" && !proven && len(failed) == 0 {
		if err := stamper.SetStamp(ctx, storeID); err != nil {
			log.Error(err, "Stamping the storage area with the state store's identity; storage without a record stays protected")
		} else {
			log.Info("Stamped the storage area with the state store's identity", logkeys.Store, storeID)
		}
	}
	return failed
}

// rebuiltRecord is the record of storage found without one.
func (d *Driver) rebuiltRecord(id, backend string, phase store.Phase) *store.Record {
	now := time.Now().UTC()
	return &store.Record{VolumeID: id, Backend: backend, Phase: phase, Rebuilt: true, Created: now, Updated: now}
}

// keep saves a rebuilt record and accounts its storage.
func (d *Driver) keep(ctx context.Context, rec *store.Record) error {
	if err := d.store.Put(ctx, rec); err != nil {
		return fmt.Errorf("saving the rebuilt record of volume %s: %w", rec.VolumeID, err)
	}
	d.capacity.adopt(rec.Backend, rec.Size)
	return nil
}

// adopt accounts a volume that exists whatever the budget says (adopted, not
// admitted): it never fails.
func (c *capacity) adopt(backend string, size int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.volumes++
	c.count[backend]++
	c.bytesOf(backend).add(size)
}

// resize changes the size accounted for one volume of backend.
func (c *capacity) resize(backend string, from, to int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.bytesOf(backend)
	s.sub(from)
	s.add(to)
}

// complete moves the capacity a rebuilt record accounted for to what its
// completed record says.
func (c *capacity) complete(rebuilt, full *store.Record) {
	if rebuilt.Backend == "" {
		c.adopt(full.Backend, full.Size)
		c.releaseUnknown()
		return
	}
	c.resize(full.Backend, rebuilt.Size, full.Size)
}

// releaseUnknown drops a volume accounted under no backend (a rebuilt record
// whose backend was unknown until its publish named it).
func (c *capacity) releaseUnknown() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.volumes = max(c.volumes-1, 0)
	c.count[""] = max(c.count[""]-1, 0)
	if c.count[""] == 0 {
		delete(c.count, "")
		delete(c.used, "")
	}
}
