// This file holds every interface a driver author implements (or passes in
// Options), and the adapters to plain functions.

package framework

import (
	"context"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/content"
)

// A Backend provides the storage behind one volume. The framework owns everything
// else: validation of the request, state, locking, publishing (mount or link at the
// target), rollback, reconcile after a crash and cleanup.
//
// Both methods must be idempotent: the framework calls Create again for the same
// volume after a crash or a retry, and Delete for storage that may already be gone.
type Backend interface {
	// Create provisions the storage for v and returns what to publish at the
	// target. It may record data it needs at teardown in v.State; the
	// rollback of a failed first publish passes Delete v.State as Create left
	// it, also when Create failed. Errors should wrap one of the api sentinel
	// errors.
	Create(ctx context.Context, v *api.Volume) (api.Source, error)
	// Delete frees the storage of v. It returns nil when it is already gone. It
	// receives the volume as persisted at Create (without Secrets).
	Delete(ctx context.Context, v *api.Volume) error
}

// Validator is implemented by backends that check a volume before it is
// created. Validate runs on every NodePublishVolume, republishes included,
// before anything else happens (so keep checks that depend on secrets or
// tokens, which may be missing on a republish, in the ContentProvider), after
// the backend's declared attributes are applied (AttributeDeclarer: their
// values in v.Values). It receives in v.Params what no declaration took
// (neither the framework's "size" and "backend" nor the driver's), which only
// a backend that declares nothing may accept (a plugin, which validates in its
// own process), and may fill in defaults on v (for example v.Size). Errors
// should wrap api.ErrInvalidParams and tell the pod author what to change. A
// backend that is neither a Validator nor an AttributeDeclarer accepts no
// attributes.
type Validator interface {
	Validate(v *api.Volume) error
}

// Lister is implemented by backends that can enumerate the volumes they hold
// storage for. The startup reconcile compares the inventory with the records:
// storage without a record is adopted (its pod still has the volume on this
// node, or it is kept as unclaimed), and deleted only when the backend is a
// Stamper whose stamp proves the state store has known its storage all along
// and nothing mounts it.
type Lister interface {
	List(ctx context.Context) (volumeIDs []string, err error)
}

// Finder is implemented by backends that can tell, without creating anything,
// which source a volume's existing storage is published from: what Create
// returned for it. The framework uses it to recognise a volume's storage where
// its record is missing (a lost or damaged state file: the volume is adopted,
// never mounted over or deleted) and to refuse to delete storage that is still
// mounted anywhere. Find returns an error wrapping api.ErrNotFound when v has no
// storage that could be mounted (none, or a backing file not attached).
// Backends without it cannot have their volumes adopted by source.
type Finder interface {
	Find(ctx context.Context, v *api.Volume) (api.Source, error)
}

// MountOnly is implemented by backends whose volumes exist only as their
// mount, as a tmpfs does: Create changes nothing on the node (it only
// describes the mount), and unmounting frees everything. With Finder, it tells
// the framework that a crash can leave nothing of a volume but a mount at its
// target, which the startup reconcile adopts from the mount table; a first
// publish then writes no intent record (a Lister with a Finder does the same
// for storage that outlives its mount).
type MountOnly interface {
	MountOnly()
}

// Planner is implemented by backends whose Create does not always do the
// same kind of thing: an out-of-process plugin (framework/plugin) has the
// plugin create storage, or only describes a tmpfs of the driver's, as the
// version of the plugin running decides. A first publish calls Plan before it
// writes or creates anything: Plan decides what Create will do for v and
// records that in v.State, which the volume's record keeps from then on (the
// intent record written before Create included), so that Create and Delete
// follow what was decided instead of asking again. Tearing the volume down
// then depends on a component that may be down (the plugin) only when that
// component was asked to create something.
//
// Plan must create nothing. Its Plan.MountOnly replaces MountOnly for that
// volume: the publish writes no intent record and relaxed records for it only
// when the backend is also a Finder (by its type; Find must find such a
// volume's storage), and writes the intent record otherwise. Create receives
// v.State as Plan left it, and Delete what Create left (also when Create
// failed: a Create that knows it created nothing can say so in v.State).
type Planner interface {
	Plan(ctx context.Context, v *api.Volume) (Plan, error)
}

// Plan is what a Planner's Create will do for one volume.
type Plan struct {
	// MountOnly: Create changes nothing on the node, the volume is nothing
	// but its mount (as for a MountOnly backend).
	MountOnly bool
}

