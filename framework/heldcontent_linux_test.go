//go:build linux

package framework_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/content"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
)

// smallFiles is a content answer of n files of size bytes: each takes a
// page and an inode in a tmpfs, whatever its size.
func smallFiles(n, size int, tag string) map[string]api.File {
	files := make(map[string]api.File, n)
	for i := range n {
		files[fmt.Sprintf("d%d/f%04d", i%4, i)] = api.File{Data: []byte(strings.Repeat(tag, size))}
	}
	return files
}

// The content the driver writes into tmpfs volumes is charged to the
// driver's memory, and stays so while the volumes exist: it counts against
// --content-capacity, the way the kernel charges it. A publish past the
// capacity is refused (ResourceExhausted, naming the flag); content larger
// than the capacity ever allows is InvalidArgument; an unpublish gives room
// back; a restarted driver counts the content already there (as its records
// say); and a refresh holds the old and the new content until the swap.
func TestContentCapacity(t *testing.T) {
	tag := atomic.Value{}
	tag.Store("a")
	per := smallFiles(300, 1100, "a")
	page := int64(os.Getpagesize())
	charge := content.Charge(per, page) // about 1.5MiB: 300 pages and 300+ inodes
	h := realHarness(t, func(o *framework.Options) {
		o.Content = framework.ContentFunc(func(_ context.Context, v *api.Volume) (map[string]api.File, error) {
			if v.Pod.Name == "huge" {
				return smallFiles(1500, 10, "h"), nil
			}
			return smallFiles(300, 1100, tag.Load().(string)), nil
		})
		o.Volumes.ContentCapacity = 3*charge + charge/2 // room for three volumes' content
	})
	k, ctx := h.Kubelet, t.Context()
	held := func() float64 {
		t.Helper()
		return scrape(t, handlerGet(h.Driver().Handler(), "/metrics"))["ephemera_content_held_bytes"]
	}
	vol := drivertest.InlineVolume{Name: "v", Attributes: map[string]string{"size": "8Mi"}}
	var pods []*drivertest.Pod
	for i := range 3 {
		p := k.NewPod("ns", fmt.Sprint("p", i))
		if err := k.Publish(ctx, p, vol); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		pods = append(pods, p)
	}
	if got := held(); got != float64(3*charge) {
		t.Fatalf("ephemera_content_held_bytes = %v after three volumes, want %d", got, 3*charge)
	}
	fourth := k.NewPod("ns", "p3")
	err := k.Publish(ctx, fourth, vol)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "--content-capacity") {
		t.Fatalf("fourth volume's publish: %v, want ResourceExhausted naming --content-capacity", err)
	}
	if n := mountsAt(t, k.TargetPath(fourth, "v")); n != 0 {
		t.Fatalf("the refused volume left %d mounts", n)
	}
	huge := k.NewPod("ns", "huge")
	err = k.Publish(ctx, huge, drivertest.InlineVolume{Name: "v", Attributes: map[string]string{"size": "16Mi"}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "retrying does not help") {
		t.Fatalf("content larger than the capacity: %v, want InvalidArgument", err)
	}

	// A refresh with new content would hold both sets until the swap: no
	// room, so the volume keeps its content, and the republish says so
	// (ResourceExhausted: the kubelet retries; issue 44).
	tag.Store("b")
	if err := k.Publish(ctx, pods[0], vol); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "--content-capacity") {
		t.Fatalf("republish with new content at capacity: %v, want ResourceExhausted naming --content-capacity", err)
	}
	if got := readFile(t, k.TargetPath(pods[0], "v")+"/d0/f0000"); !strings.HasPrefix(got, "aaaa") {
		t.Fatalf("the refused refresh changed the content: %.8q…", got)
	}

	if got := held(); got != float64(3*charge) {
		t.Fatalf("ephemera_content_held_bytes = %v after a refused refresh, want %d", got, 3*charge)
	}
	tag.Store("a")

	// A restarted driver counts what the records say the volumes hold.
	h.RestartDriver()
	if got := held(); got != float64(3*charge) {
		t.Fatalf("ephemera_content_held_bytes = %v after a restart, want the %d the volumes hold", got, 3*charge)
	}
	if err := k.Publish(ctx, fourth, vol); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("fourth volume's publish after a restart: %v, want ResourceExhausted", err)
	}
	if err := k.DeletePod(ctx, pods[2]); err != nil {
		t.Fatal(err)
	}
	if err := k.Publish(ctx, fourth, vol); err != nil {
		t.Fatalf("fourth volume's publish once another pod ended: %v", err)
	}
	if got := held(); got != float64(3*charge) {
		t.Fatalf("ephemera_content_held_bytes = %v, want %d", got, 3*charge)
	}
	for _, p := range []*drivertest.Pod{pods[0], pods[1], fourth} {
		if err := k.DeletePod(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	if got := held(); got != 0 {
		t.Fatalf("ephemera_content_held_bytes = %v with no volumes left", got)
	}
}
