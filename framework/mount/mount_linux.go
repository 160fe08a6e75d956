//go:build linux

package mount

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ephemera-csi/ephemera/api"
)

// maxUnmounts bounds the Unmount loop; older drivers (or crashes between a mount
// and its record) can leave several mounts stacked on one target.
const maxUnmounts = 64

// publishFlags are set on every published mount: a volume must never carry setuid
// binaries or device nodes into a pod.
const publishFlags = unix.MS_NOSUID | unix.MS_NODEV

// New returns the Linux implementation. It calls the kernel directly through
// golang.org/x/sys/unix and needs CAP_SYS_ADMIN for Mount, SetReadOnly and Unmount,
// Linux 5.6 for openat2(2) and Linux 5.8 for STATX_ATTR_MOUNT_ROOT (older kernels
// fall back to comparing mount IDs or devices with the parent).
func New() Interface { return &linuxMounter{} }

type linuxMounter struct{}

// openParent opens the directory that will hold target's last component,
// resolving every component below root with openat2(2) so that no symbolic link
// is followed and nothing outside root is reached. root itself is opened
// normally: an operator may configure it as a symlink.
func openParent(root, target string) (fd int, base string, err error) {
	parent, base, err := splitBeneath(root, target)
	if err != nil {
		return -1, "", err
	}
	rootfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, "", &fs.PathError{Op: "open", Path: root, Err: err}
	}
	defer unix.Close(rootfd)
	how := unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	}
	for range 8 {
		fd, err = unix.Openat2(rootfd, parent, &how)
		if err != unix.EAGAIN && err != unix.EINTR { // EAGAIN: a concurrent rename; retry
			break
		}
	}
	switch {
	case err == nil:
		return fd, base, nil
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV):
		return -1, "", fmt.Errorf("parent of %q below %q: %w (%v)", target, root, ErrSymlink, err)
	case errors.Is(err, unix.ENOSYS):
		return -1, "", fmt.Errorf("openat2 %q: %w (Linux 5.6 or later is required)", filepath.Join(root, parent), err)
	default:
		return -1, "", &fs.PathError{Op: "openat2", Path: filepath.Join(root, parent), Err: err}
	}
}

func (m *linuxMounter) MakeTarget(root, target string) error {
	dirfd, base, err := openParent(root, target)
	if err != nil {
		return err
	}
	defer unix.Close(dirfd)
	err = unix.Mkdirat(dirfd, base, 0o750)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EEXIST) {
		return &fs.PathError{Op: "mkdir", Path: target, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &fs.PathError{Op: "stat", Path: target, Err: err}
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return nil
	case unix.S_IFLNK:
		return fmt.Errorf("target %q: %w", target, ErrSymlink)
	default:
		return &fs.PathError{Op: "mkdir", Path: target, Err: unix.ENOTDIR}
	}
}

func (m *linuxMounter) RemoveTarget(root, target string) error {
	dirfd, base, err := openParent(root, target)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(dirfd)
	err = unix.Unlinkat(dirfd, base, unix.AT_REMOVEDIR)
	if errors.Is(err, unix.ENOTDIR) {
		// Not a directory. Remove it only if it is a symbolic link (the link
		// itself, never what it points to); a file is left alone.
		var st unix.Stat_t
		if serr := unix.Fstatat(dirfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); serr == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
			err = unix.Unlinkat(dirfd, base, 0)
		}
	}
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	return &fs.PathError{Op: "remove", Path: target, Err: err}
}

func (m *linuxMounter) Mount(src api.Source, target string) error {
	if src.IsDir() {
		if err := unix.Mount(src.Path, target, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind mount %q on %q: %w", src.Path, target, err)
		}
		// The flags of a new bind mount are those of the source mount; a second
		// call adds nosuid and nodev and keeps the rest (some may be locked).
		flags, err := mountFlags(target)
		if err == nil {
			err = unix.Mount("", target, "", unix.MS_REMOUNT|unix.MS_BIND|flags|publishFlags, "")
		}
		if err != nil {
			_ = unix.Unmount(target, unix.UMOUNT_NOFOLLOW) // roll back the bind
			return fmt.Errorf("remount bind mount %q nosuid,nodev: %w", target, err)
		}
		return nil
	}
	data := strings.Join(src.Options, ",")
	if err := unix.Mount(src.Path, target, src.FSType, publishFlags, data); err != nil {
		return fmt.Errorf("mount %s %q on %q: %w", src.FSType, src.Path, target, err)
	}
	return nil
}

