package csidriver

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestJitter(t *testing.T) {
	seen := map[time.Duration]bool{}
	for range 100 {
		d := jitter(time.Second)
		if d < 500*time.Millisecond || d >= 1500*time.Millisecond {
			t.Fatalf("jitter(1s) = %s, want within [0.5s, 1.5s)", d)
		}
		seen[d] = true
		if r := randDuration(10 * time.Second); r < 0 || r >= 10*time.Second {
			t.Fatalf("randDuration(10s) = %s", r)
		}
	}
	if len(seen) < 50 {
		t.Errorf("%d distinct values of 100, want them spread", len(seen))
	}
	if randDuration(0) != 0 || randDuration(-time.Second) != 0 {
		t.Error("randDuration of a non-positive bound is not 0")
	}
}

func TestSleepCtx(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if sleepCtx(ctx, time.Hour) {
		t.Error("sleepCtx on an ended context reported the time passed")
	}
	if !sleepCtx(t.Context(), time.Millisecond) || !sleepCtx(t.Context(), 0) {
		t.Error("sleepCtx on a live context did not report the time passed")
	}
}

// The check's window: Jitter, or the fleet's (50 ms per driver, at least
// Jitter) when FleetSize answers; an error leaves Jitter; no jitter asks
// nothing.
func TestStartupWindow(t *testing.T) {
	asked := 0
	size := func(n int, err error) func(context.Context) (int, error) {
		return func(ctx context.Context) (int, error) {
			asked++
			if _, ok := ctx.Deadline(); !ok {
				t.Errorf("FleetSize called without a deadline")
			}
			return n, err
		}
	}
	for _, c := range []struct {
		s     Startup
		want  time.Duration
		asked int
	}{
		{Startup{Jitter: 10 * time.Second}, 10 * time.Second, 0},
		{Startup{Jitter: 10 * time.Second, FleetSize: size(1000, nil)}, 50 * time.Second, 1},
		{Startup{Jitter: 10 * time.Second, FleetSize: size(200, nil)}, 10 * time.Second, 1},
		{Startup{Jitter: 10 * time.Second, FleetSize: size(0, errors.New("forbidden"))}, 10 * time.Second, 1},
		{Startup{Jitter: -1, FleetSize: size(1000, nil)}, -1, 0},
	} {
		asked = 0
		if got := c.s.window(t.Context()); got != c.want || asked != c.asked {
			t.Errorf("window of %+v = %s after %d FleetSize calls, want %s after %d", c.s, got, asked, c.want, c.asked)
		}
	}
}
