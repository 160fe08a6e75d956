//go:build linux

package framework_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/internal/podcgroup/podcgrouptest"
)

// podCgroupWait is --pod-cgroup-wait in these tests: short, so that a pod
// without a cgroup is refused at once.
const podCgroupWait = 300 * time.Millisecond

// podCgroupHarness is a real driver charging the pods of a fake kubelet's
// cgroup root (podcgrouptest: a kubelet cgroup root of the test's own on
// this machine's cgroup v1 memory hierarchy) for their content: a file
// "token" of size() bytes of the byte tag(). Its content capacity, 1 MiB,
// is less than one answer and one volume: no content would be admitted if
// it were counted.
func podCgroupHarness(t *testing.T, size func() int, tag func() byte) (*drivertest.Harness, *podcgrouptest.Root) {
	t.Helper()
	requireRoot(t)
	root := podcgrouptest.New(t) // before the harness: removed after it
	h := realHarness(t, func(o *framework.Options) {
		o.Content = framework.ContentFunc(func(context.Context, *api.Volume) (map[string]api.File, error) {
			return map[string]api.File{"token": {Data: []byte(strings.Repeat(string(tag()), size()))}}, nil
		})
		o.Volumes.ContentCapacity = 1 << 20
		o.Volumes.PodCgroups = framework.PodCgroupOptions{
			Mode:              framework.PodCgroupsRequired,
			Mount:             podcgrouptest.Mount,
			KubeletCgroupRoot: root.Root,
			Wait:              podCgroupWait,
		}
	})
	if m := chargingMode(t, h); m != "pod-cgroup" {
		t.Fatalf("ephemera_content_charging{mode=%q}, want pod-cgroup", m)
	}
	return h, root
}

// tokenTag is the byte the token file of the volume at target is made of.
func tokenTag(t *testing.T, target string) byte {
	t.Helper()
	s := readFile(t, filepath.Join(target, "token"))
	if s == "" {
		t.Fatalf("%s/token is empty", target)
	}
	return s[0]
}

// With pod cgroups the driver's writer writes the content of a pod's tmpfs
// volume from the pod's own memory cgroup: the pages of every generation
// the pod keeps alive (here: open) are the pod's, against its limit, and
// none of them counts against --content-capacity
// (ephemera_content_held_bytes stays 0, the capacity being less than one
// answer), before and after a driver restart.
func TestContentChargedToPodCgroup(t *testing.T) {
	const size = 2 << 20
	var tag atomic.Int32
	tag.Store('a')
	h, root := podCgroupHarness(t, func() int { return size }, func() byte { return byte(tag.Load()) })
	k, ctx := h.Kubelet, t.Context()
	vol := drivertest.InlineVolume{Name: "token", Attributes: map[string]string{"size": "32Mi"}}
	pod := k.NewPod("ns", "app")
	cg := root.Pod(t, pod.UID, 64<<20)
	before := podcgrouptest.Stat(t, cg, "total_shmem")
	if err := k.Publish(ctx, pod, vol); err != nil {
		t.Fatal(err)
	}
	target := k.TargetPath(pod, "token")
	var open []*os.File
	defer func() {
		for _, f := range open {
			f.Close()
		}
	}()
	for i, next := range []byte("bcd") {
		// The pod keeps the current generation open, then it is replaced.
		f, err := os.Open(filepath.Join(target, "token"))
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, f)
		tag.Store(int32(next))
		if err := k.Republish(ctx, pod, "token"); err != nil {
			t.Fatalf("refresh %d: %v", i, err)
		}
		if got := tokenTag(t, target); got != next {
			t.Fatalf("after refresh %d the token is %q…, want %q", i, got, next)
		}
		if got := heldBytes(t, h); got != 0 {
			t.Fatalf("ephemera_content_held_bytes = %v after refresh %d, want 0: the pod pays", got, i)
		}
	}
	// Four generations of 2 MiB, three of them kept open by the pod.
	if got := podcgrouptest.Stat(t, cg, "total_shmem") - before; got < 4*size {
		t.Errorf("the pod's memory cgroup gained %d bytes of shmem, want at least %d (four generations)", got, 4*size)
	}
	h.RestartDriver()
	if got := heldBytes(t, h); got != 0 {
		t.Errorf("ephemera_content_held_bytes = %v after a restart, want 0", got)
	}
	for _, f := range open {
		f.Close()
	}
	open = nil
	if err := k.DeletePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
}

