package provision

import (
	"context"
	"errors"
	"sync"
	"time"
)

// ErrFull is Start's error when the party already runs its Max creates.
var ErrFull = errors.New("too many creates in progress")

// ErrRunning is Start's error when the key already has an operation.
var ErrRunning = errors.New("already in progress")

// Registry is the set of creates in progress, by key (a volume ID). The zero
// value is not usable: use New.
type Registry[T any] struct {
	max int

	mu      sync.Mutex
	ops     map[string]*Op[T]
	running map[string]int // by party
	wg      sync.WaitGroup
}

// New returns a Registry that runs at most maxPerParty creates of one party
// at once (0: no cap).
func New[T any](maxPerParty int) *Registry[T] {
	return &Registry[T]{max: maxPerParty, ops: map[string]*Op[T]{}, running: map[string]int{}}
}

// Op is one create.
type Op[T any] struct {
	// Key and Party are Start's.
	Key, Party string
	// Started is when it started.
	Started time.Time

	cancel context.CancelFunc
	done   chan struct{}
	val    T
	err    error
	slow   *time.Timer

	mu       sync.Mutex
	outlived bool
}

// Options of one create.
type Options struct {
	// Timeout bounds the create (0: only Cancel ends it).
	Timeout time.Duration
	// SlowAfter, with OnSlow, calls OnSlow once when the create is still
	// running this long after it started.
	SlowAfter time.Duration
	OnSlow    func()
	// OnDone is called when fn returned, before Done is closed.
	OnDone func(err error)
}

// Start runs fn on a goroutine of its own with a context that keeps ctx's
// values but not its cancellation or deadline, bounded by o.Timeout. It fails
// with ErrRunning when key has an operation (running or not yet taken), and
// with ErrFull when party runs its maximum already.
func (r *Registry[T]) Start(ctx context.Context, key, party string, o Options, fn func(context.Context) (T, error)) (*Op[T], error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.ops[key]; ok {
		return nil, ErrRunning
	}
	if r.max > 0 && r.running[party] >= r.max {
		return nil, ErrFull
	}
	ctx = context.WithoutCancel(ctx)
	var cancel context.CancelFunc
	if o.Timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, o.Timeout)
	} else {
		ctx, cancel = context.WithCancel(ctx)
	}
	op := &Op[T]{Key: key, Party: party, Started: time.Now(), cancel: cancel, done: make(chan struct{})}
	if o.OnSlow != nil && o.SlowAfter > 0 {
		op.slow = time.AfterFunc(o.SlowAfter, o.OnSlow)
	}
	r.ops[key] = op
	r.running[party]++
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		val, err := fn(ctx)
		cancel()
		if op.slow != nil {
			op.slow.Stop()
		}
		r.mu.Lock()
		r.running[party]--
		if r.running[party] == 0 {
			delete(r.running, party)
		}
		op.val, op.err = val, err
		r.mu.Unlock()
		if o.OnDone != nil {
			o.OnDone(err)
		}
		close(op.done)
	}()
	return op, nil
}

// Get returns key's operation, nil when it has none.
func (r *Registry[T]) Get(key string) *Op[T] {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ops[key]
}

// Wait waits for op to finish until ctx ends or max passed (max ≤ 0: only
// ctx), and reports whether it finished.
func (op *Op[T]) Wait(ctx context.Context, max time.Duration) bool {
	var timeout <-chan time.Time
	if max > 0 {
		t := time.NewTimer(max)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-op.done:
		return true
	case <-ctx.Done():
	case <-timeout:
	}
	select {
	case <-op.done:
		return true
	default:
		return false
	}
}

// Done is closed when the create returned.
func (op *Op[T]) Done() <-chan struct{} { return op.done }

// Elapsed is how long op has run at now (until it finished: still counted).
func (op *Op[T]) Elapsed(now time.Time) time.Duration { return now.Sub(op.Started) }

// Outlived marks that a call ended while op ran, and reports whether it was
// the first time.
func (op *Op[T]) Outlived() bool {
	op.mu.Lock()
	defer op.mu.Unlock()
	first := !op.outlived
	op.outlived = true
	return first
}

// Take removes key's finished operation and returns its result; ok is false
// when key has no operation or it still runs.
func (r *Registry[T]) Take(key string) (val T, err error, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	op := r.ops[key]
	if op == nil {
		return val, nil, false
	}
	select {
	case <-op.done:
	default:
		return val, nil, false
	}
	delete(r.ops, key)
	return op.val, op.err, true
}

// Cancel cancels key's operation, waits for it to return until ctx ends, and
// then removes it and returns its result. found is false when key has none;
// err is ctx's error when the create did not return in time (it stays
// registered, cancelled: a later Cancel waits again).
func (r *Registry[T]) Cancel(ctx context.Context, key string) (val T, opErr error, found bool, err error) {
	op := r.Get(key)
	if op == nil {
		return val, nil, false, nil
	}
	op.cancel()
	if !op.Wait(ctx, 0) {
		return val, nil, true, ctx.Err()
	}
	val, opErr, _ = r.Take(key)
	return val, opErr, true, nil
}

// CancelAll cancels every operation and waits until they all returned or ctx
// ended. The operations stay registered.
func (r *Registry[T]) CancelAll(ctx context.Context) error {
	r.mu.Lock()
	for _, op := range r.ops {
		op.cancel()
	}
	r.mu.Unlock()
	done := make(chan struct{})
	go func() {
		r.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Running returns the creates running, by party.
func (r *Registry[T]) Running() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]int, len(r.running))
	for p, n := range r.running {
		out[p] = n
	}
	return out
}

// Started returns when each running create started, by key.
func (r *Registry[T]) Started() map[string]time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]time.Time, len(r.ops))
	for k, op := range r.ops {
		select {
		case <-op.done:
		default:
			out[k] = op.Started
		}
	}
	return out
}
