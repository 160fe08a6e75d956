//go:build linux

package framework_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/content"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/store"
	"github.com/ephemera-csi/ephemera/framework/store/boltstore"
)

// heldBytes is ephemera_content_held_bytes of h's driver.
func heldBytes(t *testing.T, h *drivertest.Harness) float64 {
	t.Helper()
	return scrape(t, handlerGet(h.Driver().Handler(), "/metrics"))["ephemera_content_held_bytes"]
}

// fillVolume writes one file of the pod's own into dir until the
// filesystem is full, as a pod may in its own writable volume.
func fillVolume(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling %s: %v", dir, err)
			}
			return
		}
	}
}

// What a pod writes into its own volume is never counted as the driver's
// content (DESIGN 4g, "Nothing a tenant writes is evidence"): a directory
// named like a content timestamp holding a sparse 1 TiB file changes
// ephemera_content_held_bytes, which holds the volume's tmpfs at its size
// (volume-size charging), neither at a driver restart nor after a write of
// the driver's that fails in the volume the pod filled; another pod's content
// publish still succeeds, and the capacity is exactly the two volumes'.
func TestPodFilesAreNotCountedAsContent(t *testing.T) {
	var tag atomic.Value
	tag.Store("a")
	bound := tmpfsBound(4 << 20)
	h := realHarness(t, func(o *framework.Options) {
		volumeSize(o)
		o.Content = framework.ContentFunc(func(_ context.Context, v *api.Volume) (map[string]api.File, error) {
			return smallFiles(30, 1100, tag.Load().(string)), nil
		})
		o.Volumes.ContentCapacity = 2*bound + bound/2 // room for two volumes
	})
	k, ctx := h.Kubelet, t.Context()
	vol := drivertest.InlineVolume{Name: "v", Attributes: map[string]string{"size": "4Mi"}}
	attacker := k.NewPod("ns", "attacker")
	if err := k.Publish(ctx, attacker, vol); err != nil {
		t.Fatal(err)
	}
	target := k.TargetPath(attacker, "v")
	if b := volumeBound(t, target); b != bound {
		t.Fatalf("the tmpfs of a 4Mi volume holds %d (statfs), want %d: the test's capacity is wrong", b, bound)
	}
	if got := heldBytes(t, h); got != float64(bound) {
		t.Fatalf("ephemera_content_held_bytes = %v after one volume, want %d", got, bound)
	}
	fake := filepath.Join(target, "..2020_01_01_00_00_00.1")
	if err := os.Mkdir(fake, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(fake, "blob"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(fake, "blob"), 1<<40); err != nil {
		t.Fatalf("a sparse 1 TiB file in the pod's tmpfs: %v", err)
	}

	h.RestartDriver()
	if got := heldBytes(t, h); got != float64(bound) {
		t.Fatalf("ephemera_content_held_bytes = %v after a restart, want the %d recorded", got, bound)
	}

	// The pod fills its volume: the driver's next write fails there (no
	// room for the new files beside the old), and what the driver counts is
	// still the volume's bound.
	fillVolume(t, target)
	tag.Store("b")
	err := k.Publish(ctx, attacker, vol)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "does not fit") {
		t.Fatalf("a refresh into a volume the pod filled: %v, want ResourceExhausted saying it does not fit", err)
	}
	if got := heldBytes(t, h); got != float64(bound) {
		t.Fatalf("ephemera_content_held_bytes = %v after a failed write, want %d", got, bound)
	}

	other := k.NewPod("ns", "other")
	if err := k.Publish(ctx, other, vol); err != nil {
		t.Fatalf("another pod's content publish: %v", err)
	}
	if got := heldBytes(t, h); got != float64(2*bound) {
		t.Fatalf("ephemera_content_held_bytes = %v after two volumes, want %d", got, 2*bound)
	}
	if err := k.Publish(ctx, k.NewPod("ns", "third"), vol); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "--content-capacity") {
		t.Fatalf("a third volume past the capacity: %v, want ResourceExhausted naming --content-capacity", err)
	}
	for _, p := range []*drivertest.Pod{attacker, other} {
		if err := k.DeletePod(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	if got := heldBytes(t, h); got != 0 {
		t.Fatalf("ephemera_content_held_bytes = %v with no volumes left", got)
	}
}

// editRecord stops h's driver, changes the record of volume id with edit,
// and starts the driver again.
func editRecord(t *testing.T, h *drivertest.Harness, id string, edit func(*store.Record)) {
	t.Helper()
	h.Stop()
	st, err := boltstore.Open(filepath.Join(h.Options.Node.StateDir, framework.StateFile), boltstore.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := st.Get(t.Context(), id)
	if err == nil {
		edit(rec)
		err = st.Put(t.Context(), rec)
	}
	if cerr := st.Close(); err != nil || cerr != nil {
		t.Fatal(err, cerr)
	}
	h.RestartDriver()
}

// The count of content at a driver restart is what the driver recorded
// when it first wrote into each volume (volume-size charging: its tmpfs's
// bound), whatever the content grew to at a refresh and whatever the pod
// did to the files since: renaming the content out of the driver's names
// (its pages stay in the tmpfs) changes nothing. The count equals the sum
// of the records' ContentHeld, and it is read from them, not from the
// volumes: a record that says less is counted at what it says, until the
// volume's next write reserves the rest and records it.
func TestHeldCountedFromRecords(t *testing.T) {
	var n atomic.Int64
	n.Store(30)
	var tag atomic.Value
	tag.Store("a")
	h := realHarness(t, func(o *framework.Options) {
		volumeSize(o)
		o.Content = framework.ContentFunc(func(context.Context, *api.Volume) (map[string]api.File, error) {
			return smallFiles(int(n.Load()), 1100, tag.Load().(string)), nil
		})
	})
	k, ctx := h.Kubelet, t.Context()
	pods := []*drivertest.Pod{k.NewPod("ns", "p0"), k.NewPod("ns", "p1")}
	for i, size := range []string{"4Mi", "8Mi"} {
		if err := k.Publish(ctx, pods[i], drivertest.InlineVolume{Name: "v", Attributes: map[string]string{"size": size}}); err != nil {
			t.Fatal(err)
		}
	}
	b0, b1 := volumeBound(t, k.TargetPath(pods[0], "v")), volumeBound(t, k.TargetPath(pods[1], "v"))
	want := float64(b0 + b1)
	if got := heldBytes(t, h); got != want {
		t.Fatalf("ephemera_content_held_bytes = %v, want %v (two tmpfs, statfs)", got, want)
	}
	// p1's content grows at a refresh: nothing more is held.
	n.Store(60)
	tag.Store("b")
	if err := k.Republish(ctx, pods[1], "v"); err != nil {
		t.Fatal(err)
	}
	if got := heldBytes(t, h); got != want {
		t.Fatalf("ephemera_content_held_bytes = %v after a refresh, want %v", got, want)
	}
	// p0 moves the content out of the names the driver writes.
	target := k.TargetPath(pods[0], "v")
	ts, err := content.Current(target)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(target, ts), filepath.Join(target, "mine")); err != nil {
		t.Fatal(err)
	}

	h.RestartDriver()
	if got := heldBytes(t, h); got != want {
		t.Fatalf("ephemera_content_held_bytes = %v after a restart, want the %v the driver recorded", got, want)
	}
	var sum int64
	for _, r := range records(t, h) { // restarts the driver once more
		if r.ContentHeld == nil {
			t.Errorf("the record of %s says nothing of its content", r.VolumeID)
			continue
		}
		sum += *r.ContentHeld
	}
	if got := heldBytes(t, h); float64(sum) != want || got != want {
		t.Errorf("the records say %d, ephemera_content_held_bytes = %v; want both %v", sum, got, want)
	}

	// A record that says less than the volume's bound is what a restart
	// counts; p0's next write reserves the rest, and records it.
	id0 := api.VolumeHandle(pods[0].UID, "v")
	less := b0 / 3
	editRecord(t, h, id0, func(r *store.Record) { r.ContentHeld = &less })
	if got := heldBytes(t, h); got != float64(less+b1) {
		t.Fatalf("ephemera_content_held_bytes = %v after a restart with p0's record at %d, want %d", got, less, less+b1)
	}
	tag.Store("c")
	if err := k.Republish(ctx, pods[0], "v"); err != nil {
		t.Fatal(err)
	}
	if got := heldBytes(t, h); got != want {
		t.Fatalf("ephemera_content_held_bytes = %v after p0's next write, want %v", got, want)
	}
	for _, r := range records(t, h) {
		if r.VolumeID == id0 && (r.ContentHeld == nil || *r.ContentHeld != b0) {
			t.Errorf("p0's record's ContentHeld is %s after its next write, want %d", heldOf(r), b0)
		}
	}
	for _, p := range pods {
		if err := k.DeletePod(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
}

// A republish whose new content cannot be written (here: it does not fit
// the volume beside the old) is not answered OK: the kubelet gets a
// retryable code and records it, ephemera_refresh_total{result="failed"}
// counts it, the pod gets a Warning event naming the volume and the cause,
// and the volume keeps its mount and its last good content.
func TestRepublishWriteFailureIsReported(t *testing.T) {
	var tag atomic.Value
	tag.Store("a")
	ev := &sink{}
	h := realHarness(t, func(o *framework.Options) {
		volumeSize(o)
		o.Observability.Events = ev
		o.Content = framework.ContentFunc(func(context.Context, *api.Volume) (map[string]api.File, error) {
			return smallFiles(150, 1100, tag.Load().(string)), nil // 150 pages: once in 1Mi, not twice
		})
	})
	k, ctx := h.Kubelet, t.Context()
	pod := k.NewPod("ns", "app")
	vol := drivertest.InlineVolume{Name: "certs", Attributes: map[string]string{"size": "1Mi"}}
	if err := k.Publish(ctx, pod, vol); err != nil {
		t.Fatal(err)
	}
	target := k.TargetPath(pod, "certs")
	id := mountID(t, target)
	held := heldBytes(t, h)
	failed := func() float64 {
		return scrape(t, handlerGet(h.Driver().Handler(), "/metrics"))[`ephemera_refresh_total{result="failed"}`]
	}
	before := failed()

	tag.Store("b")
	err := k.Republish(ctx, pod, "certs")
	if err == nil || drivertest.IsFinal(err) {
		t.Fatalf("republish whose content does not fit: %v, want a retryable error", err)
	}
	if c := status.Code(err); c != codes.ResourceExhausted {
		t.Errorf("republish whose content does not fit: code %v, want ResourceExhausted", c)
	}
	if n := failed() - before; n < 1 {
		t.Errorf(`ephemera_refresh_total{result="failed"} rose by %v, want at least 1`, n)
	}
	got := ev.list()
	if len(got) == 0 || !strings.HasPrefix(got[0], "ns/app Warning RefreshFailed: ") || !strings.Contains(got[0], `"certs"`) || !strings.Contains(got[0], "does not fit") {
		t.Errorf("events %q, want a Warning RefreshFailed on ns/app naming the volume and the cause", got)
	}
	if s := readFile(t, filepath.Join(target, "d0", "f0000")); !strings.HasPrefix(s, "aaaa") {
		t.Errorf("the failed refresh changed the content: %.8q…", s)
	}
	if mountsAt(t, target) != 1 || mountID(t, target) != id {
		t.Errorf("the failed refresh touched the mount: %d mounts, id %d -> %d", mountsAt(t, target), id, mountID(t, target))
	}
	if got := heldBytes(t, h); got != held {
		t.Errorf("ephemera_content_held_bytes = %v after the failed write, want the %v of the content that stays", got, held)
	}
	if err := k.DeletePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
}

// A record without ContentHeld (written by an earlier version, or rebuilt
// from the node) counts what the kernel says the volume's own tmpfs uses
// (fstatfs: a sparse file takes no pages), at most its size. The volume's
// next write reserves the rest of its tmpfs's bound (volume-size
// charging), in the record too; when the capacity has no room for it, that
// refresh is refused (ResourceExhausted, naming --content-capacity), the
// old content in place and the count unchanged, until room is made.
func TestHeldWithoutRecordedCount(t *testing.T) {
	var tag atomic.Value
	tag.Store("a")
	bound, other := tmpfsBound(4<<20), tmpfsBound(8<<20)
	h := realHarness(t, func(o *framework.Options) {
		volumeSize(o)
		o.Content = framework.ContentFunc(func(context.Context, *api.Volume) (map[string]api.File, error) {
			return smallFiles(30, 1100, tag.Load().(string)), nil
		})
		// Room for the 4Mi volume and an 8Mi one, not a byte more.
		o.Volumes.ContentCapacity = bound + other - 1
	})
	k, ctx := h.Kubelet, t.Context()
	vol := drivertest.InlineVolume{Name: "v", Attributes: map[string]string{"size": "4Mi"}}
	pod := k.NewPod("ns", "old")
	if err := k.Publish(ctx, pod, vol); err != nil {
		t.Fatal(err)
	}
	target := k.TargetPath(pod, "v")
	if b := volumeBound(t, target); b != bound {
		t.Fatalf("the tmpfs of a 4Mi volume holds %d (statfs), want %d: the test's capacity is wrong", b, bound)
	}
	// The pod's own files: a directory and a sparse 1 TiB file, two inodes.
	if err := os.Mkdir(filepath.Join(target, "mine"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(target, "mine", "blob"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(target, "mine", "blob"), 1<<40); err != nil {
		t.Fatal(err)
	}
	used := min(volumeUsed(t, target), 4<<20)
	if used <= 0 || used >= bound {
		t.Fatalf("the volume's tmpfs uses %d, want some and less than its bound %d: the test is wrong", used, bound)
	}

	id := api.VolumeHandle(pod.UID, "v")
	editRecord(t, h, id, func(r *store.Record) { r.ContentHeld = nil }) // as an earlier version wrote it
	if got := heldBytes(t, h); got != float64(used) {
		t.Fatalf("ephemera_content_held_bytes = %v from a record without the count, want the %d the tmpfs uses (statfs)", got, used)
	}

	// An 8Mi volume takes the room the capacity has: the old volume's next
	// write cannot reserve the rest of its bound.
	neighbour := k.NewPod("ns", "neighbour")
	if err := k.Publish(ctx, neighbour, drivertest.InlineVolume{Name: "v", Attributes: map[string]string{"size": "8Mi"}}); err != nil {
		t.Fatal(err)
	}
	if got := heldBytes(t, h); got != float64(used+other) {
		t.Fatalf("ephemera_content_held_bytes = %v, want %d", got, used+other)
	}
	tag.Store("b")
	err := k.Republish(ctx, pod, "v")
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "--content-capacity") {
		t.Fatalf("a refresh whose volume's bound does not fit the capacity: %v, want ResourceExhausted naming --content-capacity", err)
	}
	if s := readFile(t, filepath.Join(target, "d0", "f0000")); !strings.HasPrefix(s, "aaaa") {
		t.Fatalf("the refused refresh changed the content: %.8q…", s)
	}
	if got := heldBytes(t, h); got != float64(used+other) {
		t.Fatalf("ephemera_content_held_bytes = %v after a refused refresh, want %d", got, used+other)
	}
	if err := k.DeletePod(ctx, neighbour); err != nil {
		t.Fatal(err)
	}

	if err := k.Republish(ctx, pod, "v"); err != nil {
		t.Fatal(err)
	}
	if s := readFile(t, filepath.Join(target, "d0", "f0000")); !strings.HasPrefix(s, "bbbb") {
		t.Fatalf("the refresh left the content %.8q…", s)
	}
	if got := heldBytes(t, h); got != float64(bound) {
		t.Fatalf("ephemera_content_held_bytes = %v after the volume's next write, want its bound %d", got, bound)
	}
	for _, r := range records(t, h) {
		if r.VolumeID == id && (r.ContentHeld == nil || *r.ContentHeld != bound) {
			t.Errorf("the record's ContentHeld is %s after the volume's next write, want %d", heldOf(r), bound)
		}
	}
	if err := k.DeletePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
}

// heldOf is r's ContentHeld, for a message.
func heldOf(r *store.Record) string {
	if r.ContentHeld == nil {
		return "nil"
	}
	return fmt.Sprint(*r.ContentHeld)
}
