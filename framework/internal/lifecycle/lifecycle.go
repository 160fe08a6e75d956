package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/failpoint"
	"github.com/ephemera-csi/ephemera/framework/internal/errkind"
	"github.com/ephemera-csi/ephemera/framework/internal/lanes"
	"github.com/ephemera-csi/ephemera/framework/internal/logkeys"
	"github.com/ephemera-csi/ephemera/framework/internal/metrics"
	"github.com/ephemera-csi/ephemera/framework/internal/provision"
	"github.com/ephemera-csi/ephemera/framework/internal/reconcile"
	"github.com/ephemera-csi/ephemera/framework/internal/refresh"
	"github.com/ephemera-csi/ephemera/framework/internal/storage"
	"github.com/ephemera-csi/ephemera/framework/internal/volume"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// This file owns the life of a volume (docs/design.md, "Lifecycle"). A volume
// is in one of the states below, read from its record (stateOf); six events
// move it (publish, republish, unpublish, reconcile, gc, refresh), each with
// one function here that reads the state, decides which case of the event it
// is (a cond) and fires the one row of the transition table for it. Every
// step of every transition is in this file; it calls down into its
// collaborators at named points and nothing it calls calls back into it:
//
//   - the store: d.store, and d.storage's PutRecord, DeleteRecord
//     (internal/storage);
//   - the backend: d.storage's Create, Delete, Find, RefuseIfMounted
//     (internal/storage), through Backend (backend.go);
//   - the mounter: d.mounter;
//   - capacity: d.capacity (internal/capacity), the content capacity
//     d.lanes.Held (internal/lanes) and d.fill's CountHeld (internal/fill);
//   - content: d.fill's Fill, Refresh (internal/fill), the refresher's
//     credentials (internal/refresh);
//   - the node view of the reconcile: d.node's UnrecordedMounts,
//     UnrecordedStorage, StampArea (internal/reconcile), whose findings
//     Reconcile fires by kind (foundCases);
//   - events and metrics: events.go, d.metrics.
//
// The event functions are entered only from the event sources: Engine's
// Publish (request.go), Unpublish and Reconcile below, which package
// framework calls for the CSI handlers, Run's startup and RebuildState; the
// orphan GC (internal/reconcile's GC, which New hands collectOrphan) and the
// refresher's timers (internal/refresh, which New hands refreshVolume).
// Every collaborator is a package below this one, so none can call back:
// the import graph says so (framework/layers_test.go, TestLayers). The
// package's other files are those event sources and the wiring of the
// collaborators (engine.go, config.go, reconcile.go, provisioning.go,
// lanes.go, events.go).

// volState is where a volume is in its life, as its record says (stateOf).
type volState string

const (
	// stateNone: no record. Nothing was published, or the volume is gone.
	stateNone volState = "none"
	// statePublishing: the intent of a first publish (store.PhasePublishing),
	// or the record of what a failed rollback left. Cut short: rolled back.
	statePublishing volState = "publishing"
	// statePublished: mounted and populated, answered OK (store.PhasePublished).
	statePublished volState = "published"
	// stateUnpublishing: the intent of a teardown, written by older versions
	// only (store.PhaseUnpublishing). Cut short: rolled back.
	stateUnpublishing volState = "unpublishing"
	// stateRebuilt: a record the reconcile rebuilt from the node (adopted:
	// Rebuilt, phase Published), which lacks what only the request carried.
	stateRebuilt volState = "rebuilt"
	// stateUnclaimed: storage found without a record or a pod
	// (store.PhaseUnclaimed), kept until a publish claims it.
	stateUnclaimed volState = "unclaimed"
)

// volStates lists every state, in the order the table is read.
var volStates = []volState{stateNone, statePublishing, statePublished, stateUnpublishing, stateRebuilt, stateUnclaimed}

// stateOf is the state a record stands for (nil: stateNone). Rebuilt is only
// ever written with PhasePublished or PhaseUnclaimed; a phase this version
// does not know is an operation cut short, as PhasePublishing.
func stateOf(rec *store.Record) volState {
	switch {
	case rec == nil:
		return stateNone
	case rec.Phase == store.PhaseUnclaimed:
		return stateUnclaimed
	case rec.Rebuilt:
		return stateRebuilt
	case rec.Phase == store.PhasePublished:
		return statePublished
	case rec.Phase == store.PhaseUnpublishing:
		return stateUnpublishing
	default:
		return statePublishing
	}
}

// event is what moves a volume.
type event string

const (
	// evPublish: a NodePublishVolume of a volume without a record.
	evPublish event = "publish"
	// evRepublish: a NodePublishVolume of a volume with a record (the
	// kubelet's retry, requiresRepublish, a kubelet restart, or the first
	// publish of a rebuilt or unclaimed volume).
	evRepublish event = "republish"
	// evUnpublish: a NodeUnpublishVolume.
	evUnpublish event = "unpublish"
	// evReconcile: the startup reconcile, once per record and once per
	// volume the node shows without one.
	evReconcile event = "reconcile"
	// evGC: the orphan GC found the volume's pod gone (internal/reconcile's
	// GC decides which).
	evGC event = "gc"
	// evRefresh: a driver-initiated content refresh (Refresh, RefreshAll,
	// RefreshInterval, a retry).
	evRefresh event = "refresh"
)

var allEvents = []event{evPublish, evRepublish, evUnpublish, evReconcile, evGC, evRefresh}

// cond is the case of an event in a state, as the event function finds it.
type cond string

const (
	whenAlways        cond = ""
	whenTargetFree    cond = "target is not a mount point"
	whenOwnMount      cond = "target is a mount of this volume's storage (its record was lost)"
	whenOtherMount    cond = "target is another mount"
	whenChanged       cond = "the request differs (attributes, readOnly, fsType, fsGroup, target)"
	whenSameMounted   cond = "same request, target mounted, no content"
	whenSameRefresh   cond = "same request, target mounted, content"
	whenSameUnmounted cond = "same request, target not mounted"
	whenSame          cond = "same request"
	whenProvisioning  cond = "same request, its Create runs in the background (long provisioning: provisioning.go)"
	whenMounted       cond = "target mounted"
	whenUnmounted     cond = "target not mounted"
	whenOtherTarget   cond = "the request names another target"
	whenItsTarget     cond = "the request names its target"
	whenFoundMounted  cond = "published at its target (vol_data.json names this driver)"
	whenFoundPodded   cond = "backend storage whose pod has the volume (vol_data.json)"
	whenFoundProven   cond = "backend storage the stamp proves a leftover"
	whenFoundUnproven cond = "backend storage, no pod, not provably a leftover"
	whenPodGone       cond = "its pod is gone (internal/reconcile: grace period, API check)"
	whenRefreshable   cond = "target mounted, content, not rebuilt"
	whenStale         cond = "anything else"
)

