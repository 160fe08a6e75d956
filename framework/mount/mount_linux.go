//go:build linux

package mount

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/volume"
)

// maxUnmounts bounds the Unmount loop; older drivers (or crashes between a mount
// and its record) can leave several mounts stacked on one target.
const maxUnmounts = 64

// publishAttrs are set on every published mount: a volume must never carry
// setuid binaries or device nodes into a pod.
const publishAttrs = unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV

// optionAttrs are the MOUNT_ATTR_* of SafeOptions. The atime modes are values
// of the MOUNT_ATTR__ATIME field (relatime is 0).
var optionAttrs = map[string]uint64{
	"noexec":      unix.MOUNT_ATTR_NOEXEC,
	"noatime":     unix.MOUNT_ATTR_NOATIME,
	"nodiratime":  unix.MOUNT_ATTR_NODIRATIME,
	"relatime":    unix.MOUNT_ATTR_RELATIME,
	"strictatime": unix.MOUNT_ATTR_STRICTATIME,
	"nosymfollow": unix.MOUNT_ATTR_NOSYMFOLLOW,
}

// attrsOf returns the attributes of a published mount of src: publishAttrs and
// src.MountOptions. clr has MOUNT_ATTR__ATIME when an atime mode is set
// (mount_setattr needs it to change the mode).
func attrsOf(src api.Source) (set, clr uint64, err error) {
	if err := CheckOptions(src.MountOptions); err != nil {
		return 0, 0, err
	}
	set = publishAttrs
	for _, o := range src.MountOptions {
		set |= optionAttrs[o]
		if isAtime(o) {
			clr |= unix.MOUNT_ATTR__ATIME
		}
	}
	return set, clr, nil
}

// resolveFlags resolve a path below the kubelet root: never through a symbolic
// link (magic links of /proc included), never above the starting directory.
const resolveFlags = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// New returns the Linux implementation. It calls the kernel directly through
// golang.org/x/sys/unix and needs CAP_SYS_ADMIN for Mount, SetReadOnly and
// Unmount. Every target is resolved with openat2(2) (Linux 5.6) beneath the
// kubelet root and mounted through the new mount API onto the resolved
// directory (fsopen/fsmount or open_tree, then move_mount: Linux 5.2).
// mount_setattr(2) (Linux 5.12) sets mount flags on the resolved mount; before
// 5.12 a remount through the resolved directory's /proc/self/fd path does it.
// Mount points are recognised with STATX_ATTR_MOUNT_ROOT (Linux 5.8; older
// kernels compare mount IDs with the parent).
func New() Interface { return &linuxMounter{} }

var _ UnsettledChecker = (*linuxMounter)(nil)

type linuxMounter struct {
	// noSetattr is set once mount_setattr(2) turned out to be missing (and by
	// tests, to cover the fallback).
	noSetattr atomic.Bool
}

// openBeneath opens target below root with openat2(2): no symbolic link below
// root is followed and nothing outside root is reached. root itself is opened
// normally: an operator may configure it as a symlink. flags are open(2) flags
// (O_CLOEXEC is added).
func openBeneath(root, target string, flags int) (int, error) {
	rootfd, rel, err := openRoot(root, target)
	if err != nil {
		return -1, err
	}
	defer unix.Close(rootfd)
	return openat2(rootfd, rel, flags, filepath.Join(root, rel))
}

// openRoot opens root (O_PATH, following links: an operator may configure
// it as one) and returns it with target's path relative to it, for openat2
// beneath it. The caller closes rootfd; a call that resolves target more than
// once resolves it from this descriptor each time.
func openRoot(root, target string) (rootfd int, rel string, err error) {
	parent, base, err := splitBeneath(root, target)
	if err != nil {
		return -1, "", err
	}
	rel = base
	if parent != "." {
		rel = parent + string(filepath.Separator) + base
	}
	rootfd, err = unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, "", &fs.PathError{Op: "open", Path: root, Err: err}
	}
	return rootfd, rel, nil
}

// openParent opens the directory that holds target's last component, beneath
// root, and returns it with that component's name.
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
	fd, err = openat2(rootfd, parent, unix.O_PATH|unix.O_DIRECTORY, filepath.Join(root, parent))
	if err != nil {
		return -1, "", err
	}
	return fd, base, nil
}

