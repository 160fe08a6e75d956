package lanes

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/ephemera-csi/ephemera/framework/internal/errkind"
)

// TestAdmissions: a publish takes its backend's share and the volume's lock,
// and gives both back; a taken lock is Aborted, a full share or a node taken
// by the others is ResourceExhausted in words naming the flags; the teardown
// lane is each party's own.
func TestAdmissions(t *testing.T) {
	l, err := New(Options{Backends: []string{"a", "b"}, MaxInFlight: 3, MaxInFlightPerBackend: 2, InFlightReservedPerBackend: 1,
		RefreshConcurrency: 1, ContentCapacity: NoContentCapacity})
	if err != nil {
		t.Fatal(err)
	}
	want := func(err error, code codes.Code, words string) {
		t.Helper()
		if got := errkind.Code(err); got != code || !strings.Contains(err.Error(), words) {
			t.Errorf("got %v (%s), want %s with %q", err, got, code, words)
		}
	}
	a1, err := l.BeginPublish("a", "v1")
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.BeginPublish("a", "v1")
	want(err, codes.Aborted, "an operation for volume v1 is already in progress")
	if _, err := l.LockVolume("v1"); err == nil {
		t.Error("LockVolume of a volume being published succeeded")
	}
	a2, err := l.BeginPublish("a", "v2")
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.BeginPublish("a", "v3")
	want(err, codes.ResourceExhausted, "2 publishes of backend a are already in flight on this node, its share (--max-in-flight-per-backend 2)")
	b1, err := l.BeginPublish("b", "v4")
	if err != nil {
		t.Fatalf("b's reserved slot: %v", err)
	}
	a2()
	if got := l.InFlight(); got != 2 {
		t.Errorf("InFlight = %d, want 2", got)
	}
	// a holds 1, b holds 1 of its reserve; the third slot is free, so b may
	// take it, and then a (below its share) finds the node full.
	b2, err := l.BeginPublish("b", "v5")
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.BeginPublish("a", "v6")
	want(err, codes.ResourceExhausted, "backend a has 1 publishes in flight and the node's other slots are taken by other backends (--max-in-flight 3, 1 reserved per backend")
	a1()
	b1()
	b2()
	unlock, err := l.LockVolume("v1")
	if err != nil {
		t.Fatalf("v1's lock after its publish released it: %v", err)
	}
	unlock()

	// Teardowns: a full publish lane does not touch them; each party has
	// MaxInFlightPerBackend of its own.
	var done []func()
	for range 2 {
		d, err := l.BeginTeardown(NoRecord)
		if err != nil {
			t.Fatal(err)
		}
		done = append(done, d)
	}
	_, err = l.BeginTeardown(NoRecord)
	want(err, codes.ResourceExhausted, "2 unpublishes of volumes without a record are already in flight")
	d, err := l.BeginTeardown("a")
	if err != nil {
		t.Errorf("backend a's teardown while no-record's are taken: %v", err)
	} else {
		d()
	}
	for _, d := range done {
		d()
	}
	if got := l.InFlight(); got != 0 {
		t.Errorf("InFlight = %d after every release, want 0", got)
	}
}
