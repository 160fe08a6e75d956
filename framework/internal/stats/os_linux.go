//go:build linux

package stats

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

// Usage is what NodeGetVolumeStats reports for one volume.
type Usage struct {
	BytesTotal, BytesAvail, BytesUsed   int64
	InodesTotal, InodesFree, InodesUsed int64
}

// Filesystem reads the filesystem of the published volume r (tmpfs, a loop
// device): fstatfs is exact and O(1). path is for messages.
func Filesystem(r *os.Root, path string) (Usage, error) {
	f, err := r.Open(".")
	if err != nil {
		return Usage{}, err
	}
	defer f.Close()
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
		return Usage{}, &fs.PathError{Op: "fstatfs", Path: path, Err: err}
	}
	return statfsUsage(uint64(st.Blocks), uint64(st.Bfree), uint64(st.Bavail), uint64(st.Files), uint64(st.Ffree), int64(st.Bsize)), nil
}

// statfsUsage converts statfs counts to bytes and inodes, saturating at
// math.MaxInt64: a tmpfs of the largest size a pod can ask for (2^63-2 bytes,
// rounded up to pages) has 2^51 blocks of 4KiB, 2^63 bytes.
func statfsUsage(blocks, bfree, bavail, files, ffree uint64, bsize int64) Usage {
	return Usage{
		BytesTotal:  mulSat(blocks, bsize),
		BytesAvail:  mulSat(bavail, bsize),
		BytesUsed:   mulSat(subFloor(blocks, bfree), bsize),
		InodesTotal: clampInt64(files),
		InodesFree:  clampInt64(ffree),
		InodesUsed:  clampInt64(subFloor(files, ffree)),
	}
}

// OwnFilesystem reports whether the directory at path is the root of a
// filesystem of its own, whose statfs figures are then exact: never for a
// directory volume on Linux, which is a bind mount of a directory.
func OwnFilesystem(string) bool { return false }

// Walk counts a bind-mounted directory's own usage like du -x (see
// walkTree): allocated blocks, one inode per entry, hard links once. It walks
// by file descriptor, each directory opened relative to its parent
// (openat(2) with O_NOFOLLOW|O_DIRECTORY) and each entry stat'ed relative to
// its directory (fstatat(2) with AT_SYMLINK_NOFOLLOW), so the cost of an
// entry does not grow with its depth, links are never followed, and the walk
// never leaves r; it does not enter another mount (another device or mount
// ID). The directories open are the ancestors of the one being read, at most
// lim.MaxDepth. path is for messages.
func Walk(ctx context.Context, r *os.Root, path string, lim Limits, visited func(context.Context, int64)) (Result, error) {
	f, err := r.Open(".")
	if err != nil {
		return Result{}, err
	}
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	f.Close()
	if err != nil {
		return Result{}, &fs.PathError{Op: "dup", Path: path, Err: err}
	}
	var st unix.Statx_t
	if err := statxFd(fd, &st); err != nil {
		unix.Close(fd)
		return Result{}, &fs.PathError{Op: "statx", Path: path, Err: err}
	}
	self := walkEntry{dir: true, bytes: mulSat(st.Blocks, 512), dev: unix.Mkdev(st.Dev_major, st.Dev_minor), ino: st.Ino}
	root := &linuxDir{fd: fd, buf: make([]byte, 8<<10), mnt: st.Mnt_id, hasMnt: st.Mask&unix.STATX_MNT_ID != 0}
	return walkTree(ctx, root, self, lim, visited), nil
}

// linuxDir is one directory of a walk, open by fd.
type linuxDir struct {
	fd     int
	buf    []byte // getdents buffer, shared by the walk's directories
	eof    bool
	mnt    uint64 // mount ID of the walk's root
	hasMnt bool
}

// read lists the entries of one getdents(2) call (at most a few hundred
// names in its buffer), stat'ed without following links. n is ignored.
func (d *linuxDir) read(int) ([]walkEntry, error) {
	for !d.eof {
		n, err := unix.Getdents(d.fd, d.buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			d.eof = true
			break
		}
		_, _, names := unix.ParseDirent(d.buf[:n], -1, nil)
		ents := make([]walkEntry, 0, len(names))
		for _, name := range names {
			var st unix.Stat_t
			if err := unix.Fstatat(d.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				continue // vanished while walking: a pod is writing
			}
			ents = append(ents, walkEntry{
				name:  name,
				dir:   st.Mode&unix.S_IFMT == unix.S_IFDIR,
				bytes: mulSat(uint64(max(st.Blocks, 0)), 512),
				dev:   uint64(st.Dev),
				ino:   st.Ino,
				links: uint64(st.Nlink),
			})
		}
		if len(ents) > 0 {
			return ents, nil
		}
	}
	return nil, io.EOF
}

