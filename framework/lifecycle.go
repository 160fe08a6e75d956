package framework

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/failpoint"
	"github.com/ephemera-csi/ephemera/framework/internal/logkeys"
	"github.com/ephemera-csi/ephemera/framework/internal/volume"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// nodePublishVolume implements csi.NodeServer (docs/design.md, "Lifecycle").
func (d *Driver) nodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	pr, err := d.parsePublish(req)
	if err != nil {
		return nil, err
	}
	release, err := d.begin(pr.vol.ID)
	if err != nil {
		return nil, err
	}
	defer release()
	ctx, cancel := context.WithTimeout(ctx, d.opts.Limits.OperationTimeout)
	defer cancel()
	log := klog.FromContext(ctx).WithValues(logkeys.Backend, pr.vol.Backend)
	ctx = klog.NewContext(ctx, log)

	rec, err := d.store.Get(ctx, pr.vol.ID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return d.publishNew(ctx, pr)
	case err != nil:
		return nil, transient(fmt.Errorf("reading volume state: %w", err))
	}
	switch {
	case rec.Phase == store.PhaseUnclaimed || rec.Rebuilt:
		// Storage the reconcile found without a record (kept unclaimed when no
		// pod had it: this is the pod it belongs to, as the handle is derived
		// from its UID and volume name), or a volume it adopted from the node.
		return d.publishRebuilt(ctx, pr, rec)
	case rec.Hash != pr.hash || !sameTarget(rec.TargetPath, pr.vol.TargetPath):
		return nil, kindf(api.ErrAlreadyExists, "volume %s is already published with different attributes, readOnly, fsType or fsGroup; the volume of a running pod cannot change: delete and recreate the pod", pr.vol.ID)
	}
	switch rec.Phase {
	case store.PhasePublished:
		return d.republish(ctx, pr, rec)
	default:
		// A publish or unpublish that was cut short and not yet reconciled (its
		// rollback failed earlier): finish tearing it down, then start afresh.
		log.Info("Finishing interrupted operation before publishing", logkeys.Phase, rec.Phase)
		if err := d.teardown(ctx, rec); err != nil {
			return nil, transient(fmt.Errorf("cleaning up an interrupted %s: %w", strings.ToLower(string(rec.Phase)), err))
		}
		return d.publishNew(ctx, pr)
	}
}

