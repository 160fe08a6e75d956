package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/errkind"
	"github.com/ephemera-csi/ephemera/framework/internal/logkeys"
	"github.com/ephemera-csi/ephemera/framework/internal/provision"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// This file holds long provisioning (LongProvisioner): the Create of such a
// backend runs in the background, past the NodePublishVolume that started
// it, and the kubelet's next NodePublishVolume of the volume attaches to it.
// The lifecycle calls in at four points, each marked "long provisioning":
//
//   - createVolume: such a backend always gets an intent record (so that a
//     restart mid-way rolls it back), its Create goes through
//     createOrProvision, and a publish that ends while it runs is not rolled
//     back (isStillProvisioning);
//   - republish: the same request for a volume with a Create in the registry
//     is the case whenProvisioning, whose row attaches to it
//     (attachProvision; a changed request is refused first, as always);
//   - teardown: stopProvision cancels the Create and waits for it to return
//     before Delete, so that Delete sees what it left;
//   - Run's components (internal/daemon): StopProvisions cancels every
//     Create at shutdown (their intent records make the next start roll them back).
//
// A background Create holds none of the node's shared resources: the
// publish's in-flight slot and the volume's lock go with the call that
// started it, and no content budget is taken before the attach (fill runs
// then). It counts only against its backend's own share: at most
// Limits.MaxInFlightPerBackend of one backend's Creates run in the
// background at once. The capacity reserved for the volume stays reserved
// until the publish finishes or the volume is torn down.

// provisioned is what a background Create returned: the source to publish
// and v.State as it left it (what Delete needs).
type provisioned struct {
	src   api.Source
	state map[string]string
}

// kubeletDeadline is the kubelet's deadline for one NodePublishVolume
// (pkg/volume/csi csiTimeout). A Create still running this long after it
// started posts ReasonProvisioningSlow once.
const kubeletDeadline = 2 * time.Minute

// provisionState is the Driver's long provisioning state.
type provisionState struct {
	reg       *provision.Registry[provisioned]
	slowAfter atomic.Int64 // kubeletDeadline; tests scale it (export_test.go)
}

// newProvisions returns the registry of background Creates of a validated
// Config.
func newProvisions(o *Config) *provisionState {
	p := &provisionState{reg: provision.New[provisioned](o.Limits.MaxInFlightPerBackend)}
	p.slowAfter.Store(int64(kubeletDeadline))
	return p
}

// longProvisioning reports whether b's Create runs in the background.
func longProvisioning(b Backend) bool { return b.LongProvisioning() }

// stillProvisioning is the error of a publish that ended while its Create
// goes on in the background: Aborted, nothing rolled back.
type stillProvisioning struct{ msg string }

func (e *stillProvisioning) Error() string { return e.msg }

// isStillProvisioning reports whether err says that the volume's Create goes
// on in the background.
func isStillProvisioning(err error) bool {
	var s *stillProvisioning
	return errors.As(err, &s)
}

// provisionWait is how long one publish waits for a background Create: half
// its bound, the other half is for the mount and the content.
func (d *Engine) provisionWait() time.Duration { return d.cfg.Limits.OperationTimeout / 2 }

// createOrProvision is Backend.Create of a first publish (createVolume). For a
// LongProvisioner it starts Create in the background and waits for it at
// most provisionWait: when it returned, as createStorage; else an error that
// isStillProvisioning.
func (d *Engine) createOrProvision(ctx context.Context, pr *publishRequest, v *api.Volume) (api.Source, error) {
	if !longProvisioning(pr.backend) {
		return d.storage.Create(ctx, pr.backend, v)
	}
	b, cv := pr.backend, *v
	cv.State = maps.Clone(v.State) // the background Create's own
	pod, name, backend := v.Pod, v.Name, v.Backend
	slowAfter := time.Duration(d.provisions.slowAfter.Load())
	d.metrics.Provisioning(backend, 1)
	op, err := d.provisions.reg.Start(ctx, v.ID, backend, provision.Options{
		Timeout:   d.cfg.Limits.ProvisionTimeout,
		SlowAfter: slowAfter,
		OnSlow: func() {
			d.event(pod, EventTypeNormal, ReasonProvisioningSlow, fmt.Sprintf(
				"Volume %s is still being provisioned by backend %s after %s, longer than the kubelet waits for one call: its retries attach to it (at most %s, --provision-timeout)",
				name, backend, slowAfter.Round(time.Second), d.cfg.Limits.ProvisionTimeout))
		},
		OnDone: func(error) { d.metrics.Provisioning(backend, -1) },
	}, func(ctx context.Context) (provisioned, error) {
		src, err := d.storage.Create(ctx, b, &cv)
		return provisioned{src: src, state: cv.State}, err
	})
	if err != nil {
		d.metrics.Provisioning(backend, -1)
		if errors.Is(err, provision.ErrFull) {
			return api.Source{}, errkind.Errorf(api.ErrResourceExhausted, "%d volumes of backend %s are already provisioning in the background on this node, its share (--max-in-flight-per-backend %d); the kubelet retries",
				d.cfg.Limits.MaxInFlightPerBackend, backend, d.cfg.Limits.MaxInFlightPerBackend)
		}
		return api.Source{}, errkind.Errorf(api.ErrBusy, "volume %s: %v", v.ID, err)
	}
	return d.awaitProvision(ctx, v, op)
}

