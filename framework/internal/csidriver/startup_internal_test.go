package csidriver

import (
	"context"
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
