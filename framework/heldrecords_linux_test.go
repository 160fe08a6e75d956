//go:build linux

package framework_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/content"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
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
// ephemera_content_held_bytes neither at a driver restart nor after a write
// of the driver's that fails in the volume the pod filled, and another pod's
// content publish still succeeds.
func TestPodFilesAreNotCountedAsContent(t *testing.T) {
	var tag atomic.Value
	tag.Store("a")
	page := int64(os.Getpagesize())
	charge := content.Charge(smallFiles(30, 1100, "a"), page)
	h := realHarness(t, func(o *framework.Options) {
		o.Content = framework.ContentFunc(func(_ context.Context, v *api.Volume) (map[string]api.File, error) {
			return smallFiles(30, 1100, tag.Load().(string)), nil
		})
		o.Volumes.ContentCapacity = 2*charge + charge/2 // room for two volumes' content
	})
	k, ctx := h.Kubelet, t.Context()
	vol := drivertest.InlineVolume{Name: "v", Attributes: map[string]string{"size": "4Mi"}}
	attacker := k.NewPod("ns", "attacker")
	if err := k.Publish(ctx, attacker, vol); err != nil {
		t.Fatal(err)
	}
	if got := heldBytes(t, h); got != float64(charge) {
		t.Fatalf("ephemera_content_held_bytes = %v after one volume, want %d", got, charge)
	}
	target := k.TargetPath(attacker, "v")
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
	if got := heldBytes(t, h); got != float64(charge) {
		t.Fatalf("ephemera_content_held_bytes = %v after a restart, want the %d the driver wrote", got, charge)
	}

	// The pod fills its volume: the driver's next write fails there (no
	// room for the new files beside the old), and what the driver counts is
	// still only what it wrote.
	fillVolume(t, target)
	tag.Store("b")
	_ = k.Publish(ctx, attacker, vol) // fails: answered OK until issue 44's item 3
	if got := heldBytes(t, h); got != float64(charge) {
		t.Fatalf("ephemera_content_held_bytes = %v after a failed write, want the %d the driver wrote", got, charge)
	}

	other := k.NewPod("ns", "other")
	if err := k.Publish(ctx, other, vol); err != nil {
		t.Fatalf("another pod's content publish: %v", err)
	}
	if got := heldBytes(t, h); got != float64(2*charge) {
		t.Fatalf("ephemera_content_held_bytes = %v after two volumes, want %d", got, 2*charge)
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

// The count of content at a driver restart is what the driver recorded
// when it wrote it, whatever the pod did to the files since: renaming the
// content out of the driver's names (its pages stay in the tmpfs) changes
// nothing.
func TestHeldCountedFromRecords(t *testing.T) {
	page := int64(os.Getpagesize())
	files := smallFiles(30, 1100, "a")
	charge := content.Charge(files, page)
	h := realHarness(t, func(o *framework.Options) {
		o.Content = framework.ContentFunc(func(context.Context, *api.Volume) (map[string]api.File, error) {
			return smallFiles(30, 1100, "a"), nil
		})
	})
	k, ctx := h.Kubelet, t.Context()
	vol := drivertest.InlineVolume{Name: "v", Attributes: map[string]string{"size": "4Mi"}}
	pods := []*drivertest.Pod{k.NewPod("ns", "p0"), k.NewPod("ns", "p1")}
	for _, p := range pods {
		if err := k.Publish(ctx, p, vol); err != nil {
			t.Fatal(err)
		}
	}
	if got := heldBytes(t, h); got != float64(2*charge) {
		t.Fatalf("ephemera_content_held_bytes = %v, want %d", got, 2*charge)
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
	if got := heldBytes(t, h); got != float64(2*charge) {
		t.Fatalf("ephemera_content_held_bytes = %v after a restart, want the %d the driver recorded", got, 2*charge)
	}
	for _, p := range pods {
		if err := k.DeletePod(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
}
