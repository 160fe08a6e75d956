package framework

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
)

// The content budget: a reservation waits while the budget is taken, until
// its context ends (deadline: ResourceExhausted naming the flag and the
// numbers; cancelled: the caller is gone, Canceled); a release frees it once,
// however often it is called; a bound beyond the budget waits for the whole
// budget, never for more than exists.
func TestBudget(t *testing.T) {
	b := newBudget(10)
	r1, err := b.reserve(t.Context(), 6)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	_, err = b.reserve(ctx, 6)
	if codeOf(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "budget of 10 (--content-bytes-in-flight, 6 of it in use); this volume's content provider needs 6") {
		t.Fatalf("reserve beyond the budget: %v (%s), want ResourceExhausted with the numbers", err, codeOf(err))
	}
	cctx, ccancel := context.WithCancel(t.Context())
	ccancel()
	if _, err := b.reserve(cctx, 6); !errors.Is(err, context.Canceled) {
		t.Fatalf("reserve for a caller that went away: %v, want Canceled", err)
	}
	got := make(chan error, 1)
	go func() {
		r, err := b.reserve(t.Context(), 100) // the whole budget
		if err == nil {
			r()
		}
		got <- err
	}()
	r1()
	r1() // a second release frees nothing more
	if err := <-got; err != nil {
		t.Fatalf("reserve of the whole budget once free: %v", err)
	}
	r2, err := b.reserve(t.Context(), 10)
	if err != nil {
		t.Fatal(err)
	}
	if n := b.inUse.Load(); n != 10 {
		t.Errorf("%d in use, want 10: a double release freed twice", n)
	}
	r2()
}