// openat2 opens rel below dirfd without following links; shown is the path for
// error messages.
func openat2(dirfd int, rel string, flags int, shown string) (int, error) {
	how := unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Resolve: resolveFlags}
	var fd int
	var err error
	for range 8 {
		fd, err = unix.Openat2(dirfd, rel, &how)
		if err != unix.EAGAIN && err != unix.EINTR { // EAGAIN: a concurrent rename; retry
			break
		}
	}
	switch {
	case err == nil:
		return fd, nil
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV):
		return -1, fmt.Errorf("%q: %w (%v)", shown, ErrSymlink, err)
	case errors.Is(err, unix.ENOSYS):
		return -1, fmt.Errorf("openat2 %q: %w (Linux 5.6 or later is required)", shown, err)
	default:
		return -1, &fs.PathError{Op: "openat2", Path: shown, Err: err}
	}
}

// fdPath names what fd refers to in a path, for the calls that take only a path
// (umount2(2), mount(2) remounts). The kernel resolves /proc/self/fd/N to the
// file fd refers to, wherever it is now; components after it are looked up
// from there.
func fdPath(fd int, rest string) string {
	p := "/proc/self/fd/" + strconv.Itoa(fd)
	if rest != "" {
		p += "/" + rest
	}
	return p
}

// mountID returns the mount ID of fd and whether fd is the root of its mount.
func mountID(fd int) (id uint64, root bool, st unix.Statx_t, err error) {
	err = unix.Statx(fd, "", unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW|unix.AT_NO_AUTOMOUNT,
		unix.STATX_BASIC_STATS|unix.STATX_MNT_ID, &st)
	if err != nil {
		return 0, false, st, err
	}
	id = st.Mnt_id
	if st.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 {
		return id, st.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0, st, nil
	}
	isRoot, err := byParent(fd, &st)
	return id, isRoot, st, err
}

// mountRootAt reports, from one statx(2) of name in the directory dirfd (a
// single component: nothing else to resolve, and a link there is not
// followed but is ErrSymlink), whether name is the root of a mount. known is
// false when the kernel does not say (before Linux 5.8, which added
// STATX_ATTR_MOUNT_ROOT) or the statx failed otherwise than for a missing
// entry: the caller then asks the way that works everywhere (openMountRoot).
func mountRootAt(dirfd int, name string) (mounted, known bool, err error) {
	var st unix.Statx_t
	err = unix.Statx(dirfd, name, unix.AT_SYMLINK_NOFOLLOW|unix.AT_NO_AUTOMOUNT, unix.STATX_TYPE, &st)
	switch {
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOTDIR):
		return false, true, fs.ErrNotExist
	case err != nil:
		return false, false, err
	case st.Mode&unix.S_IFMT == unix.S_IFLNK:
		return false, true, ErrSymlink
	case st.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT == 0:
		return false, false, nil
	}
	return st.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0, true, nil
}

// byParent is the mount-root test for kernels before 5.8, which do not report
// STATX_ATTR_MOUNT_ROOT: fd (with st, its statx) is a mount root when its
// parent directory is on another mount. A mount ID is exact; st_dev (before
// Linux 5.8 has mount IDs in statx) misses a bind mount within one filesystem.
func byParent(fd int, st *unix.Statx_t) (bool, error) {
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return false, nil
	}
	var parent unix.Statx_t
	if err := unix.Statx(fd, "..", unix.AT_SYMLINK_NOFOLLOW|unix.AT_NO_AUTOMOUNT,
		unix.STATX_BASIC_STATS|unix.STATX_MNT_ID, &parent); err != nil {
		return false, err
	}
	sameDev := st.Dev_major == parent.Dev_major && st.Dev_minor == parent.Dev_minor
	if sameDev && st.Ino == parent.Ino {
		return true, nil // "/" is its own parent
	}
	if st.Mask&parent.Mask&unix.STATX_MNT_ID != 0 {
		return st.Mnt_id != parent.Mnt_id, nil
	}
	return !sameDev, nil
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
		// Not a directory: the framework never makes anything else at a
		// target on Linux. A link there was planted; it is left alone, as is
		// whatever was swapped in and out again meanwhile.
		var st unix.Stat_t
		if serr := unix.Fstatat(dirfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); serr == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
			return fmt.Errorf("target %q: %w", target, ErrSymlink)
		}
		return fmt.Errorf("removing target %q: %w (it was not a directory at that moment)", target, ErrTargetMoved)
	}
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	return &fs.PathError{Op: "remove", Path: target, Err: err}
}