// foundCases are the reconcile event's cases of what the node shows without
// a record (reconcile.Node's findings, by kind).
var foundCases = map[reconcile.Kind]cond{
	reconcile.FoundMounted:  whenFoundMounted,
	reconcile.FoundPodded:   whenFoundPodded,
	reconcile.FoundProven:   whenFoundProven,
	reconcile.FoundUnproven: whenFoundUnproven,
}

// op is what a transition works on. Which fields are set depends on the event.
type op struct {
	pr     *publishRequest // publish, republish
	rec    *store.Record   // the record (absent for publish; rebuilt for a reconcile finding)
	full   *store.Record   // republish of rebuilt or unclaimed: the record completed from pr
	id     string          // refresh: the volume's ID
	target string          // unpublish: the request's target path
	src    api.Source      // publish over its own mount: the storage the target shows
	mt     *mount.Mounted  // publish over another mount: what the target shows
	b      Backend         // reconcile of found storage: its backend
	log    klog.Logger     // reconcile: the volume's logger
}

// transition is one row of the table: in a state of From, event On in case
// When does run, described as Do, leaving the volume in To.
type transition struct {
	From []volState
	On   event
	When cond
	Do   string
	To   string
	run  func(d *Engine, ctx context.Context, o *op) error
}

// transitions is the life of a volume. An error before a row runs (a store or
// mount table that cannot be read, an Authorizer's refusal, bad input) leaves
// the state as it was; To says what a row's failure leaves. It is set by init,
// as its actions reach fire again (a refresh retry's timer, a publish after
// an interrupted operation).
var transitions []transition

func init() { transitions = lifecycleTable() }

func lifecycleTable() []transition {
	return []transition{
		// A first publish: Authorizers approve, then the target decides.
		{From: []volState{stateNone}, On: evPublish, When: whenTargetFree,
			Do:  "create: reserve capacity, [intent], Create, mount, fsGroup, content, read-only, save",
			To:  "published; none after a rollback (publishing when the rollback is incomplete)",
			run: (*Engine).createVolume},
		{From: []volState{stateNone}, On: evPublish, When: whenOwnMount,
			Do:  "adopt: fsGroup, content, read-only again, save",
			To:  "published",
			run: (*Engine).adoptMounted},
		{From: []volState{stateNone}, On: evPublish, When: whenOtherMount,
			Do:  "refuse FailedPrecondition (never mount over a mount)",
			To:  "none",
			run: (*Engine).refuseOtherMount},

		{From: []volState{statePublished, statePublishing, stateUnpublishing}, On: evRepublish, When: whenChanged,
			Do:  "refuse AlreadyExists",
			To:  "unchanged",
			run: (*Engine).refuseChanged},
		{From: []volState{statePublished}, On: evRepublish, When: whenSameMounted,
			Do:  "answer OK (nothing is remounted)",
			To:  "published",
			run: (*Engine).alreadyPublished},
		{From: []volState{statePublished}, On: evRepublish, When: whenSameRefresh,
			Do:  "refresh content with the request's secrets and tokens; a failure keeps the mount and the last good content, schedules a retry and answers a retryable code",
			To:  "published",
			run: (*Engine).republishContent},
		{From: []volState{statePublished}, On: evRepublish, When: whenSameUnmounted,
			Do:  "repair: Create, mount, fsGroup, content, read-only, save",
			To:  "published",
			run: (*Engine).repairMount},
		{From: []volState{statePublishing}, On: evRepublish, When: whenProvisioning,
			Do:  "attach: wait for the Create (Aborted while it runs), then mount, fsGroup, content, read-only, save",
			To:  "published; publishing while the Create runs; none after a rollback",
			run: (*Engine).attachProvision},
		{From: []volState{statePublishing, stateUnpublishing}, On: evRepublish, When: whenSame,
			Do:  "finish the interrupted operation: teardown, then publish",
			To:  "as publish from none",
			run: (*Engine).finishInterrupted},
		{From: []volState{stateRebuilt, stateUnclaimed}, On: evRepublish, When: whenMounted,
			Do:  "complete: fsGroup, content, read-only again, save the record completed from the request",
			To:  "published",
			run: (*Engine).completeMounted},
		{From: []volState{stateRebuilt, stateUnclaimed}, On: evRepublish, When: whenUnmounted,
			Do:  "complete: Create, mount, fsGroup, content, read-only, save the record completed from the request",
			To:  "published",
			run: (*Engine).completeUnmounted},

		{From: []volState{stateNone}, On: evUnpublish, When: whenAlways,
			Do:  "clean the target best-effort (unmount, remove the directory)",
			To:  "none",
			run: (*Engine).cleanTarget},
		{From: []volState{stateUnclaimed}, On: evUnpublish, When: whenAlways,
			Do:  "teardown at the request's target",
			To:  "none",
			run: (*Engine).unpublishVolume},
		{From: []volState{statePublished, stateRebuilt, statePublishing, stateUnpublishing}, On: evUnpublish, When: whenOtherTarget,
			Do:  "refuse InvalidArgument, nothing touched",
			To:  "unchanged",
			run: (*Engine).refuseOtherTarget},
		{From: []volState{statePublished, stateRebuilt, statePublishing, stateUnpublishing}, On: evUnpublish, When: whenItsTarget,
			Do:  "teardown: unmount, remove target, Delete (Aborted while mounted anywhere), delete record",
			To:  "none; unchanged on failure (the kubelet retries)",
			run: (*Engine).unpublishVolume},

		{From: []volState{statePublished, stateRebuilt, stateUnclaimed}, On: evReconcile, When: whenAlways,
			Do:  "keep (a published volume not mounted is logged: a republish repairs it)",
			To:  "unchanged",
			run: (*Engine).keepRecord},
		{From: []volState{statePublishing, stateUnpublishing}, On: evReconcile, When: whenAlways,
			Do:  "roll back: teardown",
			To:  "none; unchanged on failure (retried by the next operation)",
			run: (*Engine).rollBack},
		{From: []volState{stateNone}, On: evReconcile, When: whenFoundMounted,
			Do:  "adopt: save a rebuilt record, account its capacity",
			To:  "rebuilt",
			run: (*Engine).adoptMountedFound},
		{From: []volState{stateNone}, On: evReconcile, When: whenFoundPodded,
			Do:  "adopt as published, not mounted: save a rebuilt record, account its capacity",
			To:  "rebuilt",
			run: (*Engine).adoptStorageFound},
		{From: []volState{stateNone}, On: evReconcile, When: whenFoundProven,
			Do:  "Delete the storage (not while mounted anywhere)",
			To:  "none",
			run: (*Engine).deleteLeftover},
		{From: []volState{stateNone}, On: evReconcile, When: whenFoundUnproven,
			Do:  "keep as unclaimed: save a rebuilt record, account its capacity",
			To:  "unclaimed",
			run: (*Engine).keepUnclaimed},

		{From: []volState{statePublished, stateRebuilt, statePublishing, stateUnpublishing}, On: evGC, When: whenPodGone,
			Do:  "teardown",
			To:  "none; unchanged on failure (next pass)",
			run: (*Engine).collectOrphanVolume},

		{From: []volState{statePublished}, On: evRefresh, When: whenRefreshable,
			Do:  "refresh content with the last publish's secrets and tokens; a failure keeps the last good content and schedules a retry",
			To:  "published",
			run: (*Engine).refreshPublished},
		{From: []volState{statePublished, stateRebuilt, statePublishing, stateUnpublishing, stateUnclaimed}, On: evRefresh, When: whenStale,
			Do:  "nothing (a rebuilt or unmounted volume gets fresh content at its next republish); without content, forget the volume",
			To:  "unchanged",
			run: (*Engine).skipRefresh},
		{From: []volState{stateNone}, On: evRefresh, When: whenAlways,
			Do:  "forget the volume",
			To:  "none",
			run: (*Engine).forgetRefresh},
	}
}

