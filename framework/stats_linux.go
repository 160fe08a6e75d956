//go:build linux

package framework

import (
	"io/fs"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// fsUsage is what NodeGetVolumeStats reports for one volume.
type fsUsage struct {
	bytesTotal, bytesAvail, bytesUsed   int64
	inodesTotal, inodesFree, inodesUsed int64
}

// filesystemUsage reads a filesystem mounted at path (tmpfs, a loop device):
// statfs is exact and O(1).
func filesystemUsage(path string) (fsUsage, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return fsUsage{}, err
	}
	bs := int64(st.Bsize)
	return fsUsage{
		bytesTotal:  int64(st.Blocks) * bs,
		bytesAvail:  int64(st.Bavail) * bs,
		bytesUsed:   (int64(st.Blocks) - int64(st.Bfree)) * bs,
		inodesTotal: int64(st.Files),
		inodesFree:  int64(st.Ffree),
		inodesUsed:  int64(st.Files) - int64(st.Ffree),
	}, nil
}

// directoryUsage measures a bind-mounted directory: the filesystem's capacity
// and free space (shared with the rest of that filesystem) and the directory's
// own usage, counted like du (allocated blocks, one inode per entry, hard links
// once).
func directoryUsage(path string) (fsUsage, error) {
	u, err := filesystemUsage(path)
	if err != nil {
		return fsUsage{}, err
	}
	var used, inodes int64
	seen := map[uint64]bool{}
	err = filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // vanished while walking: a pod is writing
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return nil
		}
		if st.Nlink > 1 && !d.IsDir() {
			if seen[st.Ino] {
				return nil
			}
			seen[st.Ino] = true
		}
		used += st.Blocks * 512
		inodes++
		return nil
	})
	u.bytesUsed, u.inodesUsed = used, inodes
	return u, err
}