// open opens the directory e relative to d, refusing a link (O_NOFOLLOW), a
// non-directory, and anything but the very directory read stat'ed (a pod
// renaming while the walk runs) or one of another mount.
func (d *linuxDir) open(e walkEntry) (walkDir, error) {
	var fd int
	var err error
	for {
		fd, err = unix.Openat(d.fd, e.name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	var st unix.Statx_t
	if err := statxFd(fd, &st); err != nil {
		unix.Close(fd)
		return nil, err
	}
	if unix.Mkdev(st.Dev_major, st.Dev_minor) != e.dev || st.Ino != e.ino ||
		d.hasMnt && st.Mask&unix.STATX_MNT_ID != 0 && st.Mnt_id != d.mnt {
		unix.Close(fd)
		return nil, errWalkChanged
	}
	return &linuxDir{fd: fd, buf: d.buf, mnt: d.mnt, hasMnt: d.hasMnt}, nil
}

func (d *linuxDir) close() error { return unix.Close(d.fd) }

// errWalkChanged is a directory that changed between its listing and its
// opening, or lies on another mount: it is not entered.
var errWalkChanged = errors.New("directory changed or on another mount")

// statxFd stats the file open at fd, with its mount ID where the kernel has
// one (5.8).
func statxFd(fd int, st *unix.Statx_t) error {
	for {
		err := unix.Statx(fd, "", unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW, unix.STATX_BASIC_STATS|unix.STATX_MNT_ID, st)
		if err != unix.EINTR {
			return err
		}
	}
}

// MemoryBacked reports whether the volume r is on a filesystem whose pages
// are memory (tmpfs, ramfs): what is written there is charged to the
// writer's memory cgroup until it is removed.
func MemoryBacked(r *os.Root) (bool, error) {
	_, mem, err := memoryStatfs(r)
	return mem, err
}

// MemoryUsed is what the kernel says the memory-backed filesystem of the
// volume r uses (fstatfs: its used blocks in bytes, and its inodes besides
// the root), and whether it is memory-backed at all (false: 0, 0). It reads
// no name and no size of the files in it, which the pod may write; a sparse
// file takes only its pages.
func MemoryUsed(r *os.Root) (mem bool, bytes, inodes int64, err error) {
	st, mem, err := memoryStatfs(r)
	if err != nil || !mem {
		return false, 0, 0, err
	}
	if st.Blocks > st.Bfree {
		bytes = int64(st.Blocks-st.Bfree) * st.Bsize
	}
	if st.Files > st.Ffree+1 {
		inodes = int64(st.Files - st.Ffree - 1)
	}
	return true, bytes, inodes, nil
}

// MemoryBound is what the kernel lets the memory-backed filesystem of the
// volume r hold (fstatfs: its size in bytes, and its inodes besides the
// root: tmpfs's size= and nr_inodes), and whether it is memory-backed at
// all (false: 0, 0). Like MemoryUsed it reads nothing the pod may write.
func MemoryBound(r *os.Root) (mem bool, bytes, inodes int64, err error) {
	st, mem, err := memoryStatfs(r)
	if err != nil || !mem {
		return false, 0, 0, err
	}
	bytes = int64(st.Blocks) * st.Bsize
	if st.Files > 1 {
		inodes = int64(st.Files - 1)
	}
	return true, bytes, inodes, nil
}

// memoryStatfs is the fstatfs of the volume r, and whether its filesystem
// is memory-backed (tmpfs, ramfs).
func memoryStatfs(r *os.Root) (st unix.Statfs_t, mem bool, err error) {
	f, err := r.Open(".")
	if err != nil {
		return st, false, err
	}
	defer f.Close()
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
		return st, false, &fs.PathError{Op: "fstatfs", Path: r.Name(), Err: err}
	}
	return st, st.Type == unix.TMPFS_MAGIC || st.Type == unix.RAMFS_MAGIC, nil
}
