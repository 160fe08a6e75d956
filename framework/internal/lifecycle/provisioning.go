package lifecycle

import (
	"context"
	"time"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/provision"
)

// This file wires long provisioning (LongProvisioner; its runner is
// internal/provision's Provisions): the Create of such a
// backend runs in the background, past the NodePublishVolume that started
// it, and the kubelet's next NodePublishVolume of the volume attaches to it.
// The lifecycle calls in at four points, each marked "long provisioning":
//
//   - createVolume: such a backend always gets an intent record (so that a
//     restart mid-way rolls it back), its Create goes through
//     createOrProvision, and a publish that ends while it runs is not rolled
//     back (provision.IsStillProvisioning);
//   - republish: the same request for a volume with a Create in the registry
//     is the case whenProvisioning, whose row attaches to it
//     (attachProvision; a changed request is refused first, as always);
//   - teardown: d.provisions.Stop cancels the Create and waits for it to
//     return before Delete, so that Delete sees what it left;
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

// newProvisions returns the runner of the background Creates of a validated
// cfg; their slow ones post ReasonProvisioningSlow through d.
func newProvisions(d *Engine, cfg *Config) *provision.Provisions {
	return provision.NewProvisions(provision.Config{
		OperationTimeout: cfg.Limits.OperationTimeout,
		ProvisionTimeout: cfg.Limits.ProvisionTimeout,
		MaxPerBackend:    cfg.Limits.MaxInFlightPerBackend,
		OnSlow: func(pod api.Pod, message string) {
			d.event(pod, EventTypeNormal, ReasonProvisioningSlow, message)
		},
	})
}

// createOrProvision is Backend.Create of a first publish (createVolume): in
// the background for a LongProvisioner (provision.Provisions.Start).
func (d *Engine) createOrProvision(ctx context.Context, pr *publishRequest, v *api.Volume) (api.Source, error) {
	b := pr.backend
	if !b.LongProvisioning() {
		return d.storage.Create(ctx, b, v)
	}
	return d.provisions.Start(ctx, v, func(ctx context.Context, v *api.Volume) (api.Source, error) {
		return d.storage.Create(ctx, b, v)
	})
}

// StopProvisions cancels the background Creates when the driver stops.
func (d *Engine) StopProvisions() error { return d.provisions.StopAll() }

// ProvisioningSince marks the volumes of list whose Create runs in the
// background (GET /volumes).
func (d *Engine) ProvisioningSince(list []api.VolumeInfo) { d.provisions.Since(list) }

// SetProvisionSlowAfter scales provision.KubeletDeadline, after which a
// background Create posts ReasonProvisioningSlow, for later publishes (tests).
func (d *Engine) SetProvisionSlowAfter(after time.Duration) { d.provisions.SetSlowAfter(after) }
