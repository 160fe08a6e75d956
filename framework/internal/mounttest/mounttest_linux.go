package mounttest

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// Busy makes dir (made if missing) impossible to remove, a bind mount on it,
// until the test ends.
func Busy(t testing.TB, dir string) {
	t.Helper()
	needRoot(t)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(t.TempDir(), dir, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind mount on %s: %v", dir, err)
	}
	t.Cleanup(func() { unmount(t, dir) })
}

// Tmpfs mounts a tmpfs with options opts ("size=1m,nr_inodes=64") on a
// temporary directory until the test ends, and returns the directory.
func Tmpfs(t testing.TB, opts string) string {
	t.Helper()
	needRoot(t)
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, opts); err != nil {
		t.Fatalf("mounting a tmpfs (%s): %v", opts, err)
	}
	t.Cleanup(func() { unmount(t, dir) })
	return dir
}

func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount")
	}
}

func unmount(t testing.TB, dir string) {
	t.Helper()
	if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
		t.Errorf("unmounting %s: %v", dir, err)
	}
}