// A pod whose memory limit cannot hold its new content has its own
// refresh refused (ResourceExhausted, naming the pod's memory
// limit), its old content in place, while a neighbour's refresh of the
// same content succeeds. A pod whose cgroup the kubelet has not made yet is
// refused Unavailable after --pod-cgroup-wait, leaving nothing mounted, and
// its publish succeeds once the cgroup is there.
func TestPodCgroupRefusals(t *testing.T) {
	var size, tag atomic.Int32
	size.Store(1 << 20)
	tag.Store('a')
	h, root := podCgroupHarness(t, func() int { return int(size.Load()) }, func() byte { return byte(tag.Load()) })
	k, ctx := h.Kubelet, t.Context()
	vol := drivertest.InlineVolume{Name: "token", Attributes: map[string]string{"size": "32Mi"}}
	// The small pod's limit holds its first content and the writer (this
	// test binary: about 2 MiB, 16 MiB under -race), not the next content
	// alone; the neighbour's holds both contents and the writer.
	const smallLimit, next = 24 << 20, 28 << 20
	small, neighbour := k.NewPod("ns", "small"), k.NewPod("ns", "neighbour")
	smallCg := root.Pod(t, small.UID, smallLimit)
	root.Pod(t, neighbour.UID, 64<<20)
	for _, p := range []*drivertest.Pod{small, neighbour} {
		if err := k.Publish(ctx, p, vol); err != nil {
			t.Fatalf("publish %s: %v", p.Name, err)
		}
	}
	if got := podcgrouptest.Stat(t, smallCg, "total_shmem"); got < 1<<20 {
		t.Fatalf("the small pod's cgroup has %d bytes of shmem, want its 1 MiB of content", got)
	}

	size.Store(next)
	tag.Store('b')
	err := k.Republish(ctx, small, "token")
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "the pod's memory limit") {
		t.Fatalf("a refresh over the pod's memory limit: %v, want ResourceExhausted naming the pod's memory limit", err)
	}
	if got := tokenTag(t, k.TargetPath(small, "token")); got != 'a' {
		t.Fatalf("the refused refresh changed the content to %q…", got)
	}
	if err := k.Republish(ctx, neighbour, "token"); err != nil {
		t.Fatalf("the neighbour's refresh: %v", err)
	}
	if got := tokenTag(t, k.TargetPath(neighbour, "token")); got != 'b' {
		t.Fatalf("the neighbour's refresh left %q…", got)
	}
	if got := heldBytes(t, h); got != 0 {
		t.Fatalf("ephemera_content_held_bytes = %v, want 0", got)
	}

	// The kubelet has not made the pod's cgroup yet.
	late := k.NewPod("ns", "late")
	began := time.Now()
	err = k.Publish(ctx, late, vol)
	took := time.Since(began)
	if status.Code(err) != codes.Unavailable || drivertest.IsFinal(err) {
		t.Fatalf("a publish before the pod's cgroup exists: %v, want Unavailable", err)
	}
	if took < podCgroupWait || took > 5*time.Second { // the default wait is 10s
		t.Errorf("the publish was refused after %v, want --pod-cgroup-wait (%v) or a little more", took, podCgroupWait)
	}
	if n := mountsAt(t, k.TargetPath(late, "token")); n != 0 {
		t.Errorf("the refused publish left %d mounts", n)
	}
	root.Pod(t, late.UID, 64<<20)
	if err := k.Publish(ctx, late, vol); err != nil {
		t.Fatalf("the publish once the pod's cgroup exists: %v", err)
	}
	for _, p := range []*drivertest.Pod{small, neighbour, late} {
		if err := k.DeletePod(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
}
