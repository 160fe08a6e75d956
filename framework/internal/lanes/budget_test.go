package lanes

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/ephemera-csi/ephemera/framework/internal/errkind"
)

// The content budget: a reservation waits while its provider's share is
// taken, until its context ends (deadline: ResourceExhausted naming the flag
// and the numbers; cancelled: the caller is gone, Canceled); a release frees
// it once, however often it is called; one provider holding all it may
// leaves another its reserve.
func TestBudget(t *testing.T) {
	l, err := New(Options{Backends: []string{"hung", "ok"}, MaxInFlight: 2, MaxInFlightPerBackend: 1,
		ContentBytesInFlight: 30, ContentParties: map[string]int64{"hung": 10, "ok": 10}, RefreshConcurrency: 1, ContentCapacity: NoContentCapacity})
	if err != nil {
		t.Fatal(err)
	}
	b := l.Content
	// hung may hold max(10, 30/2) = 15: its reserve of 10 and 5 borrowed.
	r1, err := b.Reserve(t.Context(), "hung", 10)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	_, err = b.Reserve(ctx, "hung", 10)
	if errkind.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "budget of 30 (--content-bytes-in-flight, 10 of it in use, 10 by this provider); its volume needs 10") {
		t.Fatalf("reserve beyond the share: %v (%s), want ResourceExhausted with the numbers", err, errkind.Code(err))
	}
	cctx, ccancel := context.WithCancel(t.Context())
	ccancel()
	if _, err := b.Reserve(cctx, "hung", 6); !errors.Is(err, context.Canceled) {
		t.Fatalf("reserve for a caller that went away: %v, want Canceled", err)
	}
	// ok is not held up by hung: its reserve, then what is shared.
	r2, err := b.Reserve(t.Context(), "ok", 10)
	if err != nil {
		t.Fatalf("the other provider, while the first holds its share: %v", err)
	}
	got := make(chan error, 1)
	go func() {
		r, err := b.Reserve(t.Context(), "hung", 15) // all its share
		if err == nil {
			r()
		}
		got <- err
	}()
	r1()
	r1() // a second release frees nothing more
	if err := <-got; err != nil {
		t.Fatalf("reserve of the whole share once free: %v", err)
	}
	if n := b.InUse(); n != 10 {
		t.Errorf("%d in use, want 10: a double release freed twice", n)
	}
	r2()
}
