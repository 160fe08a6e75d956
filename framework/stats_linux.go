//go:build linux

package framework

import (
	"io/fs"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// fsUsage is what NodeGetVolumeStats reports for one volume.
type fsUsage struct {
	bytesTotal, bytesAvail, bytesUsed   int64
	inodesTotal, inodesFree, inodesUsed int64
}

// filesystemUsage reads the filesystem of the published volume r (tmpfs, a loop
// device): fstatfs is exact and O(1). path is for messages.
func filesystemUsage(r *os.Root, path string) (fsUsage, error) {
	f, err := r.Open(".")
	if err != nil {
		return fsUsage{}, err
	}
	defer f.Close()
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
		return fsUsage{}, &fs.PathError{Op: "fstatfs", Path: path, Err: err}
	}
	return statfsUsage(uint64(st.Blocks), uint64(st.Bfree), uint64(st.Bavail), uint64(st.Files), uint64(st.Ffree), int64(st.Bsize)), nil
}

// statfsUsage converts statfs counts to bytes and inodes, saturating at
// math.MaxInt64: a tmpfs of the largest size a pod can ask for (2^63-2 bytes,
// rounded up to pages) has 2^51 blocks of 4KiB, 2^63 bytes.
func statfsUsage(blocks, bfree, bavail, files, ffree uint64, bsize int64) fsUsage {
	return fsUsage{
		bytesTotal:  mulSat(blocks, bsize),
		bytesAvail:  mulSat(bavail, bsize),
		bytesUsed:   mulSat(subFloor(blocks, bfree), bsize),
		inodesTotal: clampInt64(files),
		inodesFree:  clampInt64(ffree),
		inodesUsed:  clampInt64(subFloor(files, ffree)),
	}
}

// directoryUsage measures a bind-mounted directory: the filesystem's capacity
// and free space (shared with the rest of that filesystem) and the directory's
// own usage, counted like du (allocated blocks, one inode per entry, hard links
// once). The walk stays inside r: links are listed, never followed.
func directoryUsage(r *os.Root, path string) (fsUsage, error) {
	u, err := filesystemUsage(r, path)
	if err != nil {
		return fsUsage{}, err
	}
	var used, inodes int64
	seen := map[uint64]bool{}
	err = fs.WalkDir(r.FS(), ".", func(p string, d fs.DirEntry, err error) error {
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
		used = addSat(used, mulSat(uint64(max(st.Blocks, 0)), 512))
		inodes++
		return nil
	})
	u.bytesUsed, u.inodesUsed = used, inodes
	return u, err
}
