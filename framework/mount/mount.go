package mount

import (
	"errors"

	"github.com/ephemera-csi/ephemera/api"
)

// ErrNotSupported is returned for an operation the platform cannot perform (for
// example a tmpfs on Windows).
var ErrNotSupported = errors.New("not supported on this platform")

// ErrNotEmpty is returned by Mount when the target exists and is not empty
// (Windows, where the target is replaced by a link).
var ErrNotEmpty = errors.New("target directory is not empty")

// ErrSymlink is returned when a path component below the root is a symbolic link;
// the framework never follows links under the kubelet root.
var ErrSymlink = errors.New("path contains a symbolic link")

// Interface is the platform seam. Paths are absolute; root is the kubelet root
// directory under which target paths live. No symbolic link between root and the
// target is ever followed.
type Interface interface {
	// MakeTarget creates the last component of target (mode 0750, less the umask)
	// below root. The parent must exist (else an error wrapping fs.ErrNotExist).
	// An existing directory is not an error; a link there, or in any component
	// between root and target, is [ErrSymlink]; a target not below root is an
	// error. On Windows it creates nothing (a link is made where nothing exists,
	// see Mount) and only checks the parent.
	MakeTarget(root, target string) error
	// Mount publishes src at target, which MakeTarget created. Linux mounts the
	// filesystem or bind-mounts the directory (not recursively), always nosuid
	// and nodev; mounting twice stacks a second mount, so check IsMountPoint
	// first. Windows needs a directory source that exists (else
	// [ErrNotSupported] or an error wrapping fs.ErrNotExist), replaces an empty
	// target directory with a directory symlink to src.Path ([ErrNotEmpty] if it
	// is not empty), and succeeds if the link to src.Path is already there.
	Mount(src api.Source, target string) error
	// SetReadOnly makes the published target read-only, or writable again: a
	// remount of that mount only (the filesystem behind it stays writable, so a
	// refresh can write new content and make it read-only again) that keeps the
	// mount's other flags. Mounts the kubelet made of the target for containers
	// keep their own flags. Windows links cannot be made read-only:
	// [ErrNotSupported] for readOnly, nil otherwise.
	SetReadOnly(target string, readOnly bool) error
	// Unmount removes everything published at target, including mounts stacked by
	// earlier runs, until target is no longer a mount point. It is nil when target
	// does not exist or is not a mount point. A target in use fails with an error
	// wrapping syscall.EBUSY (retry later; nothing is lazily detached). Data
	// behind a Windows link is never touched.
	Unmount(target string) error
	// IsMountPoint reports whether something is published at target; false and
	// nil when target does not exist. A symlink at target is not followed (on
	// Windows, a symlink or junction at target is what "published" means).
	IsMountPoint(target string) (bool, error)
	// RemoveTarget removes the empty target directory below root without
	// following links: a link at target is removed itself, never what it points
	// to. It is nil when target (or a parent) does not exist; a mounted target
	// fails with an error wrapping syscall.EBUSY, a non-empty one with
	// syscall.ENOTEMPTY (Linux).
	RemoveTarget(root, target string) error
}
