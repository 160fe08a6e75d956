package refresh

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/api"
)

// Backoff of a volume whose refresh failed.
const (
	refreshBackoffMin = time.Second
	refreshBackoffMax = 5 * time.Minute
	// BusyRetry is how soon a refresh that found its volume locked (a publish or
	// unpublish in progress) tries again.
	BusyRetry = time.Second
)

// Scheduler times the driver-initiated content refreshes: Refresh, RefreshAll,
// the periodic RefreshInterval and retries of failed refreshes; each one fires
// the lifecycle's refresh event (the fire func it was made with), which takes a
// slot of the refresh lane.
//
// It keeps in memory (never on disk) the secrets and tokens of the last publish
// of each volume, so a driver-initiated refresh can hand them to the content
// provider.
type Scheduler struct {
	fire func(ctx context.Context, id string)

	mu      sync.Mutex
	ctx     context.Context // set while the driver runs
	creds   map[string]Creds
	backoff map[string]time.Duration
	timers  map[string]*time.Timer
	wg      sync.WaitGroup
}

// Creds are the secrets and tokens of a volume's latest publish.
type Creds struct {
	Secrets api.Secrets
	Tokens  api.Tokens
}

// New returns a Scheduler whose timers call fire.
func New(fire func(ctx context.Context, id string)) *Scheduler {
	return &Scheduler{
		fire:    fire,
		creds:   map[string]Creds{},
		backoff: map[string]time.Duration{},
		timers:  map[string]*time.Timer{},
	}
}

// Start enables refreshes until ctx ends, and runs periodic every interval
// (0: never); Stop waits for them.
func (r *Scheduler) Start(ctx context.Context, interval time.Duration, periodic func(ctx context.Context, spread time.Duration) error) {
	r.mu.Lock()
	r.ctx = ctx
	r.mu.Unlock()
	if iv := interval; iv > 0 {
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
					if err := periodic(ctx, iv); err != nil {
						klog.FromContext(ctx).Error(err, "Periodic refresh")
					}
				}
			}
		}()
	}
}

// Stop ends the refreshes and waits for those running.
func (r *Scheduler) Stop() {
	r.mu.Lock()
	r.ctx = nil
	for id := range r.timers {
		r.cancelLocked(id)
	}
	r.mu.Unlock()
	r.wg.Wait()
}

// Remember keeps the credentials of a volume's latest publish.
func (r *Scheduler) Remember(v *api.Volume) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.creds[v.ID] = Creds{v.Secrets, v.Tokens}
}

// CredsOf returns the credentials of id's latest publish this process saw.
func (r *Scheduler) CredsOf(id string) Creds {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.creds[id]
}

// Forget drops everything about a volume that is gone.
func (r *Scheduler) Forget(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.creds, id)
	delete(r.backoff, id)
	r.cancelLocked(id)
}

// cancelLocked stops id's pending timer. A timer stopped before it fired never
// runs its function, so its WaitGroup count is released here.
func (r *Scheduler) cancelLocked(id string) {
	if t := r.timers[id]; t != nil {
		if t.Stop() {
			r.wg.Done()
		}
		delete(r.timers, id)
	}
}

// Schedule runs a refresh of id after delay, unless one is already scheduled
// sooner. It does nothing while the driver is not running.
func (r *Scheduler) Schedule(id string, delay time.Duration) {
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
		r.fire(ctx, id)
	})
	r.timers[id] = t
}

// Failed records a failed refresh of id and schedules a retry with exponential
// backoff and jitter.
func (r *Scheduler) Failed(id string) time.Duration {
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
	r.Schedule(id, delay)
	return delay
}

// Succeeded resets id's backoff.
func (r *Scheduler) Succeeded(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.backoff, id)
}