// Mount resolves target beneath root to a file descriptor, creates the mount
// detached from any path (fsopen/fsconfig/fsmount for a filesystem, open_tree
// for a bind), attaches it to that descriptor with move_mount, waits until no
// rename can move the new mount point any more (settle), and then checks that
// target, resolved afresh, shows the new mount. A rename can move the resolved
// directory elsewhere between the resolution and the attach (a rename does not
// lock the directories below the one it moves), or, once past its own check,
// right after the attach; the check catches both, and the stray mount is
// detached again before the call returns, so a publish is never answered for a
// volume that is not at its target. Both resolutions start from one descriptor
// of root, opened once per call: what can move is below root (replacing root
// itself takes write access to its parent, outside the kubelet root).
func (m *linuxMounter) Mount(root string, src api.Source, target string) error {
	rootfd, rel, err := openRoot(root, target)
	if err != nil {
		return err
	}
	defer unix.Close(rootfd)
	tfd, err := openat2(rootfd, rel, unix.O_PATH|unix.O_DIRECTORY, filepath.Join(root, rel))
	if err != nil {
		return err
	}
	defer unix.Close(tfd)
	if _, isRoot, _, err := mountID(tfd); err != nil {
		return &fs.PathError{Op: "statx", Path: target, Err: err}
	} else if isRoot {
		return fmt.Errorf("mount on %q: %w", target, ErrMounted)
	}

	mfd, err := m.newMount(src)
	if err != nil {
		return fmt.Errorf("mount %s on %q: %w", describe(src), target, err)
	}
	defer unix.Close(mfd)
	if err := unix.MoveMount(mfd, "", tfd, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("mount %s on %q (move_mount): %w", describe(src), target, err)
	}
	if src.IsDir() && m.noSetattr.Load() {
		// Without mount_setattr the bind mount gets nosuid,nodev by a remount
		// once attached, through the mount's own descriptor.
		if err := remount(mfd, "", unix.MS_NOSUID|unix.MS_NODEV, 0); err != nil {
			detach(mfd)
			return fmt.Errorf("remount bind mount on %q nosuid,nodev: %w", target, err)
		}
	}
	// Only a check made once nothing can move the target any more counts
	// (settle); then the target, resolved afresh, must be this mount.
	if err := settle(tfd, filepath.Base(target)); err != nil {
		detach(mfd)
		return fmt.Errorf("mount on %q: %w", target, err)
	}
	if err := verifyAt(rootfd, rel, target, mfd); err != nil {
		detach(mfd)
		return err
	}
	return nil
}

// settle returns once no rename can move the directory fd refers to any more
// (fd is that directory, or the root of a mount on it; name is what it is
// expected to be called). A mount point cannot be renamed (EBUSY), but
// rename(2) checks that under the lock of the parent directory, and attaching
// a mount does not take that lock: a rename already past its check when the
// mount was attached still carries the new mount point away, after any check
// of the target's name made in the meantime. Taking the parent's lock once
// waits for such a rename to finish; every rename after it meets the mount
// point. The lock is taken by a rename of name onto itself in the parent,
// which changes nothing (rename(2) returns before any change when both names
// are the same file; ENOENT, for a name that is gone, is looked up under the
// lock too).
func settle(fd int, name string) error {
	pfd, err := unix.Openat(fd, "..", unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening the target's parent directory: %w", err)
	}
	defer unix.Close(pfd)
	for {
		err = unix.Renameat(pfd, name, pfd, name)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("%w: waiting for renames in its directory to finish (a rename of %q onto itself): %v", ErrTargetMoved, name, err)
	}
	return nil
}

