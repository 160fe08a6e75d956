package provision_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ephemera-csi/ephemera/framework/internal/provision"
)

type ctxKey struct{}

// TestStartOutlivesTheCall: the create keeps the call's values, not its
// cancellation; Take returns its result once, after it finished.
func TestStartOutlivesTheCall(t *testing.T) {
	r := provision.New[string](0)
	call, cancelCall := context.WithCancel(context.WithValue(t.Context(), ctxKey{}, "v"))
	release := make(chan struct{})
	op, err := r.Start(call, "vol", "b", provision.Options{}, func(ctx context.Context) (string, error) {
		<-release
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		return ctx.Value(ctxKey{}).(string), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	cancelCall()
	if op.Wait(t.Context(), 10*time.Millisecond) {
		t.Fatal("finished before it was released")
	}
	if _, _, ok := r.Take("vol"); ok {
		t.Fatal("Take of a running create succeeded")
	}
	if got := r.Running()["b"]; got != 1 {
		t.Fatalf("Running()[b] = %d, want 1", got)
	}
	if _, ok := r.Started()["vol"]; !ok {
		t.Fatal("Started() lacks the running create")
	}
	close(release)
	if !op.Wait(t.Context(), 0) {
		t.Fatal("not finished")
	}
	val, opErr, ok := r.Take("vol")
	if !ok || opErr != nil || val != "v" {
		t.Fatalf("Take = %q, %v, %v; want the call's value, nil, true", val, opErr, ok)
	}
	if r.Get("vol") != nil || len(r.Running()) != 0 {
		t.Fatal("still registered after Take")
	}
}

// TestStartRefuses: one operation per key, at most max running per party.
func TestStartRefuses(t *testing.T) {
	r := provision.New[int](2)
	block := make(chan struct{})
	defer close(block)
	fn := func(ctx context.Context) (int, error) { <-block; return 0, nil }
	for _, k := range []string{"a", "b"} {
		if _, err := r.Start(t.Context(), k, "p", provision.Options{}, fn); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r.Start(t.Context(), "a", "q", provision.Options{}, fn); !errors.Is(err, provision.ErrRunning) {
		t.Fatalf("second start of a key: %v, want ErrRunning", err)
	}
	if _, err := r.Start(t.Context(), "c", "p", provision.Options{}, fn); !errors.Is(err, provision.ErrFull) {
		t.Fatalf("third of a party: %v, want ErrFull", err)
	}
	if _, err := r.Start(t.Context(), "c", "q", provision.Options{}, fn); err != nil {
		t.Fatalf("another party: %v", err)
	}
}

// TestTimeoutAndCancel: the create's context ends at its timeout, or when
// Cancel is called; Cancel waits for it to return.
func TestTimeoutAndCancel(t *testing.T) {
	r := provision.New[int](0)
	op, err := r.Start(t.Context(), "t", "p", provision.Options{Timeout: 20 * time.Millisecond}, func(ctx context.Context) (int, error) {
		<-ctx.Done()
		return 0, ctx.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	op.Wait(t.Context(), 0)
	if _, opErr, _ := r.Take("t"); !errors.Is(opErr, context.DeadlineExceeded) {
		t.Fatalf("timed out create: %v, want DeadlineExceeded", opErr)
	}

	var returned atomic.Bool
	if _, err := r.Start(t.Context(), "c", "p", provision.Options{}, func(ctx context.Context) (int, error) {
		<-ctx.Done()
		time.Sleep(10 * time.Millisecond) // cleaning up
		returned.Store(true)
		return 7, ctx.Err()
	}); err != nil {
		t.Fatal(err)
	}
	val, opErr, found, err := r.Cancel(t.Context(), "c")
	if err != nil || !found || !returned.Load() || val != 7 || !errors.Is(opErr, context.Canceled) {
		t.Fatalf("Cancel = %d, %v, %v, %v (returned %v); want 7, Canceled, true, nil after the create returned", val, opErr, found, err, returned.Load())
	}
	if _, _, found, err := r.Cancel(t.Context(), "c"); found || err != nil {
		t.Fatalf("Cancel of a key without an operation: %v, %v", found, err)
	}
}

// TestCancelGivesUp: a create that ignores its context keeps Cancel only
// until Cancel's own context ends; the create stays registered.
func TestCancelGivesUp(t *testing.T) {
	r := provision.New[int](0)
	release := make(chan struct{})
	if _, err := r.Start(t.Context(), "k", "p", provision.Options{}, func(context.Context) (int, error) { <-release; return 0, nil }); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if _, _, found, err := r.Cancel(ctx, "k"); !found || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Cancel = %v, %v; want true, DeadlineExceeded", found, err)
	}
	if r.Get("k") == nil {
		t.Fatal("a create that did not return was forgotten")
	}
	close(release)
	if err := r.CancelAll(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// TestSlowAndDone: OnSlow runs once when the create is still running after
// SlowAfter, never for one that finished first; OnDone sees its error.
func TestSlowAndDone(t *testing.T) {
	r := provision.New[int](0)
	slow := make(chan struct{}, 2)
	doneErr := make(chan error, 1)
	release := make(chan struct{})
	op, err := r.Start(t.Context(), "s", "p", provision.Options{
		SlowAfter: 5 * time.Millisecond, OnSlow: func() { slow <- struct{}{} },
		OnDone: func(err error) { doneErr <- err },
	}, func(context.Context) (int, error) { <-release; return 0, errors.New("boom") })
	if err != nil {
		t.Fatal(err)
	}
	<-slow
	if !op.Outlived() || op.Outlived() {
		t.Fatal("Outlived is true the first time only")
	}
	close(release)
	op.Wait(t.Context(), 0)
	if err := <-doneErr; err == nil || err.Error() != "boom" {
		t.Fatalf("OnDone got %v", err)
	}
	if len(slow) != 0 {
		t.Fatal("OnSlow ran twice")
	}

	fast, err := r.Start(t.Context(), "f", "p", provision.Options{SlowAfter: 50 * time.Millisecond, OnSlow: func() { slow <- struct{}{} }},
		func(context.Context) (int, error) { return 1, nil })
	if err != nil {
		t.Fatal(err)
	}
	fast.Wait(t.Context(), 0)
	time.Sleep(80 * time.Millisecond)
	if len(slow) != 0 {
		t.Fatal("OnSlow ran for a create that finished first")
	}
}
