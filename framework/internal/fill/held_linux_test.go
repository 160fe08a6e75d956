//go:build linux

package fill

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/content"
	"github.com/ephemera-csi/ephemera/framework/internal/lanes"
)

// busy makes dir impossible to remove (a mount on it) until the test ends.
func busy(t *testing.T, dir string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(t.TempDir(), dir, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind mount on %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmounting %s: %v", dir, err)
		}
	})
}

// A write admitted into a memory-backed volume that fails keeps counted
// what it may have left (content.ErrRolledBack: the old content only;
// otherwise the old and the new), never what the volume's files say.
func TestHeldAfterFailedWrite(t *testing.T) {
	mem := memoryDir(t)
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
	want := content.Charge(cp.files, l.Held.Page())

	// Rolled back: the write is cut short (its context ends once admitted).
	ctx, cancel := context.WithCancel(t.Context())
	f.cfg.SaveHeld = func(_ context.Context, _ *api.Volume, n int64) error {
		saved = append(saved, n)
		cancel()
		return nil
	}
	cp.files = files("n")
	err := f.writeContent(ctx, v, cp.files, true)
	if !errors.Is(err, content.ErrRolledBack) {
		t.Fatalf("write cut short: %v, want ErrRolledBack", err)
	}
	if n := l.Held.InUse(); n != want || len(saved) != 2 || saved[0] != 2*want || saved[1] != want {
		t.Errorf("held %d after a rolled back write (saved %v), want %d, saved [%d %d]", n, saved, want, 2*want, want)
	}

	testHeldNotRolledBack(t, f, l, v, want)
}

// testHeldNotRolledBack goes on from TestHeldAfterFailedWrite: v holds want
// bytes of content "m". A write that swapped its files in and removed the
// old ones before it failed (content.ErrReplaced) holds the new content's
// charge; one that could not remove the old content holds both.
func testHeldNotRolledBack(t *testing.T, f *Filler, l *lanes.Lanes, v *api.Volume, want int64) {
	var saved []int64
	f.cfg.SaveHeld = func(_ context.Context, _ *api.Volume, n int64) error {
		saved = append(saved, n)
		return nil
	}
	e := map[string]api.File{"e": {Data: []byte("q")}}
	charge := content.Charge(e, l.Held.Page())
	busy(t, filepath.Join(v.TargetPath, "e"))
	err := f.writeContent(t.Context(), v, e, true)
	if !errors.Is(err, content.ErrReplaced) {
		t.Fatalf("write whose link cannot be made: %v, want ErrReplaced", err)
	}
	if n := l.Held.InUse(); n != charge || len(saved) != 2 || saved[0] != want+charge || saved[1] != charge {
		t.Errorf("held %d after a write that replaced the content and failed (saved %v), want %d, saved [%d %d]", n, saved, charge, want+charge, charge)
	}

	saved = nil
	old, err := content.Current(v.TargetPath)
	if err != nil {
		t.Fatal(err)
	}
	busy(t, filepath.Join(v.TargetPath, old, "d", "mnt"))
	err = f.writeContent(t.Context(), v, files("p"), true)
	if err == nil || errors.Is(err, content.ErrReplaced) || errors.Is(err, content.ErrRolledBack) {
		t.Fatalf("write that cannot remove the old content: %v", err)
	}
	if n := l.Held.InUse(); n != charge+want || len(saved) != 1 || saved[0] != charge+want {
		t.Errorf("held %d after a write that left the old content (saved %v), want %d, saved [%d]", n, saved, charge+want, charge+want)
	}
}