// verifyAt checks that target (rel beneath the root rootfd), resolved now, is
// the root of the mount mfd refers to.
func verifyAt(rootfd int, rel, target string, mfd int) error {
	want, _, wst, err := mountID(mfd)
	if err != nil {
		return fmt.Errorf("statx of the new mount: %w", err)
	}
	vfd, err := openat2(rootfd, rel, unix.O_PATH|unix.O_DIRECTORY, target)
	if err != nil {
		return fmt.Errorf("mount on %q: %w (resolving it again: %v)", target, ErrTargetMoved, err)
	}
	defer unix.Close(vfd)
	got, isRoot, gst, err := mountID(vfd)
	if err != nil {
		return &fs.PathError{Op: "statx", Path: target, Err: err}
	}
	same := isRoot && got == want
	if wst.Mask&gst.Mask&unix.STATX_MNT_ID == 0 { // no mount IDs before Linux 5.8
		same = isRoot && wst.Dev_major == gst.Dev_major && wst.Dev_minor == gst.Dev_minor && wst.Ino == gst.Ino
	}
	if !same {
		return fmt.Errorf("mount on %q: %w", target, ErrTargetMoved)
	}
	return nil
}

// detach removes a mount that must not stay (it landed somewhere else than
// the target). It is new and empty, so it is detached lazily: the descriptor
// the caller still holds keeps it busy.
func detach(mfd int) {
	_ = unix.Unmount(fdPath(mfd, ""), unix.MNT_DETACH)
}

// openTree returns a detached bind mount (clone) of the directory src. A
// confined source (src.Root) is resolved beneath its root by openat2, without
// symlinks, "..", or magic links: the directory bound is the one found there,
// whatever replaces a path component afterwards.
func openTree(src api.Source) (int, error) {
	const flags = unix.OPEN_TREE_CLONE | unix.OPEN_TREE_CLOEXEC
	if src.Root == "" {
		fd, err := unix.OpenTree(unix.AT_FDCWD, src.Path, flags|unix.AT_SYMLINK_NOFOLLOW)
		if err != nil {
			return -1, fmt.Errorf("open_tree: %w", err)
		}
		return fd, nil
	}
	dfd, err := openBeneath(src.Root, src.Path, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return -1, fmt.Errorf("source %q beneath %q: %w", src.Path, src.Root, err)
	}
	defer unix.Close(dfd)
	fd, err := unix.OpenTree(dfd, "", flags|unix.AT_EMPTY_PATH)
	if err != nil {
		return -1, fmt.Errorf("open_tree: %w", err)
	}
	return fd, nil
}

// newMount returns a detached mount of src: nosuid, nodev and src.MountOptions.
func (m *linuxMounter) newMount(src api.Source) (int, error) {
	set, clr, err := attrsOf(src)
	if err != nil {
		return -1, err
	}
	if src.IsDir() {
		fd, err := openTree(src)
		if err != nil {
			return -1, err
		}
		if m.noSetattr.Load() {
			if len(src.MountOptions) > 0 {
				unix.Close(fd)
				return -1, fmt.Errorf("mount options %s of a directory volume need mount_setattr (Linux 5.12 or later)", strings.Join(src.MountOptions, ","))
			}
			return fd, nil
		}
		attr := unix.MountAttr{Attr_set: set, Attr_clr: clr}
		if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
			unix.Close(fd)
			if errors.Is(err, unix.ENOSYS) {
				m.noSetattr.Store(true)
				return m.newMount(src)
			}
			return -1, fmt.Errorf("mount_setattr %s: %w", strings.Join(append([]string{"nosuid", "nodev"}, src.MountOptions...), ","), err)
		}
		return fd, nil
	}
	fsfd, err := unix.Fsopen(src.FSType, unix.FSOPEN_CLOEXEC)
	if err != nil {
		if errors.Is(err, unix.ENOSYS) {
			return -1, fmt.Errorf("fsopen: %w (Linux 5.2 or later is required)", err)
		}
		return -1, fmt.Errorf("fsopen: %w", err)
	}
	defer unix.Close(fsfd)
	if err := unix.FsconfigSetString(fsfd, "source", src.Path); err != nil {
		return -1, fsError(fsfd, "source="+src.Path, err)
	}
	for _, o := range src.Options {
		k, v, hasValue := strings.Cut(o, "=")
		if hasValue {
			err = unix.FsconfigSetString(fsfd, k, v)
		} else {
			err = unix.FsconfigSetFlag(fsfd, k)
		}
		if err != nil {
			return -1, fsError(fsfd, o, err)
		}
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return -1, fsError(fsfd, "create", err)
	}
	fd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, int(set))
	if err != nil {
		return -1, fsError(fsfd, "fsmount", err)
	}
	return fd, nil
}

