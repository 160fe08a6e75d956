//go:build linux

package framework_test

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/drivers/tmpfs"
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

// volumeSize runs the framework tests of the content capacity in the
// fallback charging mode (ChargeVolumeSize), whatever the machine's cgroups
// are: the driver pays for the content of memory-backed volumes, each
// reserved at what its tmpfs can hold.
func volumeSize(o *framework.Options) {
	o.Volumes.PodCgroups.Mode = framework.PodCgroupsOff
}

// tmpfsBound is what a volume of size bytes of the tmpfs backend (its
// default inode rule: one inode per page of size, at least
// tmpfs.DefaultMinInodes) can hold, as the fallback reserves it from the
// content capacity: its size, and content.InodeCharge per inode besides the
// root. volumeBound reads the same from the kernel once it is mounted.
func tmpfsBound(size int64) int64 {
	inodes := max(size/tmpfs.DefaultBytesPerInode, tmpfs.DefaultMinInodes)
	return size + (inodes-1)*content.InodeCharge
}

// volumeBound is what the kernel lets the tmpfs mounted at dir hold (statfs:
// its size= and nr_inodes), as the fallback reserves it: its size, and
// content.InodeCharge per inode besides the root.
func volumeBound(t *testing.T, dir string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	if st.Type != unix.TMPFS_MAGIC {
		t.Fatalf("%s is not a tmpfs (type %#x)", dir, st.Type)
	}
	return int64(st.Blocks)*st.Bsize + int64(st.Files-1)*content.InodeCharge
}

// volumeUsed is what the kernel says the tmpfs mounted at dir uses
// (statfs: its used blocks, and content.InodeCharge per inode in use besides
// the root): what a record without a count is counted at, up to its size.
func volumeUsed(t *testing.T, dir string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Blocks-st.Bfree)*st.Bsize + int64(st.Files-st.Ffree-1)*content.InodeCharge
}

// chargingMode is the mode of ephemera_content_charging of h's driver,
// failing unless exactly one is exported.
func chargingMode(t *testing.T, h *drivertest.Harness) string {
	t.Helper()
	var modes []string
	for series, v := range scrape(t, handlerGet(h.Driver().Handler(), "/metrics")) {
		if mode, ok := strings.CutPrefix(series, `ephemera_content_charging{mode="`); ok && v == 1 {
			modes = append(modes, strings.TrimSuffix(mode, `"}`))
		}
	}
	if len(modes) != 1 {
		t.Fatalf("ephemera_content_charging modes %q, want one", modes)
	}
	return modes[0]
}

// keepGeneration does what a pod may do to keep the content it sees alive
// after a refresh: it hard-links every file of the current generation into
// a directory of its own, name, in the volume at dir.
func keepGeneration(t *testing.T, dir, name string) {
	t.Helper()
	ts, err := content.Current(dir)
	if err != nil || ts == "" {
		t.Fatalf("the current content of %s: %q, %v", dir, ts, err)
	}
	from := filepath.Join(dir, ts)
	err = filepath.WalkDir(from, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, p)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dir, name, rel), 0o755)
		}
		return os.Link(p, filepath.Join(dir, name, rel))
	})
	if err != nil {
		t.Fatalf("keeping the content of %s: %v", dir, err)
	}
}