// fire runs the row of the table for event on in state from, case when.
func (d *Engine) fire(ctx context.Context, on event, from volState, when cond, o *op) error {
	for i := range transitions {
		t := &transitions[i]
		if t.On == on && t.When == when && hasState(t.From, from) {
			return t.run(d, ctx, o)
		}
	}
	return errkind.Errorf(errkind.ErrInternal, "volume lifecycle: no transition for %s in state %s (%q)", on, from, when)
}

func hasState(states []volState, s volState) bool {
	for _, x := range states {
		if x == s {
			return true
		}
	}
	return false
}

// nodePublishVolume is NodePublishVolume of a read request: the volume's
// lock and its record, then the publish event (no record) or the republish
// event.
func (d *Engine) nodePublishVolume(ctx context.Context, pr *publishRequest) error {
	release, err := d.lanes.BeginPublish(pr.vol.Backend, pr.vol.ID)
	if err != nil {
		return err
	}
	defer release()
	ctx, cancel := context.WithTimeout(ctx, d.cfg.Limits.OperationTimeout)
	defer cancel()
	log := klog.FromContext(ctx).WithValues(logkeys.Backend, pr.vol.Backend)
	ctx = klog.NewContext(ctx, log)

	rec, err := d.store.Get(ctx, pr.vol.ID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		err = d.publish(ctx, pr)
	case err != nil:
		err = errkind.Transient(fmt.Errorf("reading volume state: %w", err))
	default:
		err = d.republish(ctx, pr, rec)
	}
	return err
}

// publish is the publish event: the first publish of a volume without a
// record. Every Authorizer approves it first; then the target decides the
// case. A failure posts no event: the kubelet's FailedMount event on the pod
// carries the same message (the gRPC error it got), and a second event per
// attempt would double the API writes of a failing fleet.
func (d *Engine) publish(ctx context.Context, pr *publishRequest) (err error) {
	v := pr.vol
	for _, a := range d.authorizers(v.Backend) {
		if err := a.Authorize(ctx, v); err != nil {
			if errors.Is(err, api.ErrPermissionDenied) {
				return errkind.Errorf(api.ErrPermissionDenied, "pod %s/%s may not use this volume: %w", v.Pod.Namespace, v.Pod.Name, err)
			}
			if _, ok := status.FromError(err); ok {
				return err
			}
			return errkind.Transient(fmt.Errorf("authorizing the volume: %w", err))
		}
	}
	o := &op{pr: pr}
	when, err := d.targetCase(ctx, o)
	if err != nil {
		return err
	}
	return d.fire(ctx, evPublish, stateNone, when, o)
}

// targetCase tells a first publish's target apart: not a mount point, a mount
// of this volume's own storage (o.src; its record was lost), or another mount
// (o.mt), which Ephemera never mounts over.
func (d *Engine) targetCase(ctx context.Context, o *op) (cond, error) {
	v := o.pr.vol
	root := d.cfg.Node.KubeletRootDir
	isMount, err := d.mounter.IsMountPoint(root, v.TargetPath)
	if err != nil {
		if errors.Is(err, mount.ErrSymlink) {
			return "", err
		}
		return "", errkind.Transient(fmt.Errorf("checking target: %w", err))
	}
	if !isMount {
		return whenTargetFree, nil
	}
	mt, err := d.mounter.Inspect(root, v.TargetPath)
	if err != nil {
		return "", errkind.Transient(fmt.Errorf("inspecting the mount at the target: %w", err))
	}
	if mt == nil {
		return whenTargetFree, nil // unmounted meanwhile
	}
	src, found, err := d.storage.Find(ctx, o.pr.backend, v)
	if err != nil {
		return "", errkind.Transient(err)
	}
	ours := false
	if found {
		if ours, err = d.mounter.Shows(mt, src); err != nil {
			return "", errkind.Transient(fmt.Errorf("comparing the mount at the target with the volume's storage: %w", err))
		}
	}
	if !ours {
		o.mt = mt
		return whenOtherMount, nil
	}
	o.src = src
	return whenOwnMount, nil
}

// republish is the republish event: a NodePublishVolume of a volume with a
// record. A rebuilt or unclaimed record is completed from the request
// (whatever its hash: it has none); any other must match the request.
func (d *Engine) republish(ctx context.Context, pr *publishRequest, rec *store.Record) error {
	o := &op{pr: pr, rec: rec}
	from := stateOf(rec)
	var when cond
	switch {
	case from == stateRebuilt || from == stateUnclaimed:
		// Storage the reconcile found without a record (kept unclaimed when no
		// pod had it: this is the pod it belongs to, as the handle is derived
		// from its UID and volume name), or a volume it adopted from the node.
		full, err := completed(pr, rec)
		if err != nil {
			return err
		}
		o.full = full
		isMount, err := d.mounter.IsMountPoint(d.cfg.Node.KubeletRootDir, full.TargetPath)
		if err != nil {
			return errkind.Transient(fmt.Errorf("checking target: %w", err))
		}
		when = whenUnmounted
		if isMount {
			when = whenMounted
		}
	case rec.Hash != pr.hash || !d.sameTarget(rec.TargetPath, pr.vol.TargetPath):
		when = whenChanged
	case d.provisions.Running(rec.VolumeID): // long provisioning (provisioning.go)
		when = whenProvisioning
	case from == statePublished:
		isMount, err := d.mounter.IsMountPoint(d.cfg.Node.KubeletRootDir, rec.TargetPath)
		if err != nil {
			return errkind.Transient(fmt.Errorf("checking target: %w", err))
		}
		switch {
		case !isMount:
			when = whenSameUnmounted
		case !d.fill.Provides(rec.Backend):
			when = whenSameMounted
		default:
			when = whenSameRefresh
		}
	default:
		when = whenSame
	}
	return d.fire(ctx, evRepublish, from, when, o)
}