// awaitProvision waits at most provisionWait for op, the background Create
// of v, until ctx ends. When it returned, its result is taken from the
// registry: its source, and its v.State into v.
func (d *Engine) awaitProvision(ctx context.Context, v *api.Volume, op *provision.Op[provisioned]) (api.Source, error) {
	if !op.Wait(ctx, d.provisionWait()) {
		elapsed := op.Elapsed(time.Now())
		if op.Outlived() {
			d.metrics.ProvisionOutlived(v.Backend)
			klog.FromContext(ctx).Info("The volume's Create goes on in the background past the publish; the kubelet's retry attaches to it", logkeys.Duration, elapsed)
		}
		return api.Source{}, errkind.With(api.ErrBusy, &stillProvisioning{fmt.Sprintf(
			"volume %s is still provisioning, %d s so far (backend %s, at most %s: --provision-timeout); the kubelet retries",
			v.ID, int(elapsed.Seconds()), v.Backend, d.cfg.Limits.ProvisionTimeout)})
	}
	res, err, ok := d.provisions.reg.Take(v.ID)
	if !ok {
		return api.Source{}, errkind.Errorf(errkind.ErrInternal, "volume %s: the result of its background Create is gone", v.ID)
	}
	v.State = res.state
	return res.src, err
}

// provisioningNow reports whether volume id has a background Create in the
// registry (running, or returned and not yet attached to).
func (d *Engine) provisioningNow(id string) bool { return d.provisions.reg.Get(id) != nil }

// awaitProvisioned waits for the background Create of v (attachProvision)
// as awaitProvision does.
func (d *Engine) awaitProvisioned(ctx context.Context, v *api.Volume) (api.Source, error) {
	op := d.provisions.reg.Get(v.ID)
	if op == nil {
		return api.Source{}, errkind.Errorf(errkind.ErrInternal, "volume %s: its background Create is gone", v.ID)
	}
	return d.awaitProvision(ctx, v, op)
}

// stopProvision cancels the background Create of rec's volume, if any, and
// waits for it to return (at most provisionWait, within ctx): teardown then
// deletes what it left, with the v.State it left (into rec.State). A Create
// that does not return in time fails the teardown with Aborted (the kubelet
// retries; the Create stays cancelled).
func (d *Engine) stopProvision(ctx context.Context, rec *store.Record) error {
	if !d.provisioningNow(rec.VolumeID) {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, d.provisionWait())
	defer cancel()
	res, opErr, found, err := d.provisions.reg.Cancel(wctx, rec.VolumeID)
	if err != nil {
		return errkind.Errorf(api.ErrBusy, "volume %s: the Create of backend %s was cancelled and has not returned yet; the kubelet retries", rec.VolumeID, rec.Backend)
	}
	if found {
		rec.State = res.state
		klog.FromContext(ctx).V(2).Info("Cancelled the volume's background Create", logkeys.Err, fmt.Sprint(opErr))
	}
	return nil
}

// StopProvisions cancels the background Creates when the driver stops, and
// waits a little for them: their intent records make the next start roll back
// what they left.
func (d *Engine) StopProvisions() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return d.provisions.reg.CancelAll(ctx)
}

// ProvisioningSince marks the volumes of list whose Create runs in the
// background (GET /volumes).
func (d *Engine) ProvisioningSince(list []api.VolumeInfo) {
	started := d.provisions.reg.Started()
	for i := range list {
		if t, ok := started[list[i].VolumeID]; ok {
			list[i].ProvisioningSince = &t
		}
	}
}

// SetProvisionSlowAfter scales kubeletDeadline, after which a background
// Create posts ReasonProvisioningSlow, for later publishes (tests).
func (d *Engine) SetProvisionSlowAfter(after time.Duration) {
	d.provisions.slowAfter.Store(int64(after))
}
