//go:build windows

package stats

import (
	"context"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/windows"
)

// Usage is what NodeGetVolumeStats reports for one volume. Windows has no
// inode counts: InodesUsed is the number of files and directories walked, the
// totals are 0.
type Usage struct {
	BytesTotal, BytesAvail, BytesUsed   int64
	InodesTotal, InodesFree, InodesUsed int64
}

// withSep returns p with one trailing backslash, which GetDiskFreeSpaceEx and
// GetVolumePathName want for a directory.
func withSep(p string) string { return strings.TrimRight(p, `\/`) + `\` }

// Filesystem reads the volume that holds path (GetDiskFreeSpaceEx follows
// the link at a target to the directory, and a folder mount point to its
// volume): capacity, space available to the caller (quotas applied) and space
// in use.
func Filesystem(_ *os.Root, path string) (Usage, error) {
	p, err := windows.UTF16PtrFromString(withSep(path))
	if err != nil {
		return Usage{}, err
	}
	var avail, total, free uint64
	if err := windows.GetDiskFreeSpaceEx(p, &avail, &total, &free); err != nil {
		return Usage{}, &fs.PathError{Op: "GetDiskFreeSpaceEx", Path: path, Err: err}
	}
	return Usage{BytesTotal: clampInt64(total), BytesAvail: clampInt64(avail), BytesUsed: clampInt64(subFloor(total, free))}, nil
}

// OwnFilesystem reports whether the linked directory at path is the root of
// a volume of its own (a VHDX mounted in a folder): the whole volume is then
// the pod's, the filesystem figures are exact, and no walk is needed.
// Otherwise the capacity and free space are the host volume's and the usage
// is a walk of the directory (Walk).
func OwnFilesystem(path string) bool {
	dir := path
	if d, err := filepath.EvalSymlinks(path); err == nil {
		dir = d
	}
	return isVolumeRoot(dir)
}

// Walk counts a linked directory's own usage (see walkTree): logical
// file sizes (not cluster-rounded; a file's hard links are counted once per
// link), one inode per entry. Each directory is opened relative to its parent
// as an os.Root, so the walk never leaves r; links and junctions (reparse
// points) are listed, never entered. path is for messages.
func Walk(ctx context.Context, r *os.Root, path string, lim Limits, visited func(context.Context, int64)) (Result, error) {
	root, err := openWindowsDir(r, ".")
	if err != nil {
		return Result{}, err
	}
	return walkTree(ctx, root, walkEntry{dir: true}, lim, visited), nil
}

// windowsDir is one directory of a walk.
type windowsDir struct {
	r *os.Root
	f *os.File
}

// openWindowsDir opens the directory name of r as a root of its own.
func openWindowsDir(r *os.Root, name string) (*windowsDir, error) {
	cr, err := r.OpenRoot(name)
	if err != nil {
		return nil, err
	}
	f, err := cr.Open(".")
	if err != nil {
		cr.Close()
		return nil, err
	}
	return &windowsDir{r: cr, f: f}, nil
}

func (d *windowsDir) read(n int) ([]walkEntry, error) {
	des, err := d.f.ReadDir(n)
	ents := make([]walkEntry, 0, len(des))
	for _, de := range des {
		// IsDir is false for a symbolic link or a junction to a directory.
		e := walkEntry{name: de.Name(), dir: de.IsDir()}
		if de.Type().IsRegular() {
			if fi, err := de.Info(); err == nil {
				e.bytes = fi.Size() // sparse files can claim up to 2^63-1 bytes each
			}
		}
		ents = append(ents, e)
	}
	if len(ents) == 0 && err == nil {
		err = io.EOF
	}
	return ents, err
}

func (d *windowsDir) open(e walkEntry) (walkDir, error) {
	return openWindowsDir(d.r, e.name)
}

func (d *windowsDir) close() error {
	d.f.Close()
	return d.r.Close()
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

// MemoryBacked reports whether the volume r is on a filesystem whose pages
// are memory: never on Windows.
func MemoryBacked(*os.Root) (bool, error) { return false, nil }

// MemoryUsed is what the memory-backed filesystem of the volume r uses:
// none on Windows.
func MemoryUsed(*os.Root) (mem bool, bytes, inodes int64, err error) { return false, 0, 0, nil }

// MemoryBound is what the memory-backed filesystem of the volume r may
// hold: not known here.
func MemoryBound(*os.Root) (mem bool, bytes, inodes int64, err error) { return false, 0, 0, nil }
