package drivertest

import (
	"context"
	"math"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The kubelet's schedule for a volume operation that failed: its volume
// manager runs operations through nestedpendingoperations, which keeps one
// exponential backoff per volume (pkg/util/goroutinemap/exponentialbackoff);
// its reconciler looks every 100 ms for work whose backoff has passed; each
// CSI call has a 2 minute deadline (pkg/volume/csi csiTimeout).
const (
	kubeletInitialBackoff  = 500 * time.Millisecond
	kubeletMaxBackoff      = 2*time.Minute + 2*time.Second
	kubeletReconcilePeriod = 100 * time.Millisecond
)

// Backoff is how the kubelet retries a failed NodePublishVolume or
// NodeUnpublishVolume of one volume: after the n-th failure in a row the
// volume's next operation waits Initial·2^(n-1), at most Max, counted from
// the moment the failed attempt ended; it then starts on the next tick of the
// reconciler's loop, every Period. A success forgets the failures. Each
// attempt is bounded by Timeout, the CSI call's deadline.
//
// [KubeletBackoff] is the kubelet's schedule, scaled. The zero Backoff
// retries at once, without end but for the context.
type Backoff struct {
	// Initial is the wait after the first failure (the kubelet's: 500ms).
	Initial time.Duration
	// Max bounds the wait, which doubles with every further failure (the
	// kubelet's: 2m2s). 0: no bound.
	Max time.Duration
	// Period is the reconciler loop's: a retry starts on the first tick
	// after its wait, ticks being the multiples of Period since the zero
	// time, shared by every operation of the process as the kubelet's one
	// loop is (the kubelet's: 100ms). 0: at once after the wait.
	Period time.Duration
	// Timeout bounds each attempt (the kubelet's CSI deadline: 2m). 0: only
	// the context given to Retry. [Kubelet] operations have their own bound,
	// KubeletOptions.Timeout.
	Timeout time.Duration
	// Attempts bounds how many attempts Retry makes: 1 sends one and never
	// retries. 0: no bound but the context.
	Attempts int
}

// KubeletBackoff returns the kubelet's schedule with every duration
// multiplied by scale: 1 is the kubelet's own (500ms doubling to at most
// 2m2s, a 100ms loop, a 2m deadline); 1.0/15 runs the same shape fifteen
// times faster, for a driver whose own timeouts are scaled alike (a content
// timeout of 2s instead of 30s). A scale that is not positive is 1.
func KubeletBackoff(scale float64) Backoff {
	if !(scale > 0) {
		scale = 1
	}
	d := func(x time.Duration) time.Duration {
		return max(time.Duration(math.Round(float64(x)*scale)), time.Nanosecond)
	}
	return Backoff{
		Initial: d(kubeletInitialBackoff),
		Max:     d(kubeletMaxBackoff),
		Period:  d(kubeletReconcilePeriod),
		Timeout: d(kubeletCSITimeout),
	}
}

// Wait returns how long the next attempt waits after failures failures in a
// row (none: 0): Initial, doubled for each failure after the first, at most
// Max.
func (b Backoff) Wait(failures int) time.Duration {
	if failures <= 0 {
		return 0
	}
	w := b.Initial
	for range failures - 1 {
		if (b.Max > 0 && w >= b.Max) || w > math.MaxInt64/2 {
			break
		}
		w *= 2
	}
	if b.Max > 0 {
		w = min(w, b.Max)
	}
	return w
}

// Next returns when the next attempt starts after an attempt that ended at
// failedAt with failures failures in a row: the first tick of the reconciler
// loop strictly after failedAt+Wait(failures), as the kubelet's
// SafeToRetry refuses a retry until the wait has passed.
func (b Backoff) Next(failedAt time.Time, failures int) time.Time {
	at := failedAt.Add(b.Wait(failures))
	if b.Period <= 0 {
		return at
	}
	return at.Truncate(b.Period).Add(b.Period)
}

// Attempt is one try of a retried operation.
type Attempt struct {
	// Start is when it was sent.
	Start time.Time
	// Latency is how long it took to answer.
	Latency time.Duration
	// Code is its gRPC code (OK for success, Unknown for an error without
	// one).
	Code codes.Code
	// Err is its error, nil for success.
	Err error
}

// Retry runs op, and again on the kubelet's schedule ([Backoff.Next]) after
// every error, until op succeeds, ctx ends or Attempts were made. Every error
// is retried, as the kubelet retries the operations of a volume while its pod
// wants it mounted (a publish) or is gone (an unpublish), final or not. Each
// attempt gets ctx bounded by Timeout.
//
// It returns every attempt made, in order, and the last attempt's error: nil
// when op succeeded. When ctx ends before any attempt it returns ctx's error;
// an attempt cut short by ctx is recorded with whatever op returned.
//
// A test makes the kubelet's retries of one volume with, for example,
//
//	b := drivertest.KubeletBackoff(1)
//	attempts, err := b.Retry(ctx, func(ctx context.Context) error {
//		return k.Publish(ctx, pod, vol)
//	})
//
// and of a pod's volumes by calling Retry for each volume on a goroutine of
// its own, as the kubelet runs each volume's operation on its own.
func (b Backoff) Retry(ctx context.Context, op func(context.Context) error) ([]Attempt, error) {
	return b.retryWhile(ctx, op, func(error) bool { return true })
}

// retryWhile is Retry that stops at the first error retryable does not
// accept, as it stops at success.
func (b Backoff) retryWhile(ctx context.Context, op func(context.Context) error, retryable func(error) bool) ([]Attempt, error) {
	var (
		attempts []Attempt
		lastErr  error
	)
	for failures := 0; ; failures++ {
		if failures > 0 {
			wait := time.Until(b.Next(attempts[len(attempts)-1].end(), failures))
			if wait > 0 {
				t := time.NewTimer(wait)
				select {
				case <-ctx.Done():
					t.Stop()
					return attempts, lastErr
				case <-t.C:
				}
			}
		}
		if ctx.Err() != nil {
			if len(attempts) == 0 {
				return nil, ctx.Err()
			}
			return attempts, lastErr
		}
		a := b.attempt(ctx, op)
		attempts = append(attempts, a)
		lastErr = a.Err
		if a.Err == nil {
			return attempts, nil
		}
		if !retryable(a.Err) || (b.Attempts > 0 && len(attempts) >= b.Attempts) {
			return attempts, a.Err
		}
	}
}

// InProgress reports whether err says that the driver may still be working
// on the volume or cannot be reached for now: a gRPC Aborted (another
// operation on the volume is in progress) or Unavailable (the driver or its
// plugin is restarting). The kit's teardowns retry exactly these
// (KubeletOptions.Retry); any other error is the answer.
func InProgress(err error) bool {
	switch status.Code(err) {
	case codes.Aborted, codes.Unavailable:
		return true
	}
	return false
}

// attempt runs op once under Timeout and records it.
func (b Backoff) attempt(ctx context.Context, op func(context.Context) error) Attempt {
	if b.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, b.Timeout)
		defer cancel()
	}
	start := time.Now()
	err := op(ctx)
	return Attempt{Start: start, Latency: time.Since(start), Code: status.Code(err), Err: err}
}

// end is when the attempt ended.
func (a Attempt) end() time.Time { return a.Start.Add(a.Latency) }
