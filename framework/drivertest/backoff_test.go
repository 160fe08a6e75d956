package drivertest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/framework/drivertest"
)

// TestKubeletBackoffSchedule: the kubelet's waits after 1, 2, … failures in a
// row are 500ms doubling to at most 2m2s; scaled, the same shape; ticks of
// the loop every 100ms.
func TestKubeletBackoffSchedule(t *testing.T) {
	b := drivertest.KubeletBackoff(1)
	if b.Initial != 500*time.Millisecond || b.Max != 2*time.Minute+2*time.Second || b.Period != 100*time.Millisecond || b.Timeout != 2*time.Minute {
		t.Fatalf("KubeletBackoff(1) = %+v, want 500ms, 2m2s, 100ms, 2m", b)
	}
	want := []time.Duration{0, 500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second,
		16 * time.Second, 32 * time.Second, 64 * time.Second, 122 * time.Second, 122 * time.Second}
	for n, w := range want {
		if got := b.Wait(n); got != w {
			t.Errorf("Wait(%d) = %v, want %v", n, got, w)
		}
	}
	if got := b.Wait(1000); got != b.Max {
		t.Errorf("Wait(1000) = %v, want Max", got)
	}
	fast := drivertest.KubeletBackoff(1.0 / 10)
	for n := range want {
		if got, w := fast.Wait(n), want[n]/10; got != w {
			t.Errorf("scaled by 1/10: Wait(%d) = %v, want %v", n, got, w)
		}
	}
	if fast.Period != 10*time.Millisecond || fast.Timeout != 12*time.Second {
		t.Errorf("scaled by 1/10: %+v", fast)
	}
	if got := drivertest.KubeletBackoff(0); got != b {
		t.Errorf("KubeletBackoff(0) = %+v, want the kubelet's own", got)
	}
	if got := (drivertest.Backoff{Initial: time.Second}).Wait(200); got <= 0 {
		t.Errorf("without Max, Wait(200) = %v: overflowed", got)
	}

	// The next attempt starts on the first tick strictly after the wait.
	failed := time.Date(2026, 1, 2, 3, 4, 5, 250_000_000, time.UTC)
	for _, c := range []struct {
		failures int
		want     time.Time
	}{
		{1, failed.Add(550 * time.Millisecond)},  // 05.750 -> tick 05.800
		{2, failed.Add(1050 * time.Millisecond)}, // 06.250 -> 06.300
		{3, failed.Add(2050 * time.Millisecond)},
	} {
		if got := b.Next(failed, c.failures); !got.Equal(c.want) {
			t.Errorf("Next(%v, %d) = %v, want %v", failed, c.failures, got, c.want)
		}
	}
	onTick := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	if got, want := b.Next(onTick, 1), onTick.Add(600*time.Millisecond); !got.Equal(want) {
		t.Errorf("Next of a wait ending on a tick = %v, want the tick after it, %v", got, want)
	}
}

// TestBackoffRetry: Retry records each attempt with its code and latency,
// waits at least the schedule between them, bounds each by Timeout, and
// stops at the first success or when its context ends.
func TestBackoffRetry(t *testing.T) {
	b := drivertest.KubeletBackoff(1.0 / 50) // 10ms doubling, 2ms loop, 2.4s per attempt
	calls := 0
	attempts, err := b.Retry(t.Context(), func(ctx context.Context) error {
		calls++
		if dl, ok := ctx.Deadline(); !ok || time.Until(dl) > b.Timeout {
			t.Errorf("attempt %d: deadline %v (set: %v), want at most Timeout %v from now", calls, dl, ok, b.Timeout)
		}
		time.Sleep(time.Millisecond)
		switch calls {
		case 1:
			return status.Error(codes.ResourceExhausted, "busy")
		case 2:
			return status.Error(codes.Aborted, "locked")
		case 3:
			return errors.New("no code")
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Retry: %v", err)
	}
	wantCodes := []codes.Code{codes.ResourceExhausted, codes.Aborted, codes.Unknown, codes.OK}
	if len(attempts) != len(wantCodes) {
		t.Fatalf("%d attempts, want %d: %+v", len(attempts), len(wantCodes), attempts)
	}
	for i, a := range attempts {
		if a.Code != wantCodes[i] {
			t.Errorf("attempt %d: code %v, want %v", i, a.Code, wantCodes[i])
		}
		if a.Latency < time.Millisecond {
			t.Errorf("attempt %d: latency %v, want at least the 1ms it slept", i, a.Latency)
		}
		if (a.Err == nil) != (a.Code == codes.OK) {
			t.Errorf("attempt %d: code %v with error %v", i, a.Code, a.Err)
		}
		if i > 0 {
			prev := attempts[i-1]
			gap := a.Start.Sub(prev.Start.Add(prev.Latency))
			if w := b.Wait(i); gap < w {
				t.Errorf("attempt %d started %v after attempt %d ended, before the wait of %v", i, gap, i-1, w)
			}
			if gap > b.Wait(i)+b.Period+time.Second {
				t.Errorf("attempt %d started %v after attempt %d ended: far beyond the wait of %v", i, gap, i-1, b.Wait(i))
			}
		}
	}

	// A context that ends stops the retries, during a wait or an attempt.
	slow := drivertest.Backoff{Initial: time.Hour}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	attempts, err = slow.Retry(ctx, func(context.Context) error { return status.Error(codes.Unavailable, "down") })
	if len(attempts) != 1 || status.Code(err) != codes.Unavailable || time.Since(start) > 10*time.Second {
		t.Errorf("Retry with an hour's wait and a context of 50ms: %d attempts, %v after %v; want 1 attempt, Unavailable, at once", len(attempts), err, time.Since(start))
	}
	attempts, err = b.Retry(ctx, func(context.Context) error { return nil })
	if len(attempts) != 0 || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Retry with an ended context: %d attempts, %v; want none, its error", len(attempts), err)
	}
}
