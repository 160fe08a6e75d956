package kube

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// The DaemonSet's size is remembered in Path: a start that finds it makes no
// request for it (its first request is then the spread work), and its Run
// reads the current size, after a random part of the remembered size's
// window, for the next start. Without a file, or with one that holds no
// positive number, Size reads it at its point of FleetSizeReadWindow from
// NewFleetSize and writes it.
func TestFleetSize(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fleet-size")
	var reads atomic.Int64
	var size atomic.Int64
	size.Store(1000)
	get := func(context.Context) (int, error) { reads.Add(1); return int(size.Load()), nil }

	// First start: no file; one read at the drawn point of the read
	// window, remembered; both callers get it.
	var drawn time.Duration
	m, err := NewFleetSize(FleetSizeOptions{Path: path, Get: get, delay: func(max time.Duration) time.Duration {
		drawn = max
		return 300 * time.Millisecond
	}})
	if err != nil {
		t.Fatal(err)
	}
	if drawn != FleetSizeReadWindow {
		t.Errorf("first start: read point drawn below %s, want below FleetSizeReadWindow (%s)", drawn, FleetSizeReadWindow)
	}
	for range 2 {
		if n, err := m.Size(t.Context()); n != 1000 || err != nil {
			t.Fatalf("first start: Size = %d, %v, want 1000", n, err)
		}
	}
	if since := time.Since(m.start); since < 300*time.Millisecond {
		t.Errorf("first start: the size was read %s after NewFleetSize, want at its point, 300ms", since)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "1000\n" || reads.Load() != 1 {
		t.Fatalf("first start: file %q (%v), %d reads, want 1000 and one read", b, err, reads.Load())
	}
	if tmp, _ := filepath.Glob(path + ".tmp*"); len(tmp) != 0 {
		t.Errorf("temporary files left beside the file: %v", tmp)
	}

	// Next start: the remembered size at once, no read (whatever the
	// point drawn); Run refreshes it after a delay drawn below the window
	// of 1,000 drivers.
	size.Store(1500)
	var window atomic.Int64
	m, err = NewFleetSize(FleetSizeOptions{Path: path, Get: get, delay: func(max time.Duration) time.Duration {
		if max != FleetSizeReadWindow {
			window.Store(int64(max))
			return 0
		}
		return time.Hour
	}})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := m.Size(t.Context()); n != 1000 || err != nil || reads.Load() != 1 {
		t.Fatalf("next start: Size = %d, %v after %d reads, want the remembered 1000 without a read", n, err, reads.Load())
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() { done <- m.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for m.remembered() != 1500 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	if got := m.remembered(); got != 1500 || reads.Load() != 2 || time.Duration(window.Load()) != FleetStartJitter(1000) {
		t.Errorf("after Run: remembered %d after %d reads, window %s, want 1500 after 2 (within %s)", got, reads.Load(), time.Duration(window.Load()), FleetStartJitter(1000))
	}

	// A file that holds no positive number is read again.
	now := func(time.Duration) time.Duration { return 0 }
	for _, bad := range []string{"", "x", "0", "-3"} {
		if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		reads.Store(0)
		m, _ = NewFleetSize(FleetSizeOptions{Path: path, Get: get, delay: now})
		if n, err := m.Size(t.Context()); n != 1500 || err != nil || reads.Load() != 1 {
			t.Errorf("file %q: Size = %d, %v after %d reads, want 1500 read once", bad, n, err, reads.Load())
		}
	}
	// A start without a remembered size refreshes nothing: Run waits.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	reads.Store(0)
	m, _ = NewFleetSize(FleetSizeOptions{Path: path, Get: get, delay: now})
	ctx, cancel = context.WithCancel(t.Context())
	cancel()
	if err := m.Run(ctx); err != nil || reads.Load() != 0 {
		t.Errorf("Run without a file: %v, %d reads, want none", err, reads.Load())
	}
}

// A driver killed between writing the size and renaming it left a temporary
// file beside Path: the next NewFleetSize removes it, not one younger than
// staleTemp (another driver's on the same state directory, still writing)
// nor anything else in the directory.
func TestFleetSizeSweepsLeftovers(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "fleet-size")
	old := filepath.Join(dir, "fleet-size.tmp-111")
	young := filepath.Join(dir, "fleet-size.tmp-222")
	other := filepath.Join(dir, "volumes.db.tmp-333")
	for _, p := range []string{old, young, other} {
		if err := os.WriteFile(p, []byte("1000\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	long := time.Now().Add(-2 * staleTemp)
	for _, p := range []string{old, other} {
		if err := os.Chtimes(p, long, long); err != nil {
			t.Fatal(err)
		}
	}
	get := func(context.Context) (int, error) { return 1000, nil }
	if _, err := NewFleetSize(FleetSizeOptions{Path: path, Get: get}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(old); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the leftover %s: %v, want it removed", old, err)
	}
	for _, p := range []string{young, other} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s: %v, want it kept", p, err)
		}
	}
}

// A caller that gives up before the read's point gets its context's error and
// leaves the read to the next caller; a failed read is the answer of every
// caller (they fall back to their own windows), remembered nowhere; no Path
// remembers nothing.
func TestFleetSizeCallers(t *testing.T) {
	var reads atomic.Int64
	fail := errors.New("forbidden")
	get := func(context.Context) (int, error) { reads.Add(1); return 0, fail }
	m, err := NewFleetSize(FleetSizeOptions{Get: get, delay: func(time.Duration) time.Duration { return 2 * time.Second }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if _, err := m.Size(ctx); !errors.Is(err, context.DeadlineExceeded) || reads.Load() != 0 {
		t.Fatalf("a caller that gives up: %v after %d reads, want its deadline and no read", err, reads.Load())
	}
	for range 2 {
		if _, err := m.Size(t.Context()); !errors.Is(err, fail) {
			t.Errorf("Size after a failed read: %v, want %v", err, fail)
		}
	}
	if reads.Load() != 1 {
		t.Errorf("%d reads, want one: a failure is the answer too", reads.Load())
	}
	if _, err := NewFleetSize(FleetSizeOptions{}); err == nil {
		t.Error("NewFleetSize without Get: no error")
	}
}

// Two callers at once (the pod informer and the CSIDriver check): the one
// that holds the read gives up (its driver stops, its own timeout), the other
// still gets the answer, read once.
func TestFleetSizeConcurrentCallers(t *testing.T) {
	var reads atomic.Int64
	get := func(context.Context) (int, error) { reads.Add(1); return 700, nil }
	m, err := NewFleetSize(FleetSizeOptions{Get: get, delay: func(time.Duration) time.Duration { return 500 * time.Millisecond }})
	if err != nil {
		t.Fatal(err)
	}
	first, cancel := context.WithCancel(t.Context())
	firstErr := make(chan error, 1)
	go func() { _, err := m.Size(first); firstErr <- err }()
	time.Sleep(50 * time.Millisecond) // the first holds the read, waiting for its point
	second := make(chan int, 1)
	go func() { n, _ := m.Size(t.Context()); second <- n }()
	time.Sleep(50 * time.Millisecond)
	cancel()
	if err := <-firstErr; !errors.Is(err, context.Canceled) {
		t.Errorf("the caller that gave up: %v, want context.Canceled", err)
	}
	if n := <-second; n != 700 || reads.Load() != 1 {
		t.Errorf("the other caller: %d after %d reads, want 700 read once", n, reads.Load())
	}
}
