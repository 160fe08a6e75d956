package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/logkeys"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// Backoff of a volume whose refresh failed.
const (
	refreshBackoffMin = time.Second
	refreshBackoffMax = 5 * time.Minute
	// busyRetry is how soon a refresh that found its volume locked (a publish or
	// unpublish in progress) tries again.
	busyRetry = time.Second
)

// refresher runs driver-initiated content refreshes: Refresh, RefreshAll, the
// periodic RefreshInterval and retries of failed refreshes. Refreshes of all
// kinds, republish included, take a slot of the refresh lane (lanes.go):
// RefreshConcurrency per content provider, one of them reserved.
//
// It keeps in memory (never on disk) the secrets and tokens of the last publish
// of each volume, so a driver-initiated refresh can hand them to the content
// provider.
type refresher struct {
	d *Engine

	mu      sync.Mutex
	ctx     context.Context // set while the driver runs
	creds   map[string]creds
	backoff map[string]time.Duration
	timers  map[string]*time.Timer
	wg      sync.WaitGroup
}

type creds struct {
	secrets api.Secrets
	tokens  api.Tokens
}

func newRefresher(d *Engine) *refresher {
	return &refresher{
		d:       d,
		creds:   map[string]creds{},
		backoff: map[string]time.Duration{},
		timers:  map[string]*time.Timer{},
	}
}

// start enables driver-initiated refreshes until ctx ends; stop waits for them.
func (r *refresher) start(ctx context.Context) {
	r.mu.Lock()
	r.ctx = ctx
	r.mu.Unlock()
	if iv := r.d.cfg.Volumes.RefreshInterval; iv > 0 && r.d.anyContent() {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			t := time.NewTicker(iv)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					if err := r.d.refreshAll(ctx, iv); err != nil {
						klog.FromContext(ctx).Error(err, "Periodic refresh")
					}
				}
			}
		}()
	}
}

func (r *refresher) stop() {
	r.mu.Lock()
	r.ctx = nil
	for id := range r.timers {
		r.cancelLocked(id)
	}
	r.mu.Unlock()
	r.wg.Wait()
}

// remember keeps the credentials of a volume's latest publish.
func (r *refresher) remember(v *api.Volume) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.creds[v.ID] = creds{v.Secrets, v.Tokens}
}

// credsOf returns the credentials of id's latest publish this process saw.
func (r *refresher) credsOf(id string) creds {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.creds[id]
}

// forget drops everything about a volume that is gone.
func (r *refresher) forget(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.creds, id)
	delete(r.backoff, id)
	r.cancelLocked(id)
}

// cancelLocked stops id's pending timer. A timer stopped before it fired never
// runs its function, so its WaitGroup count is released here.
func (r *refresher) cancelLocked(id string) {
	if t := r.timers[id]; t != nil {
		if t.Stop() {
			r.wg.Done()
		}
		delete(r.timers, id)
	}
}

// schedule runs a refresh of id after delay, unless one is already scheduled
// sooner. It does nothing while the driver is not running.
func (r *refresher) schedule(id string, delay time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ctx := r.ctx
	if ctx == nil || ctx.Err() != nil {
		return
	}
	r.cancelLocked(id)
	r.wg.Add(1)
	var t *time.Timer
	t = time.AfterFunc(delay, func() {
		defer r.wg.Done()
		r.mu.Lock()
		if r.timers[id] == t {
			delete(r.timers, id)
		}
		r.mu.Unlock()
		r.d.refreshVolume(ctx, id)
	})
	r.timers[id] = t
}

// failed records a failed refresh of id and schedules a retry with exponential
// backoff and jitter.
func (r *refresher) failed(id string) time.Duration {
	r.mu.Lock()
	b := r.backoff[id]
	switch {
	case b == 0:
		b = refreshBackoffMin
	case b < refreshBackoffMax:
		b = min(2*b, refreshBackoffMax)
	}
	r.backoff[id] = b
	r.mu.Unlock()
	delay := b/2 + rand.N(b/2+1)
	r.schedule(id, delay)
	return delay
}

func (r *refresher) succeeded(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.backoff, id)
}

// Refresh is framework.Driver.Refresh.
func (d *Engine) Refresh(ctx context.Context, volumeID string) error {
	if !d.anyContent() {
		return errors.New("the driver has no content provider")
	}
	if _, err := d.store.Get(ctx, volumeID); err != nil {
		return fmt.Errorf("volume %s: %w", volumeID, err)
	}
	if !d.running.Load() {
		return errors.New("the driver is not running")
	}
	d.refresher.schedule(volumeID, 0)
	return nil
}

// RefreshAll is framework.Driver.RefreshAll.
func (d *Engine) RefreshAll(ctx context.Context, spread time.Duration) error {
	if !d.anyContent() {
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
		d.refresher.schedule(rec.VolumeID, delay)
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
	delay := d.refresher.failed(id)
	log.Error(err, "Content refresh failed; keeping the last good content", logkeys.RetryIn, delay)
}
