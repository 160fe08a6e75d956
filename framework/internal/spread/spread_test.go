package spread

import (
	"testing"
	"time"
)

// TestWindow: the window grows by PerDriver per driver from the caller's
// least to Max; a disabled window stays disabled, an unknown fleet takes the
// least.
func TestWindow(t *testing.T) {
	for _, c := range []struct {
		drivers int
		least   time.Duration
		want    time.Duration
	}{
		{0, 5 * time.Second, 5 * time.Second},           // unknown: the default
		{-1, 5 * time.Second, 5 * time.Second},          // unknown
		{20, 5 * time.Second, 5 * time.Second},          // a small fleet: the default
		{100, 5 * time.Second, 5 * time.Second},         // 100 × 50 ms: the default exactly
		{101, 5 * time.Second, 5050 * time.Millisecond}, // grows past it
		{600, 5 * time.Second, 30 * time.Second},
		{1000, 5 * time.Second, 50 * time.Second},
		{5000, 5 * time.Second, 250 * time.Second},
		{1000, 10 * time.Second, 50 * time.Second}, // the CSIDriver check's least
		{200, 10 * time.Second, 10 * time.Second},
		{6000, 5 * time.Second, 5 * time.Minute},               // Max
		{12000, 5 * time.Second, 5 * time.Minute},              // beyond it
		{1 << 40, 5 * time.Second, 5 * time.Minute},            // no overflow
		{int(^uint(0) >> 1), 5 * time.Second, 5 * time.Minute}, // the largest int
		{1 << 40, 10 * time.Minute, 10 * time.Minute},          // a least above Max wins
		{1000, 0, 0},  // no jitter stays none
		{1000, -1, 0}, // negative: none
	} {
		if got := Window(c.drivers, c.least); got != c.want {
			t.Errorf("Window(%d, %s) = %s, want %s", c.drivers, c.least, got, c.want)
		}
	}
}

// TestRest: the rest puts the work at d's fraction of the window, less what
// was waited; a window no longer than least leaves nothing to wait.
func TestRest(t *testing.T) {
	s := time.Second
	for _, c := range []struct {
		d, least, w, want time.Duration
	}{
		{2 * s, 5 * s, 50 * s, 18 * s},   // 2/5 of 50 s: 20 s, 2 waited
		{0, 5 * s, 50 * s, 0},            // the fraction 0
		{2 * s, 5 * s, 5 * s, 0},         // no longer than least
		{2 * s, 5 * s, 4 * s, 0},         // shorter
		{2 * s, 0, 50 * s, 0},            // no jitter
		{4 * s, 10 * s, 125 * s, 46 * s}, // the CSIDriver check's least
	} {
		if got := Rest(c.d, c.least, c.w); got != c.want {
			t.Errorf("Rest(%s, %s, %s) = %s, want %s", c.d, c.least, c.w, got, c.want)
		}
	}
}