// Unpublish is NodeUnpublishVolume of a checked volume ID and target path:
// the volume's lock, then the unpublish event. It is OK when anything is
// already gone. The volume's stats answer is dropped before and after.
func (d *Engine) Unpublish(ctx context.Context, id, target string) error {
	d.stats.Forget(id)
	err := d.nodeUnpublishVolume(ctx, id, target)
	if err == nil {
		d.stats.Forget(id)
	}
	return err
}

func (d *Engine) nodeUnpublishVolume(ctx context.Context, id, target string) error {
	release, err := d.lanes.LockVolume(id)
	if err != nil {
		return err
	}
	defer release()
	ctx, cancel := context.WithTimeout(ctx, d.cfg.Limits.OperationTimeout)
	defer cancel()
	return d.unpublish(ctx, id, target)
}

// unpublish is the unpublish event of volume id at target, in the teardown
// lane of the volume's backend (read from its record): never behind
// publishes, nor behind another backend's teardowns.
func (d *Engine) unpublish(ctx context.Context, id, target string) error {
	rec, err := d.store.Get(ctx, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		rec = nil
	case err != nil:
		return errkind.Transient(fmt.Errorf("reading volume state: %w", err))
	}
	party := lanes.NoRecord
	if rec != nil {
		party = rec.Backend
	}
	done, err := d.lanes.BeginTeardown(party)
	if err != nil {
		return err
	}
	defer done()
	o := &op{rec: rec, target: target}
	from, when := stateOf(rec), whenAlways
	switch {
	case from == stateNone || from == stateUnclaimed:
	case !d.sameTarget(rec.TargetPath, target):
		when = whenOtherTarget
	default:
		when = whenItsTarget
	}
	return d.fire(ctx, evUnpublish, from, when, o)
}

// Reconcile is the reconcile event, run at startup before the driver serves.
// It compares the records (what the driver promised), the mount table (what
// is published) and the backends' inventories (what storage exists):
//
//   - a record in phase Publishing (the intent of a backend that needs one, or
//     what a failed rollback left) or Unpublishing (written by older
//     versions) belongs to an operation cut short; the kubelet never got OK
//     for a publish in that state, and an unpublish is idempotent, so both are
//     rolled back completely (storage still mounted anywhere is not deleted:
//     see Storage.RefuseIfMounted);
//   - a Published record is kept whether or not its target is mounted: a
//     republish repairs it, NodeUnpublish or the orphan GC removes it;
//   - a volume of this driver published at its target without a record (the
//     kubelet's vol_data.json names this driver and the handle) is adopted
//     with a rebuilt record (reconcile.Node.UnrecordedMounts);
//   - backend storage that no record refers to is adopted when its pod still
//     has the volume, deleted when the store can prove it a leftover, and kept
//     as unclaimed otherwise (reconcile.Node.UnrecordedStorage).
//
// Failures to clean one volume are logged and left for the next attempt (a later
// NodePublish/NodeUnpublish of that volume finishes the job); only an unreadable
// store fails the startup. Nothing is ever deleted because a record is missing.
func (d *Engine) Reconcile(ctx context.Context) error {
	log := d.cfg.Observability.Logger.WithName("reconcile")
	recs, err := d.store.List(ctx)
	if err != nil {
		return fmt.Errorf("listing volume records: %w", err)
	}
	d.capacity.Reset(recs)
	known := make(map[string]bool, len(recs))
	var failed []error
	for _, rec := range recs {
		known[rec.VolumeID] = true
		vlog := log.WithValues(logkeys.VolumeID, rec.VolumeID, logkeys.Phase, rec.Phase)
		if err := d.fire(ctx, evReconcile, stateOf(rec), whenAlways, &op{rec: rec, log: vlog}); err != nil {
			failed = append(failed, err)
		}
	}
	found, err := d.node.UnrecordedMounts(ctx, known)
	if err != nil {
		log.Error(err, "Adopting published volumes without a record")
		d.metrics.Reconciled(metrics.ReconcileFailed)
		failed = append(failed, err)
	}
	for _, f := range found {
		if err := d.fire(ctx, evReconcile, stateNone, whenFoundMounted, &op{rec: f.Record, mt: f.Mounted, log: f.Log}); err != nil {
			log.Error(err, "Adopting published volumes without a record")
			d.metrics.Reconciled(metrics.ReconcileFailed)
			failed = append(failed, err)
			break
		}
		known[f.Record.VolumeID] = true
	}
	index := d.node.VolDataIndexOnce()
	for _, name := range backendNames(d.cfg.Backends) {
		b := d.cfg.Backends[name]
		inv := d.node.UnrecordedStorage(ctx, name, known, index)
		bfailed := inv.Failed
		for _, f := range inv.Found {
			when := foundCases[f.Kind]
			if err := d.fire(ctx, evReconcile, stateNone, when, &op{rec: f.Record, b: b, log: f.Log}); err != nil {
				bfailed = append(bfailed, err)
				continue
			}
			if when != whenFoundProven {
				known[f.Record.VolumeID] = true
			}
		}
		if len(bfailed) == 0 {
			d.node.StampArea(ctx, inv)
		}
		failed = append(failed, bfailed...)
	}
	if len(failed) > 0 {
		log.Info("Reconcile left volumes to retry", logkeys.Count, len(failed), logkeys.Err, errors.Join(failed...).Error())
	}
	if d.fill.Any() {
		log.Info("Charging content in memory-backed volumes", logkeys.ChargingMode, d.charging, logkeys.Reason, d.chargingWhy)
	}
	d.fill.CountHeld(klog.NewContext(ctx, log), d.store)
	return nil
}

// collectOrphan is the gc event: the orphan GC (internal/reconcile's GC,
// through the Remove func New gives it) found rec's pod gone and holds the
// volume's lock. rec is what the GC listed; an unpublish may have torn the
// volume down since, so the event works from the record read under the lock
// (none: nothing to do; tearing it down again would release its capacity a
// second time).
func (d *Engine) collectOrphan(ctx context.Context, rec *store.Record) error {
	cur, err := d.store.Get(ctx, rec.VolumeID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil
	case err != nil:
		return err
	}
	return d.fire(ctx, evGC, stateOf(cur), whenPodGone, &op{rec: cur})
}