// Without pod cgroups (volume-size charging) the content the driver writes
// into tmpfs volumes is charged to the driver's memory for as long as
// anything keeps it alive, so each such volume is reserved against
// --content-capacity at what its tmpfs can hold (statfs: size and inodes),
// at its first write, until it is gone. A publish past the capacity is
// refused (ResourceExhausted, naming the flag); a volume whose tmpfs could
// hold more than the capacity ever allows is InvalidArgument; refreshes
// reserve nothing more, whatever the pod keeps of the old content, and a pod
// that keeps so much that its own tmpfs is full has its own refresh refused
// (the old content stays, and the republish says so) while a neighbour's
// succeeds; a restarted driver counts what its records say; an unpublish
// gives room back.
func TestContentCapacity(t *testing.T) {
	var tag atomic.Value
	tag.Store("a")
	const size = 8 << 20
	bound := tmpfsBound(size) // 8Mi and 2047 inodes
	h := realHarness(t, func(o *framework.Options) {
		volumeSize(o)
		o.Content = framework.ContentFunc(func(_ context.Context, v *api.Volume) (map[string]api.File, error) {
			return smallFiles(300, 1100, tag.Load().(string)), nil // 300 pages, 305 inodes
		})
		o.Volumes.ContentCapacity = 3*bound + bound/2 // room for three volumes
	})
	k, ctx := h.Kubelet, t.Context()
	held := func() float64 {
		t.Helper()
		return heldBytes(t, h)
	}
	if m := chargingMode(t, h); m != "volume-size" {
		t.Fatalf("ephemera_content_charging{mode=%q}, want volume-size", m)
	}
	vol := drivertest.InlineVolume{Name: "v", Attributes: map[string]string{"size": "8Mi"}}
	var pods []*drivertest.Pod
	for i := range 3 {
		p := k.NewPod("ns", fmt.Sprint("p", i))
		if err := k.Publish(ctx, p, vol); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		if b := volumeBound(t, k.TargetPath(p, "v")); b != bound {
			t.Fatalf("the tmpfs of an 8Mi volume holds %d (statfs), want %d: the test's capacity is wrong", b, bound)
		}
		pods = append(pods, p)
	}
	if got := held(); got != float64(3*bound) {
		t.Fatalf("ephemera_content_held_bytes = %v after three volumes, want %d (three tmpfs of 8Mi and 2047 inodes)", got, 3*bound)
	}
	fourth := k.NewPod("ns", "p3")
	err := k.Publish(ctx, fourth, vol)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "--content-capacity") {
		t.Fatalf("fourth volume's publish: %v, want ResourceExhausted naming --content-capacity", err)
	}
	if n := mountsAt(t, k.TargetPath(fourth, "v")); n != 0 {
		t.Fatalf("the refused volume left %d mounts", n)
	}
	const hugeSize = 32 << 20
	if tmpfsBound(hugeSize) <= 3*bound+bound/2 {
		t.Fatalf("a 32Mi volume holds %d, not more than the capacity: the test is wrong", tmpfsBound(hugeSize))
	}
	huge := k.NewPod("ns", "huge")
	err = k.Publish(ctx, huge, drivertest.InlineVolume{Name: "v", Attributes: map[string]string{"size": "32Mi"}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "retrying does not help") || !strings.Contains(err.Error(), "--content-capacity") {
		t.Fatalf("a volume whose tmpfs holds more than the capacity: %v, want InvalidArgument naming --content-capacity", err)
	}
	if n := mountsAt(t, k.TargetPath(huge, "v")); n != 0 {
		t.Fatalf("the refused volume left %d mounts", n)
	}

	// Refreshes at full capacity reserve nothing more: the volume was
	// reserved whole at its first write, whatever the pod keeps open of the
	// old content.
	target := k.TargetPath(pods[0], "v")
	var open []*os.File
	defer func() {
		for _, f := range open {
			f.Close()
		}
	}()
	for _, next := range []string{"b", "c", "d"} {
		f, err := os.Open(filepath.Join(target, "d0", "f0000"))
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, f)
		tag.Store(next)
		if err := k.Republish(ctx, pods[0], "v"); err != nil {
			t.Fatalf("refresh to %q at full capacity: %v", next, err)
		}
		if got := readFile(t, filepath.Join(target, "d0", "f0000")); !strings.HasPrefix(got, next) {
			t.Fatalf("after a refresh to %q the content is %.8q…", next, got)
		}
		if got := held(); got != float64(3*bound) {
			t.Fatalf("ephemera_content_held_bytes = %v after a refresh, want the %d reserved", got, 3*bound)
		}
	}

	// The pod keeps every generation (hard links): its tmpfs fills, and its
	// own refresh is refused, the last content in place; nothing more is
	// reserved, and a neighbour's refresh succeeds.
	last, refused := "d", error(nil)
	for i, next := range strings.Split("efghijklmnopqrst", "") {
		keepGeneration(t, target, fmt.Sprint("kept", i))
		tag.Store(next)
		if refused = k.Republish(ctx, pods[0], "v"); refused != nil {
			t.Logf("refresh %d refused with %d generations kept", i, i+1)
			break
		}
		last = next
	}
	if status.Code(refused) != codes.ResourceExhausted || !strings.Contains(refused.Error(), "does not fit") || strings.Contains(refused.Error(), "--content-capacity") {
		t.Fatalf("refresh into a tmpfs the pod filled with old content: %v, want ResourceExhausted saying it does not fit (not the capacity)", refused)
	}
	if got := readFile(t, filepath.Join(target, "d0", "f0000")); !strings.HasPrefix(got, last) {
		t.Fatalf("the refused refresh changed the content %q: %.8q…", last, got)
	}
	if got := held(); got != float64(3*bound) {
		t.Fatalf("ephemera_content_held_bytes = %v after a refused refresh, want %d", got, 3*bound)
	}
	if err := k.Republish(ctx, pods[1], "v"); err != nil {
		t.Fatalf("a neighbour's refresh: %v", err)
	}
	if got := readFile(t, filepath.Join(k.TargetPath(pods[1], "v"), "d0", "f0000")); !strings.HasPrefix(got, tag.Load().(string)) {
		t.Fatalf("the neighbour's refresh left %.8q…", got)
	}
	for _, f := range open {
		f.Close()
	}
	open = nil
	tag.Store("a")

	// A restarted driver counts what the records say the volumes hold.
	h.RestartDriver()
	if got := held(); got != float64(3*bound) {
		t.Fatalf("ephemera_content_held_bytes = %v after a restart, want the %d the records say", got, 3*bound)
	}
	if err := k.Publish(ctx, fourth, vol); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("fourth volume's publish after a restart: %v, want ResourceExhausted", err)
	}
	if err := k.DeletePod(ctx, pods[2]); err != nil {
		t.Fatal(err)
	}
	if got := held(); got != float64(2*bound) {
		t.Fatalf("ephemera_content_held_bytes = %v once a pod ended, want %d", got, 2*bound)
	}
	if err := k.Publish(ctx, fourth, vol); err != nil {
		t.Fatalf("fourth volume's publish once another pod ended: %v", err)
	}
	if got := held(); got != float64(3*bound) {
		t.Fatalf("ephemera_content_held_bytes = %v, want %d", got, 3*bound)
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
