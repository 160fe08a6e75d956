package framework_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
)

// hungBackend's Create blocks until released or its context ends, as a
// plugin that is up and never answers; started counts the calls it holds.
type hungBackend struct {
	release chan struct{}
	started chan struct{}
}

func newHung() *hungBackend {
	return &hungBackend{release: make(chan struct{}), started: make(chan struct{}, 64)}
}

func (h *hungBackend) Create(ctx context.Context, _ *api.Volume) (api.Source, error) {
	h.started <- struct{}{}
	select {
	case <-h.release:
	case <-ctx.Done():
	}
	return api.Source{}, errors.New("hung backend gave up")
}

func (h *hungBackend) Delete(context.Context, *api.Volume) error { return nil }

// The publish lane is partitioned by backend: backends that never answer
// hold at most their shares (the next publish of theirs fails at once with
// ResourceExhausted naming the backend and the flag), and another backend
// keeps its reserve; unpublishes, in a lane of their own, go through while
// every publish slot is taken.
func TestHungBackendsKeepToTheirShares(t *testing.T) {
	a, b := newHung(), newHung()
	h, _, _ := fakeHarness(t, func(o *framework.Options) {
		o.Backends["a"], o.Backends["b"] = a, b
		// 8 slots: 4 backends (tmpfs, dir, a, b) reserve 1 each, 4 are
		// shared, none holds more than 4.
		o.Limits.MaxInFlight, o.Limits.MaxInFlightPerBackend, o.Limits.InFlightReservedPerBackend = 8, 4, 1
	})
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait) // after the release below (cleanups run last first)
	t.Cleanup(func() { close(a.release); close(b.release) })
	ctx, k := t.Context(), h.Kubelet
	done := k.NewPod("ns", "done")
	if err := k.Publish(ctx, done, drivertest.InlineVolume{Name: "v", Attributes: map[string]string{"size": "1Mi"}}); err != nil {
		t.Fatal(err)
	}

	hang := func(backend string, hb *hungBackend, n int) {
		for range n {
			pod := k.NewPod("ns", backend)
			wg.Go(func() {
				_ = k.Publish(context.WithoutCancel(ctx), pod, drivertest.InlineVolume{Name: "v", Attributes: map[string]string{"backend": backend}})
			})
			<-hb.started
		}
	}
	hang("a", a, 4) // its reserve and 3 shared: its share
	hang("b", b, 2) // its reserve and the last shared
	for _, backend := range []string{"a", "b"} {
		pod := k.NewPod("ns", backend+"-more")
		err := k.Publish(ctx, pod, drivertest.InlineVolume{Name: "v", Attributes: map[string]string{"backend": backend}})
		if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "backend "+backend) || !strings.Contains(err.Error(), "--max-in-flight") {
			t.Errorf("one more publish of hung backend %s: %v, want ResourceExhausted naming it and the flag", backend, err)
		}
	}
	// Every slot but the reserves of tmpfs and dir is taken: tmpfs
	// still publishes within its reserve, and unpublishes go through.
	p := k.NewPod("ns", "web")
	for _, name := range []string{"x", "y"} {
		if err := k.Publish(ctx, p, drivertest.InlineVolume{Name: name, Attributes: map[string]string{"size": "1Mi"}}); err != nil {
			t.Fatalf("tmpfs publish %s while a and b hang: %v", name, err)
		}
	}
	if err := k.DeletePod(ctx, done); err != nil {
		t.Fatalf("unpublish while every publish slot is taken: %v", err)
	}
	if err := k.DeletePod(ctx, p); err != nil {
		t.Fatalf("unpublish while every publish slot is taken: %v", err)
	}
}

// hungDelete's Create succeeds and its Delete never answers, whatever its
// context (a creating plugin whose Delete hangs): deleting receives whether
// each Delete's context had a deadline.
type hungDelete struct {
	source   string
	release  chan struct{}
	deleting chan bool
}

func (h *hungDelete) Create(context.Context, *api.Volume) (api.Source, error) {
	return api.Source{Path: h.source}, nil
}

func (h *hungDelete) Delete(ctx context.Context, _ *api.Volume) error {
	_, ok := ctx.Deadline()
	h.deleting <- ok
	<-h.release
	return errors.New("hung Delete released")
}

// Issue 44, finding 3: the orphan GC collects each backend on its own. While
// a backend's Deletes of orphans never answer, another backend's orphan is
// still removed by a later pass; each Delete the GC makes is bounded by the
// operation timeout (its context has a deadline).
func TestHungDeleteHoldsOnlyItsBackendsOrphans(t *testing.T) {
	hung := &hungDelete{source: t.TempDir(), release: make(chan struct{}), deleting: make(chan bool, 64)}
	h, _, st := fakeHarness(t, func(o *framework.Options) {
		o.Backends["hung"] = hung
		o.GC = framework.GCOptions{Interval: 10 * time.Millisecond, OrphanGracePeriod: time.Nanosecond, MaxOrphanShare: 1}
	})
	t.Cleanup(func() { close(hung.release) }) // before the driver stops
	ctx, k := t.Context(), h.Kubelet
	var hungPods []*drivertest.Pod
	for range 4 {
		pod := k.NewPod("ns", "hung")
		if err := k.Publish(ctx, pod, drivertest.InlineVolume{Name: "v", Attributes: map[string]string{"backend": "hung"}}); err != nil {
			t.Fatal(err)
		}
		hungPods = append(hungPods, pod)
	}
	other := k.NewPod("ns", "other")
	if err := k.Publish(ctx, other, drivertest.InlineVolume{Name: "v", Attributes: map[string]string{"backend": "dir"}}); err != nil {
		t.Fatal(err)
	}
	for _, pod := range hungPods {
		if err := k.OrphanPod(pod); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case withDeadline := <-hung.deleting:
		if !withDeadline {
			t.Error("the orphan GC's Delete has no deadline, want the operation timeout")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the orphan GC did not start removing the hung backend's orphans")
	}
	// The hung backend's removals never return; the dir backend's orphan
	// goes now and is removed all the same.
	if err := k.OrphanPod(other); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		recs, err := st.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		left := false
		for _, rec := range recs {
			left = left || rec.Pod.UID == other.UID
		}
		if !left {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the dir backend's orphan was not removed while the hung backend's Deletes ran")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if recs, _ := st.List(ctx); len(recs) != len(hungPods) {
		t.Errorf("%d records left, want the hung backend's %d", len(recs), len(hungPods))
	}
}
