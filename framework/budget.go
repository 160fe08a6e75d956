package framework

import (
	"context"
	"errors"
	"sync/atomic"

	"golang.org/x/sync/semaphore"

	"github.com/ephemera-csi/ephemera/api"
)

// budget is Options.Volumes.ContentBytesInFlight: the bytes that content answers in
// flight may take, reserved in full before each bounded call. Waiters are
// served in order; a waiter whose context ends gets ResourceExhausted.
type budget struct {
	size  int64
	sem   *semaphore.Weighted
	inUse atomic.Int64
}

func newBudget(size int64) *budget {
	return &budget{size: size, sem: semaphore.NewWeighted(size)}
}

// reserve waits for n bytes of the budget (at most its size: New refuses a
// larger bound) until ctx ends, and returns their release, which may be
// called once.
func (b *budget) reserve(ctx context.Context, n int64) (release func(), err error) {
	n = min(max(n, 0), b.size)
	if err := b.sem.Acquire(ctx, n); err != nil {
		if errors.Is(err, context.Canceled) {
			return nil, err // the caller went away: nobody reads a message
		}
		return nil, kindf(api.ErrResourceExhausted, "content answers in flight take the driver's budget of %s (--content-bytes-in-flight, %s of it in use); this volume's content provider needs %s of it: the kubelet retries",
			bytes(b.size), bytes(b.inUse.Load()), bytes(n))
	}
	b.inUse.Add(n)
	var once atomic.Bool
	return func() {
		if once.CompareAndSwap(false, true) {
			b.inUse.Add(-n)
			b.sem.Release(n)
		}
	}, nil
}