// fsError adds the messages the filesystem left in its context (read(2) on an
// fsopen descriptor) to err.
func fsError(fsfd int, step string, err error) error {
	var msgs []string
	buf := make([]byte, 256)
	for range 8 {
		n, rerr := unix.Read(fsfd, buf)
		if rerr != nil || n <= 0 {
			break
		}
		msgs = append(msgs, strings.TrimSpace(string(buf[:n])))
	}
	if len(msgs) > 0 {
		return fmt.Errorf("fsconfig %s: %w (%s)", step, err, strings.Join(msgs, "; "))
	}
	return fmt.Errorf("fsconfig %s: %w", step, err)
}

func describe(src api.Source) string {
	if src.IsDir() {
		return fmt.Sprintf("bind %q", src.Path)
	}
	return fmt.Sprintf("%s %q", src.FSType, src.Path)
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

// remount changes the flags of the mount whose root dirfd/name resolves to
// (mount(2) with MS_REMOUNT|MS_BIND, a per-mount change): the flags it has,
// plus set, less clear. Used where mount_setattr(2) is missing.
func remount(dirfd int, name string, set, clear uintptr) error {
	p := fdPath(dirfd, name)
	var st unix.Statfs_t
	if err := unix.Statfs(p, &st); err != nil {
		return err
	}
	var flags uintptr
	for _, f := range stToMS {
		if uintptr(st.Flags)&f.st != 0 {
			flags |= f.ms
		}
	}
	if st.Flags&unix.ST_RDONLY != 0 {
		flags |= unix.MS_RDONLY
	}
	flags = (flags | set) &^ clear
	return unix.Mount("", p, "", unix.MS_REMOUNT|unix.MS_BIND|flags, "")
}

func (m *linuxMounter) SetReadOnly(root, target string, readOnly bool) error {
	fd, err := openBeneath(root, target, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if _, isRoot, _, err := mountID(fd); err != nil {
		return &fs.PathError{Op: "statx", Path: target, Err: err}
	} else if !isRoot {
		return fmt.Errorf("remount %q (read-only %v): not a mount point", target, readOnly)
	}
	if !m.noSetattr.Load() {
		attr := unix.MountAttr{Attr_clr: unix.MOUNT_ATTR_RDONLY}
		if readOnly {
			attr = unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}
		}
		err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.ENOSYS) {
			return fmt.Errorf("remount %q (read-only %v): %w", target, readOnly, err)
		}
		m.noSetattr.Store(true)
	}
	set, clear := uintptr(0), uintptr(unix.MS_RDONLY)
	if readOnly {
		set, clear = clear, set
	}
	if err := remount(fd, "", set, clear); err != nil {
		return fmt.Errorf("remount %q (read-only %v): %w", target, readOnly, err)
	}
	return nil
}

// IsMountPoint answers true only for a mount that stays at target: a mount
// found there is settled (see settle) and target resolved and checked again
// (from the same descriptor of root, as Mount does), so that a rename still in
// flight cannot carry it away after the answer.
func (m *linuxMounter) IsMountPoint(root, target string) (bool, error) {
	return isMountPoint(root, target, true)
}

// IsMountPointUnsettled implements UnsettledChecker: IsMountPoint without
// the settle and the second resolution, for answers that only report.
func (m *linuxMounter) IsMountPointUnsettled(root, target string) (bool, error) {
	return isMountPoint(root, target, false)
}

// isMountPoint is IsMountPoint, with the settle or without.
func isMountPoint(root, target string, settled bool) (bool, error) {
	rootfd, rel, err := openRoot(root, target)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOTDIR) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer unix.Close(rootfd)
	shown := filepath.Join(root, rel)
	open := func() (int, error) { return openat2(rootfd, rel, unix.O_PATH, shown) }
	fd, _, _, err := openMountRoot(open, target)
	if fd < 0 || !settled {
		if fd >= 0 {
			unix.Close(fd)
		}
		return fd >= 0, err
	}
	err = settle(fd, filepath.Base(target))
	unix.Close(fd)
	if err != nil {
		return false, fmt.Errorf("mount at %q: %w", target, err)
	}
	fd, _, _, err = openMountRoot(open, target)
	if fd >= 0 {
		unix.Close(fd)
	}
	return fd >= 0, err
}