// republish handles a NodePublish for a volume already answered OK: the kubelet
// restarted, or the CSIDriver has requiresRepublish. It never unmounts a live
// volume. A volume whose mount vanished (node reboot, someone unmounted it) is
// repaired.
func (d *Driver) republish(ctx context.Context, pr *publishRequest, rec *store.Record) (*csi.NodePublishVolumeResponse, error) {
	log := klog.FromContext(ctx)
	mounted, err := d.mounter.IsMountPoint(d.opts.Node.KubeletRootDir, rec.TargetPath)
	if err != nil {
		return nil, transient(fmt.Errorf("checking target: %w", err))
	}
	if mounted {
		if d.contentFor(rec.Backend) == nil {
			log.V(2).Info("Volume already published")
			return &csi.NodePublishVolumeResponse{}, nil
		}
		// requiresRepublish or a kubelet restart: new content with the fresh
		// secrets and tokens. A failure never touches the live volume: it keeps
		// its last good content, the kubelet gets OK, and a retry is scheduled.
		v := pr.vol
		v.State = rec.State
		d.refresher.remember(v)
		if err := d.refreshContent(ctx, v); err != nil {
			d.refreshFailed(ctx, v.ID, err)
		} else {
			d.refresher.succeeded(v.ID)
			log.V(2).Info("Republished volume with refreshed content")
		}
		return &csi.NodePublishVolumeResponse{}, nil
	}
	log.Info("Published volume is not mounted; repairing")
	src, err := d.remount(ctx, pr, rec.State)
	if err != nil {
		// Keep the record: the kubelet retries or unpublishes.
		return nil, transient(fmt.Errorf("repairing volume: %w", err))
	}
	rec.Source, rec.State, rec.Updated = &src, pr.vol.State, time.Now().UTC()
	if err := d.store.Put(ctx, rec); err != nil {
		return nil, transient(fmt.Errorf("saving repaired volume: %w", err))
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

// remount publishes the storage of a volume that has a record but no mount
// (a node reboot, a crash before the mount, someone unmounted it): Create
// finds or re-creates the storage, then the whole of mountAndFill runs. A
// failure after the mount unmounts again, so that a retry repeats it all and
// never takes a half-finished mount for a published volume.
func (d *Driver) remount(ctx context.Context, pr *publishRequest, state map[string]string) (api.Source, error) {
	v := pr.vol
	v.State = state
	src, err := d.createStorage(ctx, pr.backend, v)
	if err != nil {
		return api.Source{}, fmt.Errorf("backend %s: creating storage: %w", v.Backend, err)
	}
	if err := d.mountAndFill(ctx, pr, src); err != nil {
		if uerr := d.mounter.Unmount(d.opts.Node.KubeletRootDir, v.TargetPath); uerr != nil {
			return api.Source{}, fmt.Errorf("%w; unmounting the unfinished volume: %w", err, uerr)
		}
		return api.Source{}, err
	}
	return src, nil
}

// publishRebuilt answers the first publish of a volume whose record the
// reconcile rebuilt from the node: after a lost state file, after a crash
// during a first publish that wrote no intent (needsIntent), or storage kept
// as unclaimed. Nothing tells whether the publish that mounted it finished,
// so it is finished now: a volume mounted at its target runs the steps after
// the mount again (finishMounted), one that is not is mounted (remount).
// Only then is the completed record saved; until then the record stays
// rebuilt and a retry does it all again (every step is idempotent).
func (d *Driver) publishRebuilt(ctx context.Context, pr *publishRequest, rec *store.Record) (*csi.NodePublishVolumeResponse, error) {
	full, err := completed(pr, rec)
	if err != nil {
		return nil, err
	}
	mounted, err := d.mounter.IsMountPoint(d.opts.Node.KubeletRootDir, full.TargetPath)
	if err != nil {
		return nil, transient(fmt.Errorf("checking target: %w", err))
	}
	if mounted {
		err = d.finishMounted(ctx, pr, rec.State)
	} else {
		var src api.Source
		if src, err = d.remount(ctx, pr, rec.State); err == nil {
			full.Source = &src
		}
	}
	if err != nil {
		return nil, transient(fmt.Errorf("finishing the publish of a volume rebuilt from the node: %w", err))
	}
	full.State = pr.vol.State
	if err := d.putRecord(ctx, pr.backend, full); err != nil {
		return nil, transient(fmt.Errorf("saving the completed record of a rebuilt volume: %w", err))
	}
	d.capacity.complete(rec, full)
	if d.contentFor(pr.vol.Backend) != nil {
		d.refresher.remember(pr.vol)
	}
	klog.FromContext(ctx).Info("Completed the record of a volume rebuilt from the node with its publish request", logkeys.Phase, rec.Phase)
	return &csi.NodePublishVolumeResponse{}, nil
}

// finishMounted runs the steps of a publish after the mount (fsGroup,
// content, read-only) again on a volume mounted at its target, whose publish
// may have been cut short after the mount. Unlike a refresh, a failure fails
// the publish: there may be no good content to keep.
func (d *Driver) finishMounted(ctx context.Context, pr *publishRequest, state map[string]string) (err error) {
	v := pr.vol
	v.State = state
	root := d.opts.Node.KubeletRootDir
	if v.ReadOnly && d.fills(v) {
		if err := d.mounter.SetReadOnly(root, v.TargetPath, false); err != nil {
			return fmt.Errorf("making volume writable to finish its publish: %w", err)
		}
	}
	err = d.fill(ctx, v)
	if v.ReadOnly {
		if rerr := d.mounter.SetReadOnly(root, v.TargetPath, true); rerr != nil {
			err = errors.Join(err, fmt.Errorf("making volume read-only: %w", rerr))
		}
	}
	return err
}

// publishNew is the first publish of a volume: the backend's plan (a
// Planner), durable intent (when the backend needs one: needsIntent, or the
// plan), backend, target, mount, content, durable completion. On failure
// everything is rolled back.
func (d *Driver) publishNew(ctx context.Context, pr *publishRequest) (resp *csi.NodePublishVolumeResponse, err error) {
	log := klog.FromContext(ctx)
	v := pr.vol
	defer func() {
		if err != nil {
			d.provisioningFailed(v, err) // after the rollback below settled err
		}
	}()
	for _, a := range d.authorizers(v.Backend) {
		if err := a.Authorize(ctx, v); err != nil {
			if errors.Is(err, api.ErrPermissionDenied) {
				return nil, kindf(api.ErrPermissionDenied, "pod %s/%s may not use this volume: %w", v.Pod.Namespace, v.Pod.Name, err)
			}
			if _, ok := status.FromError(err); ok {
				return nil, err
			}
			return nil, transient(fmt.Errorf("authorizing the volume: %w", err))
		}
	}
	if resp, handled, err := d.publishOverMount(ctx, pr); handled {
		return resp, err
	}
	if err := d.capacity.reserve(d.opts.DriverName, v.Backend, v.Size); err != nil {
		return nil, err
	}
	var intent, relax bool
	if p, ok := As[Planner](pr.backend); !ok {
		intent, relax = needsIntent(pr.backend), relaxed(pr.backend)
	} else {
		// What Create will do is decided once, here, and recorded in
		// v.State: the intent record and the decisions below follow it, not
		// a later answer of a backend that may have changed (a plugin
		// restarted as another version) or be down at teardown.
		plan, err := p.Plan(ctx, v)
		if err != nil {
			d.capacity.release(v.Backend, v.Size)
			return nil, fmt.Errorf("backend %s: planning the volume: %w", v.Backend, err)
		}
		_, finds := pr.backend.(Finder)
		relax = plan.MountOnly && finds
		intent = !relax
	}
	rec := newRecord(pr, store.PhasePublishing)
	rec.State = v.State
	if intent {
		if err := d.store.Put(ctx, rec); err != nil {
			d.capacity.release(v.Backend, v.Size)
			return nil, transient(fmt.Errorf("saving volume intent: %w", err))
		}
	}
	failpoint.Hit(failpoint.PublishBeforeCreate)

	defer func() {
		if err == nil {
			return
		}
		// Roll back with a fresh context: the request's may be what failed.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if uerr := d.teardown(rctx, rec); uerr != nil {
			if !intent {
				// The record the crash-free path did without: it keeps what is
				// left for the next operation on the volume or the reconcile.
				if perr := d.store.Put(rctx, rec); perr != nil {
					uerr = errors.Join(uerr, fmt.Errorf("saving the record of what is left: %w", perr))
				}
			}
			log.Error(uerr, "Rollback of failed publish incomplete; the volume is kept for cleanup")
			err = transient(fmt.Errorf("publish failed: %w; rollback incomplete: %w", err, uerr))
			return
		}
		log.V(2).Info("Rolled back failed publish")
	}()

	src, err := d.createStorage(ctx, pr.backend, v)
	rec.State = v.State // what the rollback's Delete needs, also of a failed Create
	if err != nil {
		return nil, fmt.Errorf("backend %s: creating storage: %w", v.Backend, err)
	}
	failpoint.Hit(failpoint.PublishAfterCreate)
	rec.Source = &src
	if err := d.mountAndFill(ctx, pr, src); err != nil {
		return nil, err
	}
	rec.Phase, rec.Updated = store.PhasePublished, time.Now().UTC()
	if err := d.putRecordRelaxed(ctx, relax, rec); err != nil {
		return nil, transient(fmt.Errorf("saving published volume: %w", err))
	}
	failpoint.Hit(failpoint.PublishAfterDone)
	if d.contentFor(v.Backend) != nil {
		d.refresher.remember(v)
	}
	log.V(2).Info("Published volume", logkeys.Size, v.Size)
	return &csi.NodePublishVolumeResponse{}, nil
}

// mountAndFill creates the target, publishes src there, writes the content and
// applies read-only.
func (d *Driver) mountAndFill(ctx context.Context, pr *publishRequest, src api.Source) error {
	v := pr.vol
	if err := d.mounter.MakeTarget(d.opts.Node.KubeletRootDir, v.TargetPath); err != nil {
		return fmt.Errorf("creating target: %w", err)
	}
	failpoint.Hit(failpoint.PublishAfterMkdir)
	src.MountOptions = d.opts.Volumes.MountOptions[v.Backend] // the operator's, never a backend's
	if err := d.mounter.Mount(d.opts.Node.KubeletRootDir, src, v.TargetPath); err != nil {
		return fmt.Errorf("publishing at target: %w", err)
	}
	failpoint.Hit(failpoint.PublishAfterMount)
	if err := d.fill(ctx, v); err != nil {
		return err
	}
	failpoint.Hit(failpoint.PublishAfterContent)
	if v.ReadOnly {
		if err := d.mounter.SetReadOnly(d.opts.Node.KubeletRootDir, v.TargetPath, true); err != nil {
			return fmt.Errorf("making volume read-only: %w", err)
		}
	}
	return nil
}

// fills reports whether fill writes into v.
func (d *Driver) fills(v *api.Volume) bool {
	return (v.FSGroup != nil && !isWindows) || d.contentFor(v.Backend) != nil
}

// fill gives a mounted volume to the pod's fsGroup and writes its content.
// Both steps are idempotent.
func (d *Driver) fill(ctx context.Context, v *api.Volume) error {
	if v.FSGroup != nil && !isWindows {
		if err := d.applyFSGroup(v.TargetPath, int(*v.FSGroup)); err != nil {
			return fmt.Errorf("applying fsGroup %d: %w", *v.FSGroup, err)
		}
	}
	if d.contentFor(v.Backend) != nil {
		files, release, err := d.content(ctx, v)
		if err != nil {
			return err
		}
		defer release()
		return d.writeContent(ctx, v, files)
	}
	return nil
}

// applyFSGroup gives the volume's root to the pod's fsGroup the way the kubelet
// does for volumes it owns: group ownership, group read/write/search, and setgid
// so new files inherit the group. The driver advertises VOLUME_MOUNT_GROUP, so the
// kubelet leaves this to the driver and never walks the volume itself.
func (d *Driver) applyFSGroup(target string, gid int) error {
	r, err := d.mounter.OpenTarget(d.opts.Node.KubeletRootDir, target)
	if err != nil {
		return err
	}
	defer r.Close()
	if err := r.Lchown(".", -1, gid); err != nil {
		return err
	}
	fi, err := r.Lstat(".")
	if err != nil {
		return err
	}
	return r.Chmod(".", fi.Mode().Perm()|0o070|fi.Mode()&fs.ModeSticky|fs.ModeSetgid)
}

// nodeUnpublishVolume implements csi.NodeServer. It works from the volume ID and
// target path alone and is OK when anything is already gone.
func (d *Driver) nodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, invalidArgf("volume_id is required")
	}
	if req.GetTargetPath() == "" {
		return nil, invalidArgf("target_path is required")
	}
	t, err := volume.ParseTarget(d.opts.Node.KubeletRootDir, req.GetTargetPath(), isWindows)
	if err != nil {
		return nil, invalidArgf("%v", err)
	}
	if err := t.CheckHandle(id); err != nil {
		return nil, invalidArgf("%v; nothing was touched", err)
	}
	release, err := d.begin(id)
	if err != nil {
		return nil, err
	}
	defer release()
	ctx, cancel := context.WithTimeout(ctx, d.opts.Limits.OperationTimeout)
	defer cancel()

	rec, err := d.store.Get(ctx, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		// Unknown volume: clean the target best-effort (a mount stacked by an
		// older driver, an empty directory) and succeed.
		rec = &store.Record{VolumeID: id, TargetPath: req.GetTargetPath(), Phase: store.PhaseUnpublishing}
		if err := d.unpublishTarget(rec.TargetPath); err != nil {
			return nil, err
		}
		return &csi.NodeUnpublishVolumeResponse{}, nil
	case err != nil:
		return nil, transient(fmt.Errorf("reading volume state: %w", err))
	}
	switch {
	case rec.Phase == store.PhaseUnclaimed:
		// The kubelet names the pod this storage belongs to: tear it down.
		rec.TargetPath = req.GetTargetPath()
	case !sameTarget(rec.TargetPath, req.GetTargetPath()):
		return nil, invalidArgf("volume %s is published at %s, not at %s; nothing was touched", id, rec.TargetPath, req.GetTargetPath())
	}
	// No intent is written: until the record is deleted, last, it says
	// Published, and a kubelet that got no OK retries (or the orphan GC,
	// once the pod is gone, tears down what is left). Every step of teardown
	// is OK when already done.
	if err := d.teardown(ctx, rec); err != nil {
		return nil, err
	}
	klog.FromContext(ctx).V(2).Info("Unpublished volume")
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// unpublishTarget unmounts everything at target and removes the directory.
func (d *Driver) unpublishTarget(target string) error {
	if err := d.mounter.Unmount(d.opts.Node.KubeletRootDir, target); err != nil {
		return fmt.Errorf("unmounting target: %w", err)
	}
	failpoint.Hit(failpoint.UnpublishAfterUnmount)
	if err := d.mounter.RemoveTarget(d.opts.Node.KubeletRootDir, target); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing target directory: %w", err)
	}
	failpoint.Hit(failpoint.UnpublishAfterRemoveDir)
	return nil
}

