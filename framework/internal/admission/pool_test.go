package admission

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

func newPool(t *testing.T, total int64, shares map[string]Share, other *Share) *Pool {
	t.Helper()
	p, err := NewPool(total, shares, other)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func mustTry(t *testing.T, p *Pool, party string, n int64) *Grant {
	t.Helper()
	g, err := p.TryAcquire(party, n)
	if err != nil {
		t.Fatalf("TryAcquire(%s, %d): %v", party, n, err)
	}
	return g
}

func wantRefused(t *testing.T, p *Pool, party string, n int64) *Refusal {
	t.Helper()
	g, err := p.TryAcquire(party, n)
	var r *Refusal
	if !errors.As(err, &r) {
		g.Release()
		t.Fatalf("TryAcquire(%s, %d) = %v, want a refusal", party, n, err)
	}
	return r
}

// A party that holds all it may leaves every other party its reserve and
// the shared part it did not borrow.
func TestHogKeepsToItsShare(t *testing.T) {
	p := newPool(t, 10, map[string]Share{"hog": {Reserved: 2, Max: 6}, "a": {Reserved: 2, Max: 6}, "b": {Reserved: 2, Max: 6}}, nil)
	var held []*Grant
	for range 6 {
		held = append(held, mustTry(t, p, "hog", 1))
	}
	if r := wantRefused(t, p, "hog", 1); r.Held != 6 || r.Max != 6 {
		t.Fatalf("refusal %+v", r)
	}
	// 4 shared, 4 borrowed by hog: a and b have their reserves only.
	a1, a2 := mustTry(t, p, "a", 1), mustTry(t, p, "a", 1)
	wantRefused(t, p, "a", 1)
	b1, b2 := mustTry(t, p, "b", 1), mustTry(t, p, "b", 1)
	wantRefused(t, p, "b", 1)
	// The hog gives one back: it was borrowed, so a may borrow it.
	held[5].Release()
	a3 := mustTry(t, p, "a", 1)
	if u := p.Usage()["a"]; u.Held != 3 {
		t.Fatalf("a holds %d, want 3", u.Held)
	}
	for _, g := range append(held, a1, a2, a3, b1, b2) {
		g.Release()
		g.Release() // twice is once
	}
	if size, free := p.Shared(); size != 4 || free != 4 {
		t.Fatalf("shared %d free %d after every release, want 4 and 4", size, free)
	}
	for name, u := range p.Usage() {
		if u.Held != 0 {
			t.Errorf("%s still holds %d", name, u.Held)
		}
	}
}

func TestNewPoolRefusesReservesOverTotal(t *testing.T) {
	if _, err := NewPool(3, map[string]Share{"a": {Reserved: 2}, "b": {Reserved: 2}}, nil); err == nil {
		t.Fatal("reserves of 4 in a pool of 3 accepted")
	}
}

func TestUnknownParty(t *testing.T) {
	p := newPool(t, 2, map[string]Share{"a": {Reserved: 1, Max: 2}}, nil)
	if r := wantRefused(t, p, "x", 1); !r.Unknown {
		t.Fatalf("refusal %+v, want Unknown", r)
	}
	q := newPool(t, 2, map[string]Share{"a": {Reserved: 1, Max: 2}}, &Share{Reserved: 5, Max: 1})
	g := mustTry(t, q, "x", 1) // borrows the one shared unit: no reserve for others
	wantRefused(t, q, "x", 1)
	mustTry(t, q, "a", 1).Release()
	g.Release()
}

func TestNeverFits(t *testing.T) {
	p := newPool(t, 10, map[string]Share{"a": {Reserved: 1, Max: 3}}, nil)
	if r := wantRefused(t, p, "a", 4); !r.Never {
		t.Fatalf("refusal %+v, want Never", r)
	}
	if _, err := p.Acquire(t.Context(), "a", 4); err == nil {
		t.Fatal("Acquire of more than the party's Max waited and succeeded")
	}
}

// Waiters are served round-robin between parties: a party with a long
// queue does not keep another party's single waiter from the shared part.
func TestAcquireRoundRobin(t *testing.T) {
	p := newPool(t, 2, map[string]Share{"a": {Max: 2}, "b": {Max: 2}}, nil)
	first := mustTry(t, p, "a", 2) // everything
	ctx := t.Context()
	var (
		mu    sync.Mutex
		order []string
		wg    sync.WaitGroup
	)
	start := func(party string, queued int) {
		ready := make(chan struct{})
		wg.Go(func() {
			close(ready)
			g, err := p.Acquire(ctx, party, 2)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, party)
			mu.Unlock()
			g.Release()
		})
		<-ready
		waitFor(t, func() bool { return p.Usage()[party].Waiting == queued })
	}
	// a queues two, then b one; b must not come last (first come, first
	// served would serve a, a, b).
	start("a", 1)
	start("a", 2)
	start("b", 1)
	first.Release()
	wg.Wait()
	if len(order) < 2 || order[len(order)-1] == "b" {
		t.Fatalf("served in order %v: b's waiter came after all of a's", order)
	}
}