// Stamper is implemented by backends whose storage outlives the driver process
// (Lister backends with a storage area on disk). The framework stamps the
// storage area with the identity of its state store once every piece of
// storage there has a record; from then on storage without a record is either
// in use by a pod (the kubelet's vol_data.json names it: the record is
// rebuilt) or provably a leftover, and may be deleted. A store that finds another identity (a new or rebuilt state file)
// adopts what it finds instead, and stamps the area afterwards.
type Stamper interface {
	// Stamp returns the identity the storage area carries, "" when none.
	Stamp(ctx context.Context) (string, error)
	// SetStamp durably records id as the storage area's identity.
	SetStamp(ctx context.Context, id string) error
}

// ContentProvider puts files into a volume: after its storage is published and
// before the pod sees it, again on every republish (CSIDriver requiresRepublish:
// true, with fresh secrets and service-account tokens), and on Driver.Refresh,
// Driver.RefreshAll or Options.Volumes.RefreshInterval. The files replace the volume's
// previous content atomically (a reader sees the old set or the new set, never a
// mix). v carries the pod's identity, attributes, Secrets and Tokens; on a
// driver-initiated refresh Secrets and Tokens are those of the last publish this
// process saw (nil after a driver restart, until the next republish).
//
// A failing first publish rolls the volume back and the pod does not start. A
// failing refresh keeps the volume and its last good content and is retried with
// backoff; a republish whose refresh fails answers the kubelet with the error
// and a retryable code (the error's own when it is ResourceExhausted,
// Unavailable, DeadlineExceeded, Canceled or Aborted, else Unavailable), which
// the kubelet records on the pod and retries. Each call is bounded by
// Options.Volumes.ContentTimeout.
type ContentProvider interface {
	Content(ctx context.Context, v *api.Volume) (map[string]api.File, error)
}

// ContentBounder is an optional interface of a ContentProvider whose answers
// are bounded, as those of a plugin (framework/plugin) are: an answer never
// exceeds ContentLimits, whose MaxBytes counts as content.Cost does (data,
// paths and content.FileOverhead per file). The driver reserves MaxBytes
// from Options.Volumes.ContentBytesInFlight before each call, releases it once the
// files are written, and writes them under the same limits. Providers
// without it are not counted and their files are written under the content
// package's default limits: they are the driver's own code, whose answers
// are in memory before the driver sees them.
type ContentBounder interface {
	ContentProvider
	ContentLimits() content.Limits
}

// BackendFuncs adapts plain functions to the Backend interface. A nil DeleteFunc
// deletes nothing.
type BackendFuncs struct {
	CreateFunc func(ctx context.Context, v *api.Volume) (api.Source, error)
	DeleteFunc func(ctx context.Context, v *api.Volume) error
}

// Create calls f.CreateFunc.
func (f BackendFuncs) Create(ctx context.Context, v *api.Volume) (api.Source, error) {
	return f.CreateFunc(ctx, v)
}

// Delete calls f.DeleteFunc when set.
func (f BackendFuncs) Delete(ctx context.Context, v *api.Volume) error {
	if f.DeleteFunc == nil {
		return nil
	}
	return f.DeleteFunc(ctx, v)
}

// ContentFunc adapts a function to the ContentProvider interface.
type ContentFunc func(ctx context.Context, v *api.Volume) (map[string]api.File, error)

// Content calls f.
func (f ContentFunc) Content(ctx context.Context, v *api.Volume) (map[string]api.File, error) {
	return f(ctx, v)
}

// HealthChecker is implemented by backends that can tell whether the storage of a
// published volume is intact (a backing file deleted, a loop device detached).
// NodeGetVolumeStats reports a failed check as an abnormal VolumeCondition with
// the error's message.
type HealthChecker interface {
	Check(ctx context.Context, v *api.Volume) error
}

// Authorizer approves a volume before anything is created for it, for example
// from a namespace allow-list, required pod labels or a SubjectAccessReview. It
// runs on every first publish (a republish of a live volume is not re-checked).
// Return an error wrapping api.ErrPermissionDenied, with a message saying what
// the pod lacks, to refuse with PermissionDenied; any other error is treated as
// transient (Unavailable) so the kubelet retries.
type Authorizer interface {
	Authorize(ctx context.Context, v *api.Volume) error
}

// AuthorizerFunc adapts a function to the Authorizer interface.
type AuthorizerFunc func(ctx context.Context, v *api.Volume) error

// Authorize calls f.
func (f AuthorizerFunc) Authorize(ctx context.Context, v *api.Volume) error { return f(ctx, v) }

// A Runnable is a component that runs beside the driver (Options.Runnables):
// Run blocks until ctx ends and then returns, after releasing what it holds.
type Runnable interface {
	Run(ctx context.Context) error
}

// RunnableFunc adapts a function to the Runnable interface.
type RunnableFunc func(ctx context.Context) error