// refreshVolume is the refresh event of volume id: a driver-initiated
// refresh of its content (the refresher's timers call it).
func (d *Engine) refreshVolume(ctx context.Context, id string) {
	log := d.cfg.Observability.Logger.WithValues(logkeys.VolumeID, id)
	if !d.lanes.Locks.TryAcquire(id) {
		d.refresher.Schedule(id, refresh.BusyRetry) // a publish or unpublish holds it
		return
	}
	defer d.lanes.Locks.Release(id)
	rec, err := d.store.Get(ctx, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		rec = nil
	case err != nil:
		log.Error(err, "Refresh: reading volume state")
		d.refresher.Failed(id)
		return
	}
	from, when := stateOf(rec), whenAlways
	if from != stateNone {
		when = whenStale
		if from == statePublished && d.fill.Provides(rec.Backend) {
			if isMount, err := d.mounter.IsMountPoint(d.cfg.Node.KubeletRootDir, rec.TargetPath); err == nil && isMount {
				when = whenRefreshable
			}
		}
	}
	_ = d.fire(klog.NewContext(ctx, log), evRefresh, from, when, &op{id: id, rec: rec})
}

// The actions of the table follow, event by event.

// createVolume is the first publish of a volume: the backend's plan (a
// Planner), durable intent (when the backend needs one: storage.NeedsIntent, or the
// plan), backend, target, mount, content, durable completion. On failure
// everything is rolled back.
func (d *Engine) createVolume(ctx context.Context, o *op) (err error) {
	log := klog.FromContext(ctx)
	pr := o.pr
	v := pr.vol
	if err := d.capacity.Reserve(d.cfg.DriverName, v.Backend, v.Pod.UID, v.Size); err != nil {
		return err
	}
	var intent, relax bool
	if p := pr.backend.Planner(); p == nil {
		intent, relax = storage.NeedsIntent(pr.backend), storage.Relaxed(pr.backend)
	} else {
		// What Create will do is decided once, here, and recorded in
		// v.State: the intent record and the decisions below follow it, not
		// a later answer of a backend that may have changed (a plugin
		// restarted as another version) or be down at teardown.
		mountOnly, err := p.Plan(ctx, v)
		if err != nil {
			d.capacity.Release(v.Backend, v.Pod.UID, v.Size)
			return fmt.Errorf("backend %s: planning the volume: %w", v.Backend, err)
		}
		_, finds := pr.backend.Unwrap().(Finder)
		relax = mountOnly && finds
		intent = !relax
	}
	if pr.backend.LongProvisioning() { // long provisioning: a restart mid-way rolls back (provisioning.go)
		intent, relax = true, false
	}
	rec := newRecord(pr, store.PhasePublishing)
	rec.State = v.State
	if intent {
		if err := d.store.Put(ctx, rec); err != nil {
			d.capacity.Release(v.Backend, v.Pod.UID, v.Size)
			return errkind.Transient(fmt.Errorf("saving volume intent: %w", err))
		}
	}
	failpoint.Hit(failpoint.PublishBeforeCreate)

	defer func() {
		if err == nil || provision.IsStillProvisioning(err) { // long provisioning: goes on (provisioning.go)
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
			err = errkind.Transient(fmt.Errorf("publish failed: %w; rollback incomplete: %w", err, uerr))
			return
		}
		log.V(2).Info("Rolled back failed publish")
	}()

	// long provisioning: in the background (provisioning.go)
	src, err := d.createOrProvision(ctx, pr, v)
	rec.State = v.State // what the rollback's Delete needs, also of a failed Create
	if err != nil {
		return fmt.Errorf("backend %s: creating storage: %w", v.Backend, err)
	}
	failpoint.Hit(failpoint.PublishAfterCreate)
	rec.Source = &src
	if err := d.mountAndFill(ctx, pr, src); err != nil {
		return err
	}
	rec.Phase, rec.Updated = store.PhasePublished, time.Now().UTC()
	d.recordHeld(rec)
	if err := d.storage.PutRecordRelaxed(ctx, relax, rec); err != nil {
		return errkind.Transient(fmt.Errorf("saving published volume: %w", err))
	}
	failpoint.Hit(failpoint.PublishAfterDone)
	if d.fill.Provides(v.Backend) {
		d.refresher.Remember(v)
	}
	log.V(2).Info("Published volume", logkeys.Size, v.Size)
	return nil
}

// adoptMounted answers a first publish whose target shows this volume's own
// storage (its record was lost): the volume is recorded as published for
// this request, refreshed like a republish, and answered OK.
func (d *Engine) adoptMounted(ctx context.Context, o *op) error {
	pr, v := o.pr, o.pr.vol
	// Whatever mounted it may not have finished (fsGroup, content, read-only).
	if err := d.finishMounted(ctx, pr, nil); err != nil {
		return errkind.Transient(fmt.Errorf("finishing the publish of the volume mounted at its target: %w", err))
	}
	rec := newRecord(pr, store.PhasePublished)
	src := o.src
	rec.Source, rec.State = &src, v.State
	d.recordHeld(rec)
	if err := d.store.Put(ctx, rec); err != nil {
		return errkind.Transient(fmt.Errorf("saving adopted volume: %w", err))
	}
	d.capacity.Adopt(v.Backend, v.Pod.UID, v.Size)
	if d.fill.Provides(v.Backend) {
		d.refresher.Remember(v)
	}
	d.metrics.Reconciled(metrics.ReconcileAdopted)
	klog.FromContext(ctx).Info("Adopted the volume already mounted at its target (its record was missing)")
	return nil
}

// refuseOtherMount refuses a first publish whose target is a mount that is
// not this volume's storage, and leaves it as it is.
func (d *Engine) refuseOtherMount(_ context.Context, o *op) error {
	v := o.pr.vol
	return errkind.Errorf(errkind.ErrFailedPrecondition,
		"target %s is already a mount point (%s %s) that is not this volume's %s storage; Ephemera never mounts over another mount: unmount it, or delete and recreate the pod",
		v.TargetPath, o.mt.FSType, o.mt.Source, v.Backend)
}

// refuseChanged refuses a publish that asks for another volume than the one
// recorded under its ID.
func (d *Engine) refuseChanged(_ context.Context, o *op) error {
	return errkind.Errorf(api.ErrAlreadyExists, "volume %s is already published with different attributes, readOnly, fsType or fsGroup; the volume of a running pod cannot change: delete and recreate the pod", o.pr.vol.ID)
}

// alreadyPublished answers the republish of a mounted volume without content.
func (d *Engine) alreadyPublished(ctx context.Context, _ *op) error {
	klog.FromContext(ctx).V(2).Info("Volume already published")
	return nil
}