// teardown undoes everything a record stands for, in reverse order: unmount,
// target directory, backend storage, record. Every step is OK when already done,
// so it serves rollback, unpublish, reconcile and retries alike.
func (d *Driver) teardown(ctx context.Context, rec *store.Record) error {
	if err := d.unpublishTarget(rec.TargetPath); err != nil {
		return err
	}
	if b, ok := d.opts.Backends[rec.Backend]; ok {
		v := d.fromRecord(rec)
		if err := d.refuseIfMounted(ctx, b, v, rec.Source); err != nil {
			return err
		}
		if err := d.deleteStorage(ctx, b, v); err != nil {
			return fmt.Errorf("backend %s: deleting storage: %w", rec.Backend, err)
		}
	} else if rec.Backend != "" {
		return fmt.Errorf("volume uses backend %q, which this driver no longer has; re-enable it to clean up", rec.Backend)
	}
	failpoint.Hit(failpoint.UnpublishAfterDelete)
	if err := d.deleteRecord(ctx, d.opts.Backends[rec.Backend], rec.VolumeID); err != nil {
		return transient(fmt.Errorf("deleting volume record: %w", err))
	}
	d.capacity.release(rec.Backend, rec.Size)
	d.refresher.forget(rec.VolumeID)
	failpoint.Hit(failpoint.UnpublishAfterRecordGone)
	return nil
}

