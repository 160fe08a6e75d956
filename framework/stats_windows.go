//go:build windows

package framework

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/windows"
)

// fsUsage is what NodeGetVolumeStats reports for one volume. Windows has no
// inode counts: inodesUsed is the number of files and directories walked, the
// totals are 0.
type fsUsage struct {
	bytesTotal, bytesAvail, bytesUsed   int64
	inodesTotal, inodesFree, inodesUsed int64
}

// withSep returns p with one trailing backslash, which GetDiskFreeSpaceEx and
// GetVolumePathName want for a directory.
func withSep(p string) string { return strings.TrimRight(p, `\/`) + `\` }

// filesystemUsage reads the volume that holds path (GetDiskFreeSpaceEx follows
// the link at a target to the directory, and a folder mount point to its
// volume): capacity, space available to the caller (quotas applied) and space
// in use.
func filesystemUsage(_ *os.Root, path string) (fsUsage, error) {
	p, err := windows.UTF16PtrFromString(withSep(path))
	if err != nil {
		return fsUsage{}, err
	}
	var avail, total, free uint64
	if err := windows.GetDiskFreeSpaceEx(p, &avail, &total, &free); err != nil {
		return fsUsage{}, &fs.PathError{Op: "GetDiskFreeSpaceEx", Path: path, Err: err}
	}
	return fsUsage{bytesTotal: clampInt64(total), bytesAvail: clampInt64(avail), bytesUsed: clampInt64(subFloor(total, free))}, nil
}

// directoryUsage measures a linked directory. When the directory is the root of
// a volume of its own (a VHDX mounted in a folder) the whole volume is the
// pod's and the filesystem figures are exact, so no walk is needed. Otherwise
// the capacity and free space are the host volume's and the usage is a walk
// of the directory: logical file sizes (not cluster-rounded; a file's
// hard links are counted once per link), one inode per entry.
func directoryUsage(_ *os.Root, path string) (fsUsage, error) {
	u, err := filesystemUsage(nil, path)
	if err != nil {
		return fsUsage{}, err
	}
	dir := path
	if d, err := filepath.EvalSymlinks(path); err == nil {
		dir = d
	}
	if isVolumeRoot(dir) {
		return u, nil
	}
	var used, entries int64
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // vanished while walking: a pod is writing
		}
		entries++
		if d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				used = addSat(used, fi.Size()) // sparse files can claim up to 2^63-1 bytes each
			}
		}
		return nil
	})
	u.bytesUsed, u.inodesUsed = used, entries
	return u, err
}

// isVolumeRoot reports whether dir is the root of a volume (a drive root or a
// folder mount point).
func isVolumeRoot(dir string) bool {
	p, err := windows.UTF16PtrFromString(withSep(dir))
	if err != nil {
		return false
	}
	buf := make([]uint16, windows.MAX_LONG_PATH)
	if err := windows.GetVolumePathName(p, &buf[0], uint32(len(buf))); err != nil {
		return false
	}
	root := windows.UTF16ToString(buf)
	return strings.EqualFold(strings.TrimRight(root, `\`), strings.TrimRight(filepath.Clean(dir), `\`))
}