func (m *linuxMounter) SetReadOnly(target string, readOnly bool) error {
	flags, err := mountFlags(target)
	if err != nil {
		return err
	}
	// MS_REMOUNT|MS_BIND changes the flags of this mount only, for a bind mount
	// and for a filesystem mounted here alike.
	flags |= unix.MS_REMOUNT | unix.MS_BIND
	if readOnly {
		flags |= unix.MS_RDONLY
	}
	if err := unix.Mount("", target, "", flags, ""); err != nil {
		return fmt.Errorf("remount %q (read-only %v): %w", target, readOnly, err)
	}
	return nil
}

// stToMS maps the statfs f_flags a remount must carry over to mount(2) flags. The
// mount flags nosuid, nodev, noexec and the atime flags can be locked (in a user
// namespace); a remount that drops them fails with EPERM. Synchronous is a
// superblock flag a superblock remount would otherwise clear.
var stToMS = [...]struct{ st, ms uintptr }{
	{unix.ST_NOSUID, unix.MS_NOSUID},
	{unix.ST_NODEV, unix.MS_NODEV},
	{unix.ST_NOEXEC, unix.MS_NOEXEC},
	{unix.ST_NOATIME, unix.MS_NOATIME},
	{unix.ST_NODIRATIME, unix.MS_NODIRATIME},
	{unix.ST_RELATIME, unix.MS_RELATIME},
	{unix.ST_SYNCHRONOUS, unix.MS_SYNCHRONOUS},
	{0x2000 /* ST_NOSYMFOLLOW */, unix.MS_NOSYMFOLLOW},
}

// mountFlags returns the mount(2) flags to preserve on a remount of target.
func mountFlags(target string) (uintptr, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(target, &st); err != nil {
		return 0, &fs.PathError{Op: "statfs", Path: target, Err: err}
	}
	var flags uintptr
	for _, f := range stToMS {
		if uintptr(st.Flags)&f.st != 0 {
			flags |= f.ms
		}
	}
	return flags, nil
}

func (m *linuxMounter) IsMountPoint(target string) (bool, error) {
	var stx unix.Statx_t
	err := unix.Statx(unix.AT_FDCWD, target, unix.AT_SYMLINK_NOFOLLOW|unix.AT_NO_AUTOMOUNT,
		unix.STATX_BASIC_STATS|unix.STATX_MNT_ID, &stx)
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, &fs.PathError{Op: "statx", Path: target, Err: err}
	}
	if stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 {
		return stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0, nil
	}
	return mountPointByParent(target, &stx)
}

// mountPointByParent is IsMountPoint for kernels before 5.8, which do not report
// STATX_ATTR_MOUNT_ROOT: it compares target with its parent. A mount ID is exact;
// st_dev misses a bind mount within one filesystem.
func mountPointByParent(target string, stx *unix.Statx_t) (bool, error) {
	if stx.Mode&unix.S_IFMT == unix.S_IFLNK {
		return false, nil
	}
	if filepath.Clean(target) == "/" {
		return true, nil
	}
	var parent unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, filepath.Dir(target), unix.AT_NO_AUTOMOUNT,
		unix.STATX_BASIC_STATS|unix.STATX_MNT_ID, &parent); err != nil {
		return false, &fs.PathError{Op: "statx", Path: filepath.Dir(target), Err: err}
	}
	if stx.Mask&parent.Mask&unix.STATX_MNT_ID != 0 {
		return stx.Mnt_id != parent.Mnt_id, nil
	}
	return stx.Dev_major != parent.Dev_major || stx.Dev_minor != parent.Dev_minor, nil
}

func (m *linuxMounter) Unmount(target string) error {
	for range maxUnmounts {
		mounted, err := m.IsMountPoint(target)
		if err != nil || !mounted {
			return err
		}
		err = unix.Unmount(target, unix.UMOUNT_NOFOLLOW)
		switch {
		case err == nil, errors.Is(err, unix.EINTR):
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil
		default: // EBUSY included: the caller retries later
			return fmt.Errorf("unmount %q: %w", target, err)
		}
	}
	return fmt.Errorf("unmount %q: still a mount point after %d unmounts", target, maxUnmounts)
}
