//go:build linux

package fill

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/content"
	"github.com/ephemera-csi/ephemera/framework/internal/errkind"
	"github.com/ephemera-csi/ephemera/framework/internal/mounttest"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// tmpfs mounts a tmpfs with options opts (size=...) on a temporary
// directory, unmounted when the test ends, and returns the directory and
// what the kernel lets it hold as writeReserved counts it (its size, and
// content.InodeCharge per inode besides the root), read here from statfs.
func tmpfs(t *testing.T, opts string) (string, int64) {
	t.Helper()
	dir := mounttest.Tmpfs(t, opts)
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return dir, int64(st.Blocks)*st.Bsize + int64(st.Files-1)*content.InodeCharge
}

// Without pod cgroups (ChargeVolumeSize), the first write into a
// memory-backed volume reserves what its tmpfs can hold from the content
// capacity and records it (SaveHeld) before it writes; refreshes, whatever
// they write, hold no more; a restart counts what the records of the
// published volumes say (CountHeld), skipping the ones not published,
// whatever the files in the volumes say.
func TestHeldContent(t *testing.T) {
	mem, bound := tmpfs(t, "size=1m,nr_inodes=64")
	cp := &provider{files: files("m")}
	p := Providers{Content: cp, Backends: map[string]Backend{"b": backend{x: struct{}{}}}}
	var r refreshes
	f, l := newFiller(t, p, &mounter{}, 64<<20, &r)
	var saved []int64
	f.cfg.SaveHeld = func(_ context.Context, _ *api.Volume, n int64) error {
		saved = append(saved, n)
		return nil
	}
	v := &api.Volume{ID: "v1", Backend: "b", TargetPath: mem}
	if err := f.Fill(t.Context(), v); err != nil {
		t.Fatal(err)
	}
	if bound != 1<<20+63*content.InodeCharge {
		t.Fatalf("a tmpfs of size=1m,nr_inodes=64 holds %d, want %d", bound, 1<<20+63*content.InodeCharge)
	}
	if n := l.Held.InUse(); n != bound || !l.Held.Holds("v1") || len(saved) != 0 {
		t.Fatalf("held %d after the write (saved %v), want %d and nothing saved (the publish saves the record)", n, saved, bound)
	}
	for _, data := range []string{"m", "n", "o"} {
		cp.files = files(data)
		if err := f.Refresh(t.Context(), v); err != nil {
			t.Fatal(err)
		}
		if s := readFile(t, mem, "a"); s != data {
			t.Errorf("after a refresh a holds %q, want %q", s, data)
		}
		if n := l.Held.InUse(); n != bound || len(saved) != 0 {
			t.Errorf("held %d after a refresh with %q (saved %v), want %d and nothing saved", n, data, saved, bound)
		}
	}
	disk := t.TempDir()
	if err := f.Fill(t.Context(), &api.Volume{ID: "v2", Backend: "b", TargetPath: disk}); err != nil {
		t.Fatal(err)
	}
	if l.Held.Holds("v2") {
		t.Error("content on a disk is counted")
	}

	// A second volume's first refresh reserves and records it before it
	// writes; one whose record cannot be written is refused, the old content
	// in place, nothing reserved.
	mem2, bound2 := tmpfs(t, "size=2m,nr_inodes=64")
	v3 := &api.Volume{ID: "v3", Backend: "b", TargetPath: mem2}
	f.cfg.SaveHeld = func(context.Context, *api.Volume, int64) error { return errors.New("store down") }
	if err := f.Refresh(t.Context(), v3); err == nil || !strings.Contains(err.Error(), "store down") {
		t.Errorf("a refresh whose charge cannot be recorded: %v, want the store's error", err)
	}
	if l.Held.Holds("v3") || l.Held.InUse() != bound {
		t.Errorf("a refresh that could not record its charge left %d held (v3 %v), want %d", l.Held.InUse(), l.Held.Holds("v3"), bound)
	}
	f.cfg.SaveHeld = func(_ context.Context, _ *api.Volume, n int64) error {
		saved = append(saved, n)
		return nil
	}
	if err := f.Refresh(t.Context(), v3); err != nil {
		t.Fatal(err)
	}
	if n := l.Held.InUse(); n != bound+bound2 || len(saved) != 1 || saved[0] != bound2 {
		t.Errorf("held %d after a second volume's first write (saved %v), want %d, saved [%d]", n, saved, bound+bound2, bound2)
	}

	// What the pod writes into its volume is not the driver's content: a
	// directory named like it, with a sparse 1 TiB file.
	fake := filepath.Join(mem, "..2020_01_01_00_00_00.1")
	if err := os.Mkdir(fake, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(fake, "blob"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(fake, "blob"), 1<<40); err != nil {
		t.Fatal(err)
	}

	// A restart: a new Filler counts what the records say.
	f2, l2 := newFiller(t, p, &mounter{}, 64<<20, &r)
	n1, n0 := bound, int64(0)
	f2.CountHeld(t.Context(), records{recs: []*store.Record{
		{VolumeID: "v1", Backend: "b", Phase: store.PhasePublished, TargetPath: mem, ContentHeld: &n1},
		{VolumeID: "v2", Backend: "b", Phase: store.PhasePublished, TargetPath: disk, ContentHeld: &n0},
		{VolumeID: "gone", Backend: "b", Phase: store.PhasePublished, TargetPath: filepath.Join(mem, "gone")},
		{VolumeID: "intent", Backend: "b", Phase: store.PhasePublishing, TargetPath: mem, ContentHeld: &n1},
	}})
	if n := l2.Held.InUse(); n != bound || !l2.Held.Holds("v1") || l2.Held.Holds("intent") {
		t.Errorf("counted %d at startup (v1 %v, intent %v), want %d of v1 only", n, l2.Held.Holds("v1"), l2.Held.Holds("intent"), bound)
	}
	f3, l3 := newFiller(t, p, &mounter{}, 64<<20, &r)
	f3.CountHeld(t.Context(), records{err: errors.New("store down")})
	if n := l3.Held.InUse(); n != 0 {
		t.Errorf("counted %d from a store that cannot list", n)
	}
}

// A write into a memory-backed filesystem without a size bound (a tmpfs
// mounted size=0) is refused without a pod cgroup to charge: the driver
// would pay for it without bound. A tmpfs larger than the capacity is
// refused InvalidArgument (retrying does not help).
func TestHeldNeedsABound(t *testing.T) {
	unbounded, _ := tmpfs(t, "size=0")
	big, _ := tmpfs(t, "size=8m")
	cp := &provider{files: files("m")}
	p := Providers{Content: cp, Backends: map[string]Backend{"b": backend{x: struct{}{}}}}
	var r refreshes
	f, l := newFiller(t, p, &mounter{}, 4<<20, &r)
	for _, target := range []string{unbounded, big} {
		err := f.Fill(t.Context(), &api.Volume{ID: "v", Backend: "b", TargetPath: target})
		if !errors.Is(err, api.ErrInvalidParams) || errkind.Code(err).String() != "InvalidArgument" {
			t.Errorf("content into %s: %v, want InvalidArgument", target, err)
		}
		if _, err := os.Lstat(filepath.Join(target, "a")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a refused write left a file: %v", err)
		}
	}
	if l.Held.InUse() != 0 {
		t.Errorf("refused writes hold %d", l.Held.InUse())
	}
}

// A write admitted into a memory-backed volume that fails keeps its
// reservation unless it wrote nothing (content.ErrRolledBack): the volume's
// filesystem may hold some of its files, within its size.
func TestHeldAfterFailedWrite(t *testing.T) {
	mem, bound := tmpfs(t, "size=1m,nr_inodes=64")
	cp := &provider{files: files("m")}
	p := Providers{Content: cp, Backends: map[string]Backend{"b": backend{x: struct{}{}}}}
	var r refreshes
	f, l := newFiller(t, p, &mounter{}, 64<<20, &r)
	var saved []int64
	v := &api.Volume{ID: "v1", Backend: "b", TargetPath: mem}

	// Rolled back: the write is cut short (its context ends once admitted).
	ctx, cancel := context.WithCancel(t.Context())
	f.cfg.SaveHeld = func(_ context.Context, _ *api.Volume, n int64) error {
		saved = append(saved, n)
		cancel()
		return nil
	}
	err := f.writeContent(ctx, v, cp.files, true)
	if !errors.Is(err, content.ErrRolledBack) {
		t.Fatalf("write cut short: %v, want ErrRolledBack", err)
	}
	if n := l.Held.InUse(); n != 0 || len(saved) != 2 || saved[0] != bound || saved[1] != 0 {
		t.Errorf("held %d after a rolled back write (saved %v), want 0, saved [%d 0]", n, saved, bound)
	}

	// Replaced, then failed: the reservation stays.
	saved = nil
	f.cfg.SaveHeld = func(_ context.Context, _ *api.Volume, n int64) error {
		saved = append(saved, n)
		return nil
	}
	e := map[string]api.File{"e": {Data: []byte("q")}}
	mounttest.Busy(t, filepath.Join(v.TargetPath, "e"))
	err = f.writeContent(t.Context(), v, e, true)
	if !errors.Is(err, content.ErrReplaced) {
		t.Fatalf("write whose link cannot be made: %v, want ErrReplaced", err)
	}
	if n := l.Held.InUse(); n != bound || len(saved) != 1 || saved[0] != bound {
		t.Errorf("held %d after a write that replaced the content and failed (saved %v), want %d, saved [%d]", n, saved, bound, bound)
	}
}
