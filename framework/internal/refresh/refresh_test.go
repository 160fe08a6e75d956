package refresh

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ephemera-csi/ephemera/api"
)

// fired records the refreshes a Scheduler fires.
type fired struct {
	mu  sync.Mutex
	ids []string
	ch  chan string
}

func newFired() *fired { return &fired{ch: make(chan string, 16)} }

func (f *fired) fire(_ context.Context, id string) {
	f.mu.Lock()
	f.ids = append(f.ids, id)
	f.mu.Unlock()
	f.ch <- id
}

func (f *fired) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.ids)
}

// A scheduled refresh fires once; a later Schedule replaces a pending one;
// Forget cancels it and drops the credentials; nothing fires before Start or
// after Stop.
func TestSchedule(t *testing.T) {
	f := newFired()
	s := New(f.fire)
	s.Schedule("early", 0) // not running: dropped
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	s.Start(ctx, 0, nil)

	s.Schedule("a", time.Hour)
	s.Schedule("a", 0) // replaces the hour
	if got := <-f.ch; got != "a" {
		t.Fatalf("fired %q, want a", got)
	}

	s.Remember(&api.Volume{ID: "b", Secrets: api.Secrets{"k": "v"}})
	if c := s.CredsOf("b"); c.Secrets["k"] != "v" {
		t.Fatalf("credentials of b: %v", c)
	}
	s.Schedule("b", time.Hour)
	s.Forget("b")
	if c := s.CredsOf("b"); c.Secrets != nil {
		t.Errorf("credentials of b kept after Forget: %v", c)
	}

	s.Schedule("c", time.Hour)
	done := make(chan struct{})
	go func() { s.Stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Stop waits for a timer it cancelled")
	}
	s.Schedule("d", 0) // stopped: dropped
	time.Sleep(20 * time.Millisecond)
	if n := f.count(); n != 1 {
		t.Errorf("%d refreshes fired, want 1 (a): %v", n, f.ids)
	}
}

// Failed retries with a backoff that doubles from a second up to five
// minutes, jittered within its upper half; Succeeded starts it over.
func TestFailedBackoff(t *testing.T) {
	s := New(func(context.Context, string) {})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	s.Start(ctx, 0, nil)
	defer s.Stop()
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second}
	for i, b := range want {
		if d := s.Failed("v"); d < b/2 || d > b {
			t.Errorf("retry %d in %v, want within [%v, %v]", i+1, d, b/2, b)
		}
	}
	for range 20 {
		s.Failed("v")
	}
	if d := s.Failed("v"); d < refreshBackoffMax/2 || d > refreshBackoffMax {
		t.Errorf("retry after many failures in %v, want within [%v, %v]", d, refreshBackoffMax/2, refreshBackoffMax)
	}
	s.Succeeded("v")
	if d := s.Failed("v"); d > time.Second {
		t.Errorf("retry after a success in %v, want at most 1s", d)
	}
	s.Forget("v")
}

// Start runs periodic every interval until its context ends.
func TestPeriodic(t *testing.T) {
	s := New(func(context.Context, string) {})
	ctx, cancel := context.WithCancel(t.Context())
	ticks := make(chan time.Duration, 4)
	s.Start(ctx, 10*time.Millisecond, func(_ context.Context, spread time.Duration) error {
		select {
		case ticks <- spread:
		default:
		}
		return nil
	})
	for range 2 {
		select {
		case spread := <-ticks:
			if spread != 10*time.Millisecond {
				t.Errorf("periodic spread %v, want the interval", spread)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("periodic refresh never ran")
		}
	}
	cancel()
	s.Stop()
}