// republishContent handles requiresRepublish or a kubelet restart: new
// content with the fresh secrets and tokens. A failure never touches the live
// volume: it keeps its mount and its last good content, and a retry is
// scheduled; it is never silent (issue 44): the metric counts it, the pod
// gets a Warning event (d.refreshed), and the kubelet gets the error with a
// retryable code (retryable), which it records on the pod and retries
// (DESIGN 3.4: a failed republish answers OK or a transient code).
func (d *Engine) republishContent(ctx context.Context, o *op) error {
	v := o.pr.vol
	v.State = o.rec.State
	d.refresher.Remember(v)
	if err := d.fill.Refresh(ctx, v); err != nil {
		d.refreshFailed(ctx, v.ID, err)
		return retryable(fmt.Errorf("volume %s keeps its last good content; refreshing it failed: %w", v.Name, err))
	}
	d.refresher.Succeeded(v.ID)
	klog.FromContext(ctx).V(2).Info("Republished volume with refreshed content")
	return nil
}

// retryable is err with a code the kubelet retries: its own when it has one
// of them (ResourceExhausted, Unavailable, DeadlineExceeded, Canceled,
// Aborted), else Unavailable. The answer to a republish that failed, which
// must never be final: the volume is live.
func retryable(err error) error {
	switch errkind.Code(err) {
	case codes.ResourceExhausted, codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Aborted:
		return err
	}
	return errkind.Transient(err)
}

// repairMount publishes again a volume answered OK whose mount vanished (node
// reboot, someone unmounted it). A failure keeps the record: the kubelet
// retries or unpublishes.
func (d *Engine) repairMount(ctx context.Context, o *op) error {
	pr, rec := o.pr, o.rec
	klog.FromContext(ctx).Info("Published volume is not mounted; repairing")
	src, err := d.remount(ctx, pr, rec.State)
	if err != nil {
		return errkind.Transient(fmt.Errorf("repairing volume: %w", err))
	}
	rec.Source, rec.State, rec.Updated = &src, pr.vol.State, time.Now().UTC()
	d.recordHeld(rec)
	if err := d.store.Put(ctx, rec); err != nil {
		return errkind.Transient(fmt.Errorf("saving repaired volume: %w", err))
	}
	return nil
}

// finishInterrupted handles a publish or unpublish that was cut short and not
// yet reconciled (its rollback failed earlier): it finishes tearing it down,
// then publishes afresh.
func (d *Engine) finishInterrupted(ctx context.Context, o *op) error {
	rec := o.rec
	klog.FromContext(ctx).Info("Finishing interrupted operation before publishing", logkeys.Phase, rec.Phase)
	if err := d.teardown(ctx, rec); err != nil {
		return errkind.Transient(fmt.Errorf("cleaning up an interrupted %s: %w", strings.ToLower(string(rec.Phase)), err))
	}
	return d.publish(ctx, o.pr)
}