// relaxed reports whether the records of backend b are written without waiting
// for the disk (store.Relaxed): its volumes are nothing but their mounts
// (MountOnly, with a Finder). A power loss takes such a volume anyway, and
// after a crash of the driver its record is in the page cache, or rebuilt from
// the mount table (needsIntent). The fdatasync a durable commit waits for was
// the largest single cost of a tmpfs publish and unpublish (docs/design.md,
// "Durability").
func relaxed(b Backend) bool {
	finds, mountOnly := implements[Finder](b), implements[MountOnly](b)
	return finds && mountOnly
}

// putRecord saves rec of a volume of backend b: relaxed when b allows it and
// the store can, durably otherwise.
func (d *Driver) putRecord(ctx context.Context, b Backend, rec *store.Record) error {
	return d.putRecordRelaxed(ctx, relaxed(b), rec)
}

// putRecordRelaxed saves rec, relaxed when relax and the store can.
func (d *Driver) putRecordRelaxed(ctx context.Context, relax bool, rec *store.Record) error {
	if rs, ok := d.store.(store.Relaxed); ok && relax {
		return rs.PutRelaxed(ctx, rec)
	}
	return d.store.Put(ctx, rec)
}

// deleteRecord deletes the record id of a volume of backend b (nil when the
// driver no longer has it), as putRecord saves it.
func (d *Driver) deleteRecord(ctx context.Context, b Backend, id string) error {
	if rs, ok := d.store.(store.Relaxed); ok && b != nil && relaxed(b) {
		return rs.DeleteRelaxed(ctx, id)
	}
	return d.store.Delete(ctx, id)
}
