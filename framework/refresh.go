package framework

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/content"
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
// kinds, republish included, share one semaphore of RefreshConcurrency slots.
//
// It keeps in memory (never on disk) the secrets and tokens of the last publish
// of each volume, so a driver-initiated refresh can hand them to the content
// provider.
type refresher struct {
	d   *Driver
	sem chan struct{}

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

func newRefresher(d *Driver, concurrency int) *refresher {
	return &refresher{
		d:       d,
		sem:     make(chan struct{}, concurrency),
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
	if iv := r.d.opts.Volumes.RefreshInterval; iv > 0 && r.d.anyContent() {
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
		r.d.refreshOne(ctx, id)
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

// Refresh rewrites the content of one volume now (asynchronously, within the
// refresh concurrency cap), with the secrets and tokens of its last publish.
// It returns an error when the driver is not running or the volume is unknown.
func (d *Driver) Refresh(ctx context.Context, volumeID string) error {
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

// RefreshAll rewrites the content of every published volume, for an event such
// as a CA rotation. Volumes start at random offsets within spread (0: at once)
// and never more than RefreshConcurrency at a time.
func (d *Driver) RefreshAll(ctx context.Context, spread time.Duration) error {
	if !d.anyContent() {
		return errors.New("the driver has no content provider")
	}
	return d.refreshAll(ctx, spread)
}

func (d *Driver) refreshAll(ctx context.Context, spread time.Duration) error {
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

// refreshOne is a driver-initiated refresh of one volume.
func (d *Driver) refreshOne(ctx context.Context, id string) {
	log := d.opts.Observability.Logger.WithValues(logkeys.VolumeID, id)
	if !d.locks.TryAcquire(id) {
		d.refresher.schedule(id, busyRetry) // a publish or unpublish holds it
		return
	}
	defer d.locks.Release(id)
	rec, err := d.store.Get(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		d.refresher.forget(id)
		return
	}
	if err != nil {
		log.Error(err, "Refresh: reading volume state")
		d.refresher.failed(id)
		return
	}
	if rec.Phase != store.PhasePublished {
		return
	}
	if d.contentFor(rec.Backend) == nil {
		d.refresher.forget(id)
		return
	}
	if rec.Rebuilt {
		// Rebuilt from the node: the pod's identity and attributes are unknown
		// until its next publish, which refreshes the content itself.
		return
	}
	if mounted, err := d.mounter.IsMountPoint(d.opts.Node.KubeletRootDir, rec.TargetPath); err != nil || !mounted {
		return // the next republish repairs it, with fresh content
	}
	v := d.fromRecord(rec)
	c := d.refresher.credsOf(id)
	v.Secrets, v.Tokens = c.secrets, c.tokens
	if err := d.refreshContent(klog.NewContext(ctx, log), v); err != nil {
		d.refreshFailed(klog.NewContext(ctx, log), id, err)
		return
	}
	d.refresher.succeeded(id)
	log.V(2).Info("Refreshed content")
}

// refreshFailed logs a failed refresh and schedules a retry with backoff, unless
// the content provider refused the volume's inputs (ErrInvalidParams, e.g. a
// token the kubelet did not send): retrying the same inputs cannot succeed, so
// the volume waits for its next republish.
func (d *Driver) refreshFailed(ctx context.Context, id string, err error) {
	log := klog.FromContext(ctx)
	if errors.Is(err, api.ErrInvalidParams) {
		log.Error(err, "Content refresh refused its inputs; keeping the last good content until the next republish")
		return
	}
	delay := d.refresher.failed(id)
	log.Error(err, "Content refresh failed; keeping the last good content", logkeys.RetryIn, delay)
}

// refreshContent asks the content provider for v's files and swaps them in,
// making a read-only volume writable only for the swap. The caller holds the
// volume's lock. On any error the previous content stays in place.
func (d *Driver) refreshContent(ctx context.Context, v *api.Volume) (err error) {
	defer func() { d.refreshed(v, err) }()
	select {
	case d.refresher.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-d.refresher.sem }()
	files, release, err := d.content(ctx, v)
	if err != nil {
		return err
	}
	defer release()
	if v.ReadOnly {
		if err := d.mounter.SetReadOnly(d.opts.Node.KubeletRootDir, v.TargetPath, false); err != nil {
			return fmt.Errorf("making volume writable for the refresh: %w", err)
		}
		defer func() {
			if rerr := d.mounter.SetReadOnly(d.opts.Node.KubeletRootDir, v.TargetPath, true); rerr != nil {
				klog.FromContext(ctx).Error(rerr, "Making volume read-only again after a refresh")
			}
		}()
	}
	return d.writeContent(ctx, v, files)
}

// content calls the content provider of v's backend (contentFor) within
// ContentTimeout and, for a provider whose answers are bounded, within the
// ContentBytesInFlight budget: its bound is reserved before the call, and
// release returns it once the caller has written the files (until then they
// are in memory). release is never nil.
func (d *Driver) content(ctx context.Context, v *api.Volume) (files map[string]api.File, release func(), err error) {
	release = func() {}
	cp := d.contentFor(v.Backend)
	if cp == nil {
		return nil, release, fmt.Errorf("backend %s has no content provider", v.Backend)
	}
	ctx, cancel := context.WithTimeout(ctx, d.opts.Volumes.ContentTimeout)
	defer cancel()
	if cb, ok := cp.(ContentBounder); ok {
		if release, err = d.contentBudget.reserve(ctx, cb.ContentLimits().MaxBytes); err != nil {
			return nil, func() {}, err
		}
	}
	files, err = cp.Content(ctx, v)
	if err != nil {
		release()
		return nil, func() {}, fmt.Errorf("content provider: %w", err)
	}
	return files, release, nil
}

// writeContent swaps files into the volume atomically, owned by the fsGroup,
// under the limits of a provider that declares them (those its answer was
// checked against), else the content package's defaults. It stops when ctx
// is done, the previous content in place.
func (d *Driver) writeContent(ctx context.Context, v *api.Volume, files map[string]api.File) error {
	var opts content.Options
	if !isWindows {
		opts.FSGroup = v.FSGroup
	}
	if cb, ok := d.contentFor(v.Backend).(ContentBounder); ok {
		opts.Limits = cb.ContentLimits()
	}
	r, err := d.mounter.OpenTarget(d.opts.Node.KubeletRootDir, v.TargetPath)
	if err != nil {
		return fmt.Errorf("writing content: %w", err)
	}
	defer r.Close()
	err = content.WriteRoot(ctx, r, files, opts)
	if errors.Is(err, content.ErrNoSpace) && v.Size > 0 {
		return fmt.Errorf("%w; the volume's size is %s: ask for a larger \"size\" in the pod's volumeAttributes", err, bytes(v.Size))
	}
	if err != nil {
		return fmt.Errorf("writing content: %w", err)
	}
	return nil
}

// contentFor returns what fills the volumes of the named backend: the backend
// itself when it is a ContentProvider (a plugin that provides content),
// otherwise Options.Content; nil when neither.
func (d *Driver) contentFor(backend string) ContentProvider {
	if cp, ok := As[ContentProvider](d.opts.Backends[backend]); ok {
		return cp
	}
	return d.opts.Content
}

// anyContent reports whether any volume of this driver may have content:
// Options.Content is set or a backend's type is a ContentProvider.
func (d *Driver) anyContent() bool {
	if d.opts.Content != nil {
		return true
	}
	for _, b := range d.opts.Backends {
		if _, ok := b.(ContentProvider); ok {
			return true
		}
	}
	return false
}

// authorizers returns what approves a first publish of a volume of the named
// backend: Options.Volumes.Authorizer, then the backend itself when it is an
// Authorizer. Each must approve.
func (d *Driver) authorizers(backend string) []Authorizer {
	var as []Authorizer
	if d.opts.Volumes.Authorizer != nil {
		as = append(as, d.opts.Volumes.Authorizer)
	}
	if a, ok := As[Authorizer](d.opts.Backends[backend]); ok {
		as = append(as, a)
	}
	return as
}