// attachProvision answers the republish of a volume whose Create runs in
// the background (a LongProvisioner: provisioning.go): it waits for the
// Create as the first publish did (Aborted while it runs), then finishes that
// publish: mount, fsGroup, content, read-only, the Published record. A Create
// that failed, or a failure after it, is rolled back and its error returned:
// the kubelet's next publish starts over.
func (d *Engine) attachProvision(ctx context.Context, o *op) (err error) {
	pr, rec, v := o.pr, o.rec, o.pr.vol
	v.State = rec.State
	src, err := d.provisions.Attach(ctx, v)
	if provision.IsStillProvisioning(err) {
		return err
	}
	defer func() {
		if err == nil {
			return
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if uerr := d.teardown(rctx, rec); uerr != nil {
			klog.FromContext(ctx).Error(uerr, "Rollback of failed publish incomplete; the volume is kept for cleanup")
			err = errkind.Transient(fmt.Errorf("publish failed: %w; rollback incomplete: %w", err, uerr))
			return
		}
		klog.FromContext(ctx).V(2).Info("Rolled back failed publish")
	}()
	rec.State = v.State
	if err != nil {
		return fmt.Errorf("backend %s: creating storage: %w", v.Backend, err)
	}
	rec.Source = &src
	if err := d.mountAndFill(ctx, pr, src); err != nil {
		return err
	}
	rec.Phase, rec.Updated = store.PhasePublished, time.Now().UTC()
	d.recordHeld(rec)
	if err := d.store.Put(ctx, rec); err != nil {
		return errkind.Transient(fmt.Errorf("saving published volume: %w", err))
	}
	if d.fill.Provides(v.Backend) {
		d.refresher.Remember(v)
	}
	klog.FromContext(ctx).V(2).Info("Published volume after its background provisioning", logkeys.Size, v.Size)
	return nil
}

// completeMounted and completeUnmounted answer the first publish of a volume
// whose record the reconcile rebuilt from the node: after a lost state file,
// after a crash during a first publish that wrote no intent (storage.NeedsIntent), or
// storage kept as unclaimed. Nothing tells whether the publish that mounted
// it finished, so it is finished now: a volume mounted at its target runs the
// steps after the mount again (finishMounted), one that is not is mounted
// (remount). Only then is the completed record saved; until then the record
// stays rebuilt and a retry does it all again (every step is idempotent).
func (d *Engine) completeMounted(ctx context.Context, o *op) error {
	err := d.finishMounted(ctx, o.pr, o.rec.State)
	return d.completeRebuilt(ctx, o, err)
}

func (d *Engine) completeUnmounted(ctx context.Context, o *op) error {
	src, err := d.remount(ctx, o.pr, o.rec.State)
	if err == nil {
		o.full.Source = &src
	}
	return d.completeRebuilt(ctx, o, err)
}

// completeRebuilt saves the completed record once the publish is finished
// (err nil) and moves its capacity to what the request says.
func (d *Engine) completeRebuilt(ctx context.Context, o *op, err error) error {
	pr, rec, full := o.pr, o.rec, o.full
	if err != nil {
		return errkind.Transient(fmt.Errorf("finishing the publish of a volume rebuilt from the node: %w", err))
	}
	full.State = pr.vol.State
	d.recordHeld(full)
	if err := d.storage.PutRecord(ctx, pr.backend, full); err != nil {
		return errkind.Transient(fmt.Errorf("saving the completed record of a rebuilt volume: %w", err))
	}
	d.capacity.Complete(rec, full)
	if d.fill.Provides(pr.vol.Backend) {
		d.refresher.Remember(pr.vol)
	}
	klog.FromContext(ctx).Info("Completed the record of a volume rebuilt from the node with its publish request", logkeys.Phase, rec.Phase)
	return nil
}

// cleanTarget answers the unpublish of an unknown volume: it cleans the
// target best-effort (a mount stacked by an older driver, an empty
// directory) and succeeds.
func (d *Engine) cleanTarget(_ context.Context, o *op) error {
	return d.unpublishTarget(o.target)
}

// refuseOtherTarget refuses an unpublish at a target that is not the
// volume's.
func (d *Engine) refuseOtherTarget(_ context.Context, o *op) error {
	return errkind.Invalidf("volume %s is published at %s, not at %s; nothing was touched", o.rec.VolumeID, o.rec.TargetPath, o.target)
}

// unpublishVolume tears the volume down. No intent is written: until the
// record is deleted, last, it says Published, and a kubelet that got no OK
// retries (or the orphan GC, once the pod is gone, tears down what is left).
// Every step of teardown is OK when already done. Unclaimed storage is torn
// down at the target the kubelet names: it is the pod's.
func (d *Engine) unpublishVolume(ctx context.Context, o *op) error {
	rec := o.rec
	if rec.Phase == store.PhaseUnclaimed {
		rec.TargetPath = o.target
	}
	if err := d.teardown(ctx, rec); err != nil {
		return err
	}
	klog.FromContext(ctx).V(2).Info("Unpublished volume")
	return nil
}

// keepRecord keeps a record at startup. A published volume whose target is
// not mounted is logged: a republish repairs it, an unpublish or the orphan
// GC removes it.
func (d *Engine) keepRecord(_ context.Context, o *op) error {
	rec := o.rec
	if rec.Phase != store.PhasePublished {
		return nil
	}
	isMount, err := mount.IsMountPointNow(d.mounter, d.cfg.Node.KubeletRootDir, rec.TargetPath)
	if err != nil {
		o.log.Error(err, "Checking target of published volume")
	} else if !isMount {
		o.log.Info("Published volume is not mounted; a republish repairs it, an unpublish or the orphan GC removes it", logkeys.TargetPath, rec.TargetPath)
	}
	return nil
}

// rollBack tears down an operation cut short, at startup.
func (d *Engine) rollBack(ctx context.Context, o *op) error {
	if err := d.teardown(ctx, o.rec); err != nil {
		o.log.Error(err, "Rolling back interrupted operation failed; will retry")
		d.metrics.Reconciled(metrics.ReconcileFailed)
		return err
	}
	d.metrics.Reconciled(metrics.ReconcileRolledBack)
	o.log.Info("Rolled back interrupted operation")
	return nil
}

// adoptMountedFound adopts a volume published at its target without a
// record.
func (d *Engine) adoptMountedFound(ctx context.Context, o *op) error {
	rec := o.rec
	if err := d.saveRebuilt(ctx, rec); err != nil {
		return err
	}
	d.metrics.Reconciled(metrics.ReconcileAdopted)
	if rec.Backend == "" {
		o.log.Info("Adopted a published volume without a record; its backend could not be identified, so its storage (if any) is not freed at unpublish", logkeys.FSType, o.mt.FSType, logkeys.Source, o.mt.Source)
		return nil
	}
	o.log.Info("Adopted a published volume without a record", logkeys.Backend, rec.Backend, logkeys.Size, rec.Size)
	return nil
}

// adoptStorageFound adopts backend storage without a record whose pod still
// has the volume, as a published volume that is not mounted (a republish
// mounts it again, an unpublish or the orphan GC removes it).
func (d *Engine) adoptStorageFound(ctx context.Context, o *op) error {
	if err := d.saveRebuilt(ctx, o.rec); err != nil {
		return err
	}
	d.metrics.Reconciled(metrics.ReconcileAdopted)
	o.log.Info("Adopted storage without a record: its pod still has the volume (a republish mounts it again)", logkeys.TargetPath, o.rec.TargetPath)
	return nil
}

// keepUnclaimed keeps backend storage without a record or a pod, which the
// store cannot prove a leftover, as unclaimed.
func (d *Engine) keepUnclaimed(ctx context.Context, o *op) error {
	if err := d.saveRebuilt(ctx, o.rec); err != nil {
		return err
	}
	d.metrics.Reconciled(metrics.ReconcileUnclaimed)
	o.log.Info("Kept storage without a record or a pod as unclaimed: this state store cannot prove it a leftover (see docs/operations.md, 'Unclaimed storage')")
	return nil
}

// saveRebuilt saves a rebuilt record and accounts its storage.
func (d *Engine) saveRebuilt(ctx context.Context, rec *store.Record) error {
	if err := d.store.Put(ctx, rec); err != nil {
		return fmt.Errorf("saving the rebuilt record of volume %s: %w", rec.VolumeID, err)
	}
	d.capacity.Adopt(rec.Backend, rec.Pod.UID, rec.Size)
	return nil
}

// deleteLeftover deletes storage without a record that the backend's stamp
// proves a leftover of this store, unless it is mounted anywhere.
func (d *Engine) deleteLeftover(ctx context.Context, o *op) error {
	v := volume.Orphan(o.rec.VolumeID, o.rec.Backend)
	err := d.storage.RefuseIfMounted(ctx, o.b, v, nil)
	if err == nil {
		err = d.storage.Delete(ctx, o.b, v)
	}
	if err != nil {
		o.log.Error(err, "Deleting storage without a record")
		d.metrics.Reconciled(metrics.ReconcileFailed)
		return err
	}
	d.metrics.Reconciled(metrics.ReconcileOrphanDeleted)
	o.log.Info("Deleted storage without a record")
	return nil
}

// collectOrphanVolume tears down a volume whose pod is gone.
func (d *Engine) collectOrphanVolume(ctx context.Context, o *op) error {
	return d.teardown(ctx, o.rec)
}

// refreshPublished rewrites the content of a published, mounted volume with
// the secrets and tokens of its last publish this process saw.
func (d *Engine) refreshPublished(ctx context.Context, o *op) error {
	v := d.fromRecord(o.rec)
	c := d.refresher.CredsOf(v.ID)
	v.Secrets, v.Tokens = c.Secrets, c.Tokens
	if err := d.fill.Refresh(ctx, v); err != nil {
		d.refreshFailed(ctx, v.ID, err)
		return nil
	}
	d.refresher.Succeeded(v.ID)
	klog.FromContext(ctx).V(2).Info("Refreshed content")
	return nil
}

// skipRefresh leaves a volume that cannot be refreshed now: rebuilt from the
// node (the pod's identity and attributes are unknown until its next
// publish, which refreshes the content itself), not mounted (the next
// republish repairs it, with fresh content), not published. A published
// volume whose backend has no content any more is forgotten.
func (d *Engine) skipRefresh(_ context.Context, o *op) error {
	if o.rec.Phase == store.PhasePublished && !d.fill.Provides(o.rec.Backend) {
		d.refresher.Forget(o.rec.VolumeID)
	}
	return nil
}

// forgetRefresh drops the refresh state of a volume that is gone.
func (d *Engine) forgetRefresh(_ context.Context, o *op) error {
	d.refresher.Forget(o.id)
	return nil
}

// The steps the actions share.

// remount publishes the storage of a volume that has a record but no mount
// (a node reboot, a crash before the mount, someone unmounted it): Create
// finds or re-creates the storage, then the whole of mountAndFill runs. A
// failure after the mount unmounts again, so that a retry repeats it all and
// never takes a half-finished mount for a published volume.
func (d *Engine) remount(ctx context.Context, pr *publishRequest, state map[string]string) (api.Source, error) {
	v := pr.vol
	v.State = state
	src, err := d.storage.Create(ctx, pr.backend, v)
	if err != nil {
		return api.Source{}, fmt.Errorf("backend %s: creating storage: %w", v.Backend, err)
	}
	if err := d.mountAndFill(ctx, pr, src); err != nil {
		if uerr := d.mounter.Unmount(d.cfg.Node.KubeletRootDir, v.TargetPath); uerr != nil {
			return api.Source{}, fmt.Errorf("%w; unmounting the unfinished volume: %w", err, uerr)
		}
		return api.Source{}, err
	}
	return src, nil
}

// finishMounted runs the steps of a publish after the mount (fsGroup,
// content, read-only) again on a volume mounted at its target, whose publish
// may have been cut short after the mount. Unlike a refresh, a failure fails
// the publish: there may be no good content to keep.
func (d *Engine) finishMounted(ctx context.Context, pr *publishRequest, state map[string]string) (err error) {
	v := pr.vol
	v.State = state
	root := d.cfg.Node.KubeletRootDir
	if v.ReadOnly && d.fill.Fills(v) {
		if err := d.mounter.SetReadOnly(root, v.TargetPath, false); err != nil {
			return fmt.Errorf("making volume writable to finish its publish: %w", err)
		}
	}
	err = d.fill.Fill(ctx, v)
	if v.ReadOnly {
		if rerr := d.mounter.SetReadOnly(root, v.TargetPath, true); rerr != nil {
			err = errors.Join(err, fmt.Errorf("making volume read-only: %w", rerr))
		}
	}
	return err
}

// mountAndFill creates the target, publishes src there, writes the content and
// applies read-only.
func (d *Engine) mountAndFill(ctx context.Context, pr *publishRequest, src api.Source) error {
	v := pr.vol
	if err := d.mounter.MakeTarget(d.cfg.Node.KubeletRootDir, v.TargetPath); err != nil {
		return fmt.Errorf("creating target: %w", err)
	}
	failpoint.Hit(failpoint.PublishAfterMkdir)
	src.MountOptions = d.cfg.Volumes.MountOptions[v.Backend] // the operator's, never a backend's
	if err := d.mounter.Mount(d.cfg.Node.KubeletRootDir, src, v.TargetPath); err != nil {
		return fmt.Errorf("publishing at target: %w", err)
	}
	failpoint.Hit(failpoint.PublishAfterMount)
	if err := d.fill.Fill(ctx, v); err != nil {
		return err
	}
	failpoint.Hit(failpoint.PublishAfterContent)
	if v.ReadOnly {
		if err := d.mounter.SetReadOnly(d.cfg.Node.KubeletRootDir, v.TargetPath, true); err != nil {
			return fmt.Errorf("making volume read-only: %w", err)
		}
	}
	return nil
}

// unpublishTarget unmounts everything at target and removes the directory.
func (d *Engine) unpublishTarget(target string) error {
	if err := d.mounter.Unmount(d.cfg.Node.KubeletRootDir, target); err != nil {
		return fmt.Errorf("unmounting target: %w", err)
	}
	failpoint.Hit(failpoint.UnpublishAfterUnmount)
	if err := d.mounter.RemoveTarget(d.cfg.Node.KubeletRootDir, target); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing target directory: %w", err)
	}
	failpoint.Hit(failpoint.UnpublishAfterRemoveDir)
	return nil
}

