package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/logkeys"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// Refresh is framework.Driver.Refresh.
func (d *Engine) Refresh(ctx context.Context, volumeID string) error {
	if !d.fill.Any() {
		return errors.New("the driver has no content provider")
	}
	if _, err := d.store.Get(ctx, volumeID); err != nil {
		return fmt.Errorf("volume %s: %w", volumeID, err)
	}
	if !d.running.Load() {
		return errors.New("the driver is not running")
	}
	d.refresher.Schedule(volumeID, 0)
	return nil
}

// RefreshAll is framework.Driver.RefreshAll.
func (d *Engine) RefreshAll(ctx context.Context, spread time.Duration) error {
	if !d.fill.Any() {
		return errors.New("the driver has no content provider")
	}
	return d.refreshAll(ctx, spread)
}

func (d *Engine) refreshAll(ctx context.Context, spread time.Duration) error {
	recs, err := d.store.List(ctx)
	if err != nil {
		return err
	}
	for _, rec := range recs {
		if rec.Phase != store.PhasePublished || rec.Rebuilt {
			continue
		}
		var delay time.Duration
		if spread > 0 {
			delay = rand.N(spread)
		}
		d.refresher.Schedule(rec.VolumeID, delay)
	}
	return nil
}

// refreshFailed logs a failed refresh and schedules a retry with backoff, unless
// the content provider refused the volume's inputs (ErrInvalidParams, e.g. a
// token the kubelet did not send): retrying the same inputs cannot succeed, so
// the volume waits for its next republish.
func (d *Engine) refreshFailed(ctx context.Context, id string, err error) {
	log := klog.FromContext(ctx)
	if errors.Is(err, api.ErrInvalidParams) {
		log.Error(err, "Content refresh refused its inputs; keeping the last good content until the next republish")
		return
	}
	delay := d.refresher.Failed(id)
	log.Error(err, "Content refresh failed; keeping the last good content", logkeys.RetryIn, delay)
}