// openMountRoot opens what open resolves (O_PATH, no link followed) and
// returns its descriptor, mount ID and statx when it is the root of a mount;
// fd is -1 (and err nil) when it does not exist or is not a mount root.
func openMountRoot(open func() (int, error), shown string) (fd int, id uint64, st unix.Statx_t, err error) {
	fd, err = open()
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOTDIR) {
		return -1, 0, st, nil
	}
	if err != nil {
		return -1, 0, st, err
	}
	id, isRoot, st, err := mountID(fd)
	if err != nil || !isRoot {
		unix.Close(fd)
		if err != nil {
			err = &fs.PathError{Op: "statx", Path: shown, Err: err}
		}
		return -1, 0, st, err
	}
	return fd, id, st, nil
}

// Unmount unmounts what is mounted at target, through the target's parent
// directory resolved beneath root once: umount2(2) takes a path, and
// /proc/self/fd/<parent>/<name> with UMOUNT_NOFOLLOW names exactly the entry
// below the resolved parent (a mount point cannot be renamed away, and a link
// swapped in is not followed). No descriptor of the mount itself is held, so
// a mount in use still fails with EBUSY instead of being detached lazily.
// Mounts stacked by earlier runs are unmounted one by one until umount2
// finds no mount there any more (EINVAL), which is also the check that the
// last one is gone.
func (m *linuxMounter) Unmount(root, target string) error {
	pfd, base, err := openParent(root, target)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	// A link at the target is ErrSymlink, and a target that is not a mount
	// point is left alone without an unmount.
	if mounted, err := m.mountedBelow(pfd, base, target); err != nil || !mounted {
		return err
	}
	p := fdPath(pfd, base)
	for range maxUnmounts {
		err = unix.Unmount(p, unix.UMOUNT_NOFOLLOW)
		switch {
		case err == nil:
			// One statx of the entry tells whether another mount is stacked
			// there; an umount2 that fails with EINVAL told the same, after
			// a walk through /proc/self/fd that cost about as much as the
			// unmount itself.
			if mounted, known, _ := mountRootAt(pfd, base); known && !mounted {
				return nil
			}
		case errors.Is(err, unix.EINTR):
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil // not (or no longer) a mount point
		default: // EBUSY included: the caller retries later
			return fmt.Errorf("unmount %q: %w", target, err)
		}
	}
	return fmt.Errorf("unmount %q: still a mount point after %d unmounts", target, maxUnmounts)
}

// mountedBelow reports whether name in the directory pfd is a mount point; a
// symbolic link there is ErrSymlink.
func (m *linuxMounter) mountedBelow(pfd int, name, shown string) (bool, error) {
	mounted, known, err := mountRootAt(pfd, name)
	switch {
	case errors.Is(err, ErrSymlink):
		return false, fmt.Errorf("%q: %w", shown, err)
	case errors.Is(err, fs.ErrNotExist): // ENOTDIR too
		return false, nil
	case known:
		return mounted, nil
	}
	fd, _, _, err := openMountRoot(func() (int, error) { return openat2(pfd, name, unix.O_PATH, shown) }, shown)
	if fd >= 0 {
		unix.Close(fd)
	}
	return fd >= 0, err
}

func (m *linuxMounter) Inspect(root, target string) (*Mounted, error) {
	fd, id, st, err := openMountRoot(func() (int, error) { return openBeneath(root, target, unix.O_PATH) }, target)
	if fd < 0 {
		return nil, err
	}
	defer unix.Close(fd)
	mt := &Mounted{ID: id, Dev: unix.Mkdev(st.Dev_major, st.Dev_minor), Ino: st.Ino}
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(fd, &sfs); err == nil {
		mt.ReadOnly = sfs.Flags&unix.ST_RDONLY != 0
	}
	infos, err := ReadMountInfo()
	if err != nil {
		return nil, err
	}
	for _, mi := range infos {
		if uint64(mi.ID) == id {
			mt.FSType, mt.Source = mi.FSType, mi.Source
			break
		}
	}
	return mt, nil
}