// A waiter whose context ends leaves the queue, and the next is served.
func TestAcquireCanceled(t *testing.T) {
	p := newPool(t, 1, map[string]Share{"a": {Max: 1}, "b": {Max: 1}}, nil)
	g := mustTry(t, p, "a", 1)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if _, err := p.Acquire(ctx, "b", 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire: %v, want DeadlineExceeded", err)
	}
	if u := p.Usage()["b"]; u.Waiting != 0 || u.Held != 0 {
		t.Fatalf("b after a canceled wait: %+v", u)
	}
	g.Release()
	mustTry(t, p, "b", 1).Release()
}

// Reserves are served even while others queue for the shared part.
func TestReserveNotQueuedBehindShared(t *testing.T) {
	p := newPool(t, 3, map[string]Share{"hog": {Reserved: 1, Max: 3}, "a": {Reserved: 1, Max: 3}}, nil)
	h := mustTry(t, p, "hog", 2) // its reserve and the one shared unit
	done := make(chan struct{})
	go func() {
		defer close(done)
		g, err := p.Acquire(t.Context(), "hog", 1)
		if err == nil {
			g.Release()
		}
	}()
	waitFor(t, func() bool { return p.Usage()["hog"].Waiting == 1 })
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	g, err := p.Acquire(ctx, "a", 1)
	if err != nil {
		t.Fatalf("a's reserve: %v", err)
	}
	g.Release()
	h.Release()
	<-done
}

// Concurrent use never holds more than the pool, or a party more than its
// Max (run with -race).
func TestPoolConcurrent(t *testing.T) {
	shares := map[string]Share{"a": {Reserved: 2, Max: 5}, "b": {Reserved: 1, Max: 4}, "c": {Max: 3}}
	p := newPool(t, 8, shares, nil)
	var wg sync.WaitGroup
	for i := range 60 {
		party := []string{"a", "b", "c"}[i%3]
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(t.Context(), time.Duration(i%5)*time.Millisecond)
			defer cancel()
			var g *Grant
			var err error
			if i%2 == 0 {
				g, err = p.TryAcquire(party, 1+int64(i%2))
			} else {
				g, err = p.Acquire(ctx, party, 1+int64(i%3))
			}
			if err != nil {
				return
			}
			var held int64
			for name, u := range p.Usage() {
				held += u.Held
				if u.Held > shares[name].Max {
					t.Errorf("%s holds %d > %d", name, u.Held, shares[name].Max)
				}
			}
			if held > 8 {
				t.Errorf("%d held of 8", held)
			}
			time.Sleep(time.Millisecond)
			g.Release()
		})
	}
	wg.Wait()
	if _, free := p.Shared(); free != 5 {
		t.Fatalf("shared free %d after all released, want 5", free)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for range 2000 {
		if cond() {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatal("condition not reached in 2s")
}

// Force counts what exists beyond every bound; the shared part is
// overdrawn until enough is released, and other parties keep their
// reserves.
func TestForceOverdraws(t *testing.T) {
	p := newPool(t, 10, map[string]Share{"a": {Reserved: 2, Max: 5}, "b": {Reserved: 2, Max: 5}}, nil)
	big := p.Force("a", 12) // 2 from a's reserve, 10 borrowed from the 6 shared
	if size, free := p.Shared(); size != 6 || free != -4 {
		t.Fatalf("shared %d free %d after forcing 12, want 6 and -4", size, free)
	}
	if u := p.Usage()["a"]; u.Held != 12 {
		t.Fatalf("a holds %d, want 12", u.Held)
	}
	wantRefused(t, p, "a", 1)
	b1, b2 := mustTry(t, p, "b", 1), mustTry(t, p, "b", 1) // b's reserve
	wantRefused(t, p, "b", 1)                              // nothing shared is free
	x := p.Force("unnamed", 1)
	big.Release()
	if size, free := p.Shared(); size != 6 || free != 5 {
		t.Fatalf("shared %d free %d after the release, want 6 and 5", size, free)
	}
	mustTry(t, p, "b", 3).Release()
	for _, g := range []*Grant{b1, b2, x} {
		g.Release()
	}
	if _, free := p.Shared(); free != 6 {
		t.Fatalf("free %d after every release, want 6", free)
	}
}
