//go:build linux

package tmpfs_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/drivers/tmpfs"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/mount"
)

// requireRoot skips t unless it may mount filesystems.
func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounts tmpfs: needs root")
	}
}

// mountVolume validates v and creates it with b, then mounts the Source as the
// framework does (mount.New(): nosuid, nodev) at a target below a temporary
// kubelet root, and returns the target. The mount is undone at cleanup, also
// when the test fails.
func mountVolume(t testing.TB, b *tmpfs.Backend, v *api.Volume) string {
	t.Helper()
	requireRoot(t)
	if err := framework.ValidateVolume(b, v); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	src, err := b.Create(t.Context(), v)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	root, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(root, "mount")
	m := mount.New()
	if err := m.MakeTarget(root, target); err != nil {
		t.Fatal(err)
	}
	// Runs before t.TempDir's removal (cleanups run last first).
	t.Cleanup(func() {
		if err := m.Unmount(root, target); err != nil {
			t.Errorf("cleanup: unmounting %s: %v; detaching it", target, err)
			_ = unix.Unmount(target, unix.MNT_DETACH)
		}
		if err := m.RemoveTarget(root, target); err != nil {
			t.Errorf("cleanup: removing %s: %v", target, err)
		}
	})
	if err := m.Mount(root, src, target); err != nil {
		t.Fatalf("mounting %+v: %v", src, err)
	}
	return target
}

// createFile creates an empty file.
func createFile(path string) error {
	fd, err := unix.Open(path, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return &os.PathError{Op: "create", Path: path, Err: err}
	}
	return unix.Close(fd)
}

// A volume without "nr_inodes" gets the default derived from its size (one inode
// per 4KiB, at least 1024) as the kernel's inode limit: statfs reports it, that
// many inodes (the root directory is one) can be used, and one more file fails
// with ENOSPC.
func TestDefaultNrInodesEnforced(t *testing.T) {
	for _, c := range []struct {
		size int64
		want uint64
	}{
		{size: 4 << 20, want: 1024},  // 4Mi/4Ki
		{size: 1 << 20, want: 1024},  // the floor
		{size: 16 << 20, want: 4096}, // 16Mi/4Ki
	} {
		t.Run(fmt.Sprintf("size=%d", c.size), func(t *testing.T) {
			v := &api.Volume{ID: api.VolumeHandle("0b0c8a52-7f4e-4d8b-9c55-4a2f3e1d0c9b", "scratch"), Name: "scratch", Size: c.size}
			dir := mountVolume(t, newBackend(t, tmpfs.Options{}), v)
			var st unix.Statfs_t
			if err := unix.Statfs(dir, &st); err != nil {
				t.Fatal(err)
			}
			if st.Files != c.want {
				t.Fatalf("statfs: f_files = %d, want nr_inodes = %d", st.Files, c.want)
			}
			// The root directory takes one inode; fill the others.
			free := st.Ffree
			if free != c.want-1 {
				t.Fatalf("statfs: f_ffree = %d on a new volume, want %d", free, c.want-1)
			}
			for i := range free {
				if err := createFile(filepath.Join(dir, fmt.Sprintf("f%d", i))); err != nil {
					t.Fatalf("file %d of %d: %v", i+1, free, err)
				}
			}
			err := createFile(filepath.Join(dir, "one-more"))
			if !errors.Is(err, unix.ENOSPC) {
				t.Fatalf("file %d with %d inodes: %v, want ENOSPC", free+1, c.want, err)
			}
			if err := unix.Mkdir(filepath.Join(dir, "one-more-dir"), 0o700); !errors.Is(err, unix.ENOSPC) {
				t.Fatalf("directory with %d inodes in use: %v, want ENOSPC", c.want, err)
			}
		})
	}
}