// Run calls f.
func (f RunnableFunc) Run(ctx context.Context) error { return f(ctx) }

// PodChecker confirms with the API server whether a pod still exists, by UID.
// The orphan GC asks it before tearing down a volume whose pod directory is
// gone; an error means "unknown" and the volume is kept for now. Package
// framework/kube has an implementation backed by a pod informer restricted to
// this node.
type PodChecker interface {
	PodExists(ctx context.Context, uid string) (bool, error)
}

// EventSink receives Kubernetes events about pods' volumes (Options.Observability.Events).
// The framework has no Kubernetes client of its own: package framework/events
// provides an EventSink, events.Recorder, that writes core/v1 Events itself (a
// create, then a JSON merge patch of a repeat's count) through an
// events.Client such as kube.Client.Events, not through client-go's event
// broadcaster; it is rate limited per pod and per node.
//
// Event is called on the request path and must not block: queue, rate-limit
// or drop. eventType is EventTypeNormal or EventTypeWarning; reason is one of
// the Reason constants; message is for the pod's author and holds no secrets.
type EventSink interface {
	Event(pod api.Pod, eventType, reason, message string)
}

// Event types, as in core/v1 Event.type.
const (
	EventTypeNormal  = "Normal"
	EventTypeWarning = "Warning"
)

// Reasons of the events the framework emits.
const (
	// ReasonProvisioningFailed was the reason of an event on a failed first
	// publish.
	//
	// Deprecated: the framework no longer posts it: the kubelet's FailedMount
	// event on the pod carries the same message.
	ReasonProvisioningFailed = "ProvisioningFailed"
	// ReasonRefreshFailed (Warning): refreshing a live volume's content failed;
	// the volume keeps its last good content and the refresh is retried.
	ReasonRefreshFailed = "RefreshFailed"
	// ReasonOrphanRemoved (Normal): the orphan GC removed a volume whose pod is
	// gone.
	ReasonOrphanRemoved = "OrphanRemoved"
)

// A DynamicBackend learns only at run time which of the optional interfaces
// its type has it really implements: an out-of-process plugin
// (framework/plugin) says so in its handshake, and may say otherwise after it
// restarts. The framework asks Implements before each use of an optional
// interface (Validator, Lister, HealthChecker, ContentProvider, Authorizer,
// Finder, MountOnly, Stamper, Planner, LongProvisioner) that b's type has; As does the same for code
// outside the framework.
type DynamicBackend interface {
	Backend
	// Implements reports whether the backend implements the optional
	// interface of which iface is a nil pointer, for example
	// (*framework.Lister)(nil), right now. When it cannot tell (a plugin that
	// is not reachable), it answers true: the call then fails and the
	// framework handles the failure as for any backend.
	Implements(iface any) bool
}

// As returns b as the optional interface T (Validator, Lister, ...) when b's
// type implements it and, for a DynamicBackend, b says it does now.
func As[T any](b Backend) (T, bool) {
	t, ok := b.(T)
	if !ok {
		return t, false
	}
	if db, dynamic := b.(DynamicBackend); dynamic && !db.Implements((*T)(nil)) {
		var zero T
		return zero, false
	}
	return t, true
}

// implements reports whether b implements the optional interface T (see As).
func implements[T any](b Backend) bool {
	_, ok := As[T](b)
	return ok
}

// LongProvisioner is implemented by backends whose Create may take longer
// than the kubelet waits for a NodePublishVolume (2 minutes): a filesystem
// built from a large template, a volume populated from a remote store, an
// image unpacked. The framework runs such a Create in the background, bounded
// by Options.Limits.ProvisionTimeout instead of the call's deadline: the call
// answers Aborted ("still provisioning") when it ends first, and the
// kubelet's next NodePublishVolume of the volume attaches to the Create and
// finishes the publish once it returned. An unpublish, or the orphan GC once
// the pod is gone, cancels it.
//
// Create must honour ctx: return soon after it ends. Delete must clean up what
// a cancelled or failed Create left (it receives v.State as Create left it),
// and returns nil when nothing is there. Content calls are not part of it and
// keep their own bounds. A plugin (framework/plugin) declares it in its
// handshake (CAPABILITY_LONG_PROVISIONING).
type LongProvisioner interface {
	Backend
	// LongProvisioning marks the backend; it is never called.
	LongProvisioning()
}

// ReasonProvisioningSlow (Normal): the Create of a LongProvisioner backend
// still runs when the kubelet's first call for the volume would have ended
// (2 minutes); the kubelet's retries attach to it. Posted once per volume.
const ReasonProvisioningSlow = "ProvisioningSlow"