func (m *linuxMounter) OpenTarget(root, target string) (*os.Root, error) {
	fd, err := openBeneath(root, target, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	r, err := os.OpenRoot(fdPath(fd, ""))
	if err != nil {
		return nil, fmt.Errorf("open %q: %w", target, err)
	}
	return r, nil
}

func (m *linuxMounter) Shows(mt *Mounted, src api.Source) (bool, error) {
	if mt == nil {
		return false, nil
	}
	if !src.IsDir() && !strings.HasPrefix(src.Path, "/") {
		// A filesystem without a device (tmpfs): its type and source name.
		return mt.FSType == src.FSType && mt.Source == src.Path, nil
	}
	var st unix.Stat_t
	if err := unix.Stat(src.Path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, &fs.PathError{Op: "stat", Path: src.Path, Err: err}
	}
	if src.IsDir() {
		return st.Mode&unix.S_IFMT == unix.S_IFDIR && uint64(st.Dev) == mt.Dev && st.Ino == mt.Ino, nil
	}
	return st.Mode&unix.S_IFMT == unix.S_IFBLK && uint64(st.Rdev) == mt.Dev, nil
}

func (m *linuxMounter) MountedAt(src api.Source) ([]string, error) {
	if !src.IsDir() && !strings.HasPrefix(src.Path, "/") {
		return nil, nil
	}
	var st unix.Stat_t
	if err := unix.Stat(src.Path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, nil
		}
		return nil, &fs.PathError{Op: "stat", Path: src.Path, Err: err}
	}
	infos, err := ReadMountInfo()
	if err != nil {
		return nil, err
	}
	return mountedAt(infos, src, st)
}

// mountedAt finds the mounts of src in infos; st is src.Path's stat.
func mountedAt(infos []MountInfo, src api.Source, st unix.Stat_t) ([]string, error) {
	var out []string
	if !src.IsDir() {
		if st.Mode&unix.S_IFMT != unix.S_IFBLK {
			return nil, nil
		}
		for _, mi := range infos {
			if unix.Mkdev(uint32(mi.Major), uint32(mi.Minor)) == uint64(st.Rdev) {
				out = append(out, mi.MountPoint)
			}
		}
		return out, nil
	}
	// The directory's path within its filesystem: the mount of that filesystem
	// whose mount point is the longest prefix of the directory's real path, plus
	// the rest. Bind mounts of it (or of anything below it) show that path, or
	// one below it, as their root.
	real, err := filepath.EvalSymlinks(src.Path)
	if err != nil {
		return nil, err
	}
	dev := uint64(st.Dev)
	var host *MountInfo
	for i := range infos {
		mi := &infos[i]
		if unix.Mkdev(uint32(mi.Major), uint32(mi.Minor)) != dev || !within(real, mi.MountPoint) {
			continue
		}
		if host == nil || len(mi.MountPoint) > len(host.MountPoint) {
			host = mi
		}
	}
	if host == nil {
		return nil, fmt.Errorf("no mount of the filesystem of %q in the mount table", real)
	}
	inFS := filepath.Join(host.Root, strings.TrimPrefix(real, host.MountPoint))
	for _, mi := range infos {
		if mi.ID == host.ID || unix.Mkdev(uint32(mi.Major), uint32(mi.Minor)) != dev {
			continue
		}
		if within(mi.Root, inFS) {
			out = append(out, mi.MountPoint)
		}
	}
	return out, nil
}

// within reports whether p is dir or below it (separator-aware).
func within(p, dir string) bool {
	if dir == "/" {
		return strings.HasPrefix(p, "/")
	}
	return p == dir || strings.HasPrefix(p, dir+"/")
}

func (m *linuxMounter) Published(root string) ([]string, error) {
	real, err := filepath.EvalSymlinks(root)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	infos, err := ReadMountInfo()
	if err != nil {
		return nil, err
	}
	return publishedUnder(infos, root, real), nil
}

// publishedUnder returns the mount points in infos that have the shape of an
// inline volume's target below real/pods, as paths under root (real is root
// with links resolved, as the mount table shows it). Each appears once.
func publishedUnder(infos []MountInfo, root, real string) []string {
	prefix := filepath.Join(real, volume.PodsDir) + "/"
	seen := map[string]bool{}
	var out []string
	for _, mi := range infos {
		rest, ok := strings.CutPrefix(mi.MountPoint, prefix)
		if !ok {
			continue
		}
		parts := strings.Split(rest, "/")
		if len(parts) != 5 || parts[1] != volume.VolumesDir || parts[2] != volume.PluginDir || parts[4] != volume.MountDir {
			continue
		}
		t := filepath.Join(root, volume.PodsDir, rest)
		if !seen[t] {
			seen[t] = true
			out = append(out, t)
		}
	}
	return out
}
