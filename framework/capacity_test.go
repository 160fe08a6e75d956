package framework_test

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
)

// A size just below 2^63 must not wrap the budget's arithmetic: it is refused,
// and the budget keeps refusing what does not fit and admitting what does,
// before and after a restart. The bytes gauge is never negative nor above the
// budget.
func TestCapacityBudgetOverflow(t *testing.T) {
	const budget = 10 << 20
	h, fake, _ := fakeHarness(t, func(o *framework.Options) {
		o.Limits.Capacity = map[string]int64{"tmpfs": budget}
		o.Limits.MaxVolumeSize = framework.NoMaxVolumeSize // the budget is the only limit
	})
	pod := h.Kubelet.NewPod("ns", "p")
	vol := func(name, size string) drivertest.InlineVolume {
		return drivertest.InlineVolume{Name: name, Attributes: map[string]string{"size": size}}
	}
	gauge := func(step string) float64 {
		t.Helper()
		v, ok := scrape(t, handlerGet(h.Driver().Handler(), "/metrics"))[`ephemera_volume_bytes{backend="tmpfs"}`]
		if !ok {
			t.Fatalf("%s: no ephemera_volume_bytes for tmpfs", step)
		}
		if v < 0 || v > budget {
			t.Errorf("%s: ephemera_volume_bytes{backend=\"tmpfs\"} = %v, want within [0, %d]", step, v, budget)
		}
		return v
	}

	// With 1Mi in use, used+size of a valid int64 quantity just below 2^63
	// (9223372036854700000 bytes) wraps negative: the check must not add.
	if err := publishFake(t, h, fake, pod, vol("first", "1Mi")); err != nil {
		t.Fatalf("publish of 1Mi within the budget: %v", err)
	}
	err := publishFake(t, h, fake, pod, vol("huge", "9.2233720368547E18"))
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("publish of 9.2233720368547E18 bytes: %v, want InvalidArgument", err)
	}
	// Larger than the whole budget: it never fits, and the message says that
	// retrying does not help.
	if !strings.Contains(err.Error(), "larger than the whole budget") || !strings.Contains(err.Error(), "retrying does not help") {
		t.Errorf("publish of 9.2233720368547E18 bytes: %v, want a message saying it is larger than the whole budget", err)
	}
	gauge("after the huge publish")

	err = publishFake(t, h, fake, pod, vol("gig", "1Gi"))
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("publish of 1Gi over a 10Mi budget: %v, want InvalidArgument (never fits)", err)
	}
	gauge("after the 1Gi publish")

	if err := publishFake(t, h, fake, pod, vol("second", "1Mi")); err != nil {
		t.Fatalf("publish of 1Mi within the budget: %v", err)
	}
	if v := gauge("after the second 1Mi publish"); v != 2<<20 {
		t.Errorf("ephemera_volume_bytes = %v after two 1Mi volumes, want %d", v, 2<<20)
	}

	// The reconcile rebuilds the same accounting from the records.
	h.RestartDriver()
	if v := gauge("after restart"); v != 2<<20 {
		t.Errorf("ephemera_volume_bytes = %v after restart, want %d", v, 2<<20)
	}
	err = publishFake(t, h, fake, pod, vol("nine", "9Mi"))
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "2Mi of its 10Mi") {
		t.Fatalf("publish of 9Mi with 2Mi in use: %v, want ResourceExhausted with the numbers", err)
	}
	if err := publishFake(t, h, fake, pod, vol("eight", "8Mi")); err != nil {
		t.Fatalf("publish of 8Mi, exactly filling the budget: %v", err)
	}
	if v := gauge("full"); v != budget {
		t.Errorf("ephemera_volume_bytes = %v with the budget full, want %d", v, budget)
	}
}

// A pod may have at most MaxVolumesPerPod volumes of the driver on the node:
// the next is refused with InvalidArgument naming the limit, another pod is
// not affected, and a volume the pod gives back makes room again, also after
// a restart (the count is rebuilt from the records).
func TestMaxVolumesPerPod(t *testing.T) {
	h, _, _ := fakeHarness(t, func(o *framework.Options) { o.Limits.MaxVolumesPerPod = 3 })
	ctx := t.Context()
	pod, other := h.Kubelet.NewPod("ns", "p"), h.Kubelet.NewPod("ns", "q")
	vol := func(name string) drivertest.InlineVolume {
		return drivertest.InlineVolume{Name: name, Attributes: map[string]string{"size": "1Mi"}}
	}
	for _, name := range []string{"a", "b", "c"} {
		if err := h.Kubelet.Publish(ctx, pod, vol(name)); err != nil {
			t.Fatalf("volume %s: %v", name, err)
		}
	}
	check := func(step string) {
		t.Helper()
		err := h.Kubelet.Publish(ctx, pod, vol("d"))
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "Limits.MaxVolumesPerPod 3") {
			t.Fatalf("%s: a fourth volume of the pod: %v, want InvalidArgument naming Limits.MaxVolumesPerPod (no flags bound)", step, err)
		}
	}
	check("first")
	if err := h.Kubelet.Publish(ctx, other, vol("a")); err != nil {
		t.Fatalf("another pod's volume: %v", err)
	}
	h.RestartDriver()
	check("after a restart")
	if err := h.Kubelet.Unpublish(ctx, pod, "a"); err != nil {
		t.Fatal(err)
	}
	if err := h.Kubelet.Publish(ctx, pod, vol("d")); err != nil {
		t.Fatalf("a volume once another is gone: %v", err)
	}
}
