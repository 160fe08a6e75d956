//go:build linux

package framework

import (
	"io/fs"
	"math"
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
	bs := uint64(st.Bsize)
	return fsUsage{
		bytesTotal:  mulSat(st.Blocks, bs),
		bytesAvail:  mulSat(st.Bavail, bs),
		bytesUsed:   mulSat(st.Blocks-min(st.Bfree, st.Blocks), bs),
		inodesTotal: sat(st.Files),
		inodesFree:  sat(st.Ffree),
		inodesUsed:  sat(st.Files - min(st.Ffree, st.Files)),
	}, nil
}

// sat converts n to int64, saturating at math.MaxInt64.
func sat(n uint64) int64 {
	if n > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(n)
}

// mulSat is a*b as an int64, saturating at math.MaxInt64 (an 8 EiB tmpfs
// reports more blocks than fit).
func mulSat(a, b uint64) int64 {
	if a != 0 && b > math.MaxInt64/a {
		return math.MaxInt64
	}
	return sat(a * b)
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
		used = min(used+st.Blocks*512, math.MaxInt64/2)
		inodes++
		return nil
	})
	u.bytesUsed, u.inodesUsed = used, inodes
	return u, err
}