// teardown undoes everything a record stands for, in reverse order: unmount,
// target directory, backend storage, record. Every step is OK when already done,
// so it serves rollback, unpublish, reconcile, the GC and retries alike.
func (d *Engine) teardown(ctx context.Context, rec *store.Record) error {
	if err := d.provisions.Stop(ctx, rec); err != nil { // long provisioning: cancel, wait (provisioning.go)
		return err
	}
	if err := d.unpublishTarget(rec.TargetPath); err != nil {
		return err
	}
	if b, ok := d.cfg.Backends[rec.Backend]; ok {
		v := d.fromRecord(rec)
		if err := d.storage.RefuseIfMounted(ctx, b, v, rec.Source); err != nil {
			return err
		}
		if err := d.storage.Delete(ctx, b, v); err != nil {
			return fmt.Errorf("backend %s: deleting storage: %w", rec.Backend, err)
		}
	} else if rec.Backend != "" {
		return fmt.Errorf("volume uses backend %q, which this driver no longer has; re-enable it to clean up", rec.Backend)
	}
	failpoint.Hit(failpoint.UnpublishAfterDelete)
	if err := d.storage.DeleteRecord(ctx, d.cfg.Backends[rec.Backend], rec.VolumeID); err != nil {
		return errkind.Transient(fmt.Errorf("deleting volume record: %w", err))
	}
	d.capacity.Release(rec.Backend, rec.Pod.UID, rec.Size)
	d.lanes.Held.Release(rec.VolumeID)
	d.refresher.Forget(rec.VolumeID)
	failpoint.Hit(failpoint.UnpublishAfterRecordGone)
	return nil
}

// recordHeld puts into rec what its volume's content holds in memory, as
// the content capacity counts it (store.Record.ContentHeld), when its
// backend has content: a restarted driver counts it from there.
func (d *Engine) recordHeld(rec *store.Record) {
	if !d.fill.Provides(rec.Backend) {
		return
	}
	n := d.lanes.Held.Of(rec.VolumeID)
	rec.ContentHeld = &n
}

// saveHeld records that v's content holds n bytes (fill's SaveHeld, around
// the write of a refresh, under the volume's lock): in the record of a
// published volume. Any other record is saved, with what it holds, by the
// publish that writes it.
func (d *Engine) saveHeld(ctx context.Context, v *api.Volume, n int64) error {
	rec, err := d.store.Get(ctx, v.ID)
	if err != nil {
		return err
	}
	if rec.Phase != store.PhasePublished || rec.Rebuilt || (rec.ContentHeld != nil && *rec.ContentHeld == n) {
		return nil
	}
	b, ok := d.cfg.Backends[rec.Backend]
	if !ok {
		return fmt.Errorf("volume uses backend %q, which this driver no longer has", rec.Backend)
	}
	rec.ContentHeld, rec.Updated = &n, time.Now().UTC()
	return d.storage.PutRecord(ctx, b, rec)
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
		return nil, errkind.Errorf(api.ErrAlreadyExists, "volume %s exists on this node with backend %s, and the request asks for %s; the volume of a running pod cannot change: delete and recreate the pod",
			v.ID, rec.Backend, v.Backend)
	}
	full := newRecord(pr, store.PhasePublished)
	full.Source, full.State, full.Created = rec.Source, rec.State, rec.Created
	return full, nil
}
