package dir

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// afterN is a context that is done after n calls of Err.
type afterN struct {
	context.Context
	n atomic.Int64
}

func (c *afterN) Err() error {
	if c.n.Add(-1) < 0 {
		return context.Canceled
	}
	return nil
}

// count returns the entries below dir.
func count(t *testing.T, dir string) int {
	t.Helper()
	n := 0
	err := filepath.WalkDir(dir, func(_ string, _ os.DirEntry, err error) error {
		n++
		return err
	})
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// removeAll stops once its context is done, having removed only part of a
// large tree, and the next call removes the rest: a pod's million files never
// hold the volume's lock past its request's deadline.
func TestRemoveAllStopsWhenContextDone(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "vol")
	for i := range 10 {
		sub := filepath.Join(dir, fmt.Sprintf("d%d", i))
		if err := os.MkdirAll(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		for j := range 300 {
			if err := os.WriteFile(filepath.Join(sub, fmt.Sprintf("f%d", j)), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := os.Symlink("/", filepath.Join(dir, "root")); err != nil {
		t.Fatal(err)
	}
	before := count(t, dir)
	ctx := &afterN{Context: t.Context()}
	ctx.n.Store(3) // the first look, and two batches of checkEvery
	if err := removeAll(ctx, dir); !errors.Is(err, context.Canceled) {
		t.Fatalf("removeAll with its context done: %v, want Canceled", err)
	}
	left := count(t, dir)
	if left == 0 || left >= before || before-left > 3*checkEvery {
		t.Fatalf("removeAll stopped with %d of %d entries left, want it to stop after about %d", left, before, 2*checkEvery)
	}
	if err := removeAll(t.Context(), dir); err != nil {
		t.Fatalf("second removeAll: %v", err)
	}
	if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s left after removeAll: %v", dir, err)
	}
}

// A tree 4,000 levels deep, made as a pod makes it (relative mkdir), is
// removed whole; a link in it is removed, not followed.
func TestRemoveAllDeep(t *testing.T) {
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "keep"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "vol")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	for range 4000 {
		if err := unix.Mkdirat(fd, "d", 0o755); err != nil {
			t.Fatal(err)
		}
		next, err := unix.Openat(fd, "d", unix.O_RDONLY|unix.O_DIRECTORY, 0)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		fd = next
	}
	if err := unix.Symlinkat(outside, fd, "out"); err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	if err := removeAll(t.Context(), dir); err != nil {
		t.Fatalf("removeAll of a tree 4,000 deep: %v", strings.ReplaceAll(err.Error(), "d/", ""))
	}
	if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s left: %v", dir, err)
	}
	if _, err := os.Stat(filepath.Join(outside, "keep")); err != nil {
		t.Fatalf("the link's target was removed: %v", err)
	}
}
