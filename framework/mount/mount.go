package mount

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/ephemera-csi/ephemera/api"
)

// ErrNotSupported is returned for an operation the platform cannot perform (for
// example a tmpfs on Windows). It is api.ErrNotSupported, which backends use.
var ErrNotSupported = api.ErrNotSupported

// ErrNotEmpty is returned by Mount when the target exists and is not empty
// (Windows, where the target is replaced by a link).
var ErrNotEmpty = errors.New("target directory is not empty")

// ErrSymlink is returned when a path component below the root is a symbolic link;
// the framework never follows links under the kubelet root.
var ErrSymlink = errors.New("path contains a symbolic link")

// ErrMounted is returned by Mount when something is already mounted at the
// target: a mount is never stacked over another one.
var ErrMounted = errors.New("target is already a mount point")

// ErrTargetMoved is returned by Mount when the target directory was moved or
// replaced while the mount was made (a rename racing the publish): the new mount
// is not at the target path, so it is removed again and nothing is published.
var ErrTargetMoved = errors.New("target directory was moved or replaced during the mount")

// Interface is the platform seam. Every path a method takes is absolute; root is
// the kubelet root directory and target lies below it. Every method resolves
// target beneath root once, without following any symbolic link below root
// (root itself may be a link an operator configured), and works on what it
// resolved (a file descriptor on Linux) from then on: a link or a rename raced
// into the path can make a call fail, never act outside root.
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
	// and nodev, and returns only once the new mount is verified to be at target
	// by a check made when no rename can move it any more ([ErrTargetMoved]
	// otherwise, with the mount removed again). A target that
	// is already a mount point is [ErrMounted]: nothing is ever stacked. Windows
	// needs a directory source that exists (else [ErrNotSupported] or an error
	// wrapping fs.ErrNotExist), replaces an empty target directory with a
	// directory symlink to src.Path ([ErrNotEmpty] if it is not empty), and
	// succeeds if the link to src.Path is already there.
	Mount(root string, src api.Source, target string) error
	// SetReadOnly makes the mount at target read-only, or writable again: that
	// mount only (the filesystem behind it stays writable, so a refresh can write
	// new content and make it read-only again), keeping its other flags. Mounts
	// the kubelet made of the target for containers keep their own flags.
	// Windows links cannot be made read-only: [ErrNotSupported] for readOnly, nil
	// otherwise.
	SetReadOnly(root, target string, readOnly bool) error
	// Unmount removes everything published at target, including mounts stacked by
	// earlier runs, until target is no longer a mount point. It is nil when target
	// does not exist or is not a mount point. A target in use fails with an error
	// wrapping syscall.EBUSY (retry later; nothing is lazily detached). Data
	// behind a Windows link is never touched.
	Unmount(root, target string) error
	// IsMountPoint reports whether something is published at target; false and
	// nil when target does not exist. On Linux, true means the mount stays at
	// target: no rename still in flight can carry it away (see Mount). On Windows, a link at target whose
	// destination exists is what "published" means.
	IsMountPoint(root, target string) (bool, error)
	// Inspect describes what is published at target, or returns nil when nothing
	// is. It reads the mount table (Linux), so it is for rare paths (adopting a
	// volume whose record is missing), not for every request.
	Inspect(root, target string) (*Mounted, error)
	// RemoveTarget removes the empty target directory below root without
	// following links. A link at target is [ErrSymlink] on Linux (the framework
	// never makes one there) and is removed itself on Windows (where it is what
	// Mount makes), never what it points to. It is nil when target (or a parent)
	// does not exist; a mounted target fails with an error wrapping
	// syscall.EBUSY, a non-empty one with syscall.ENOTEMPTY (Linux).
	RemoveTarget(root, target string) error
	// OpenTarget opens the directory published at target for the framework's own
	// file work in it (content, ownership, usage), resolved beneath root like
	// every other call. The caller closes it.
	OpenTarget(root, target string) (*os.Root, error)
	// Shows reports whether m, what Inspect found at a target, is the storage
	// src names: the same directory (a bind mount of it, or a link to it), the
	// filesystem on the same block device, or a filesystem of src's type and
	// source name (tmpfs).
	Shows(m *Mounted, src api.Source) (bool, error)
	// MountedAt returns the mount points, anywhere in the mount table this
	// process sees, that show src's storage: bind mounts of the directory src
	// names or of anything below it, or mounts of the block device. It returns
	// nil for sources it cannot attribute (a tmpfs lives only in its mount).
	MountedAt(src api.Source) ([]string, error)
	// Published returns the targets below root/pods that something is published
	// at (mount points on Linux, links on Windows), as paths under root, in no
	// particular order. It is the node's own record of what is published, used
	// to rebuild lost state.
	Published(root string) ([]string, error)
}

// UnsettledChecker is implemented by a mounter that can tell whether
// something is published at target without waiting for renames in flight to
// finish (Linux's: see Interface.IsMountPoint, which settles a mount it
// finds). It is for answers that only report what is there: volume stats and
// health, the volume listing, the startup reconcile's log; never for one that
// answers a publish OK, since a rename already in flight may still move a
// mount it reports. The framework calls IsMountPoint on mounters without it.
type UnsettledChecker interface {
	// IsMountPointUnsettled reports whether target, resolved beneath root as
	// every method does (a link is ErrSymlink), is a mount point now; false
	// and nil when target does not exist.
	IsMountPointUnsettled(root, target string) (bool, error)
}

// IsMountPointNow reports whether target is a mount point, for an answer that
// only reports what is there: m's IsMountPointUnsettled when it has one
// (UnsettledChecker), IsMountPoint otherwise.
func IsMountPointNow(m Interface, root, target string) (bool, error) {
	if u, ok := m.(UnsettledChecker); ok {
		return u.IsMountPointUnsettled(root, target)
	}
	return m.IsMountPoint(root, target)
}

// Mounted describes what is published at a target.
type Mounted struct {
	// ID is the kernel's mount ID (0 on Windows).
	ID uint64
	// Dev and Ino identify the root directory of the mount: the filesystem's
	// device and the inode of the directory shown at the target.
	Dev, Ino uint64
	// FSType and Source are the filesystem type and the source of the mount as
	// the mount table shows them ("tmpfs", "ephemera-tmpfs"; "ext4",
	// "/dev/loop3"). On Windows FSType is empty and Source is the link's
	// destination.
	FSType, Source string
	// ReadOnly reports whether the mount is read-only.
	ReadOnly bool
}

// SafeOptions are the mount options an operator may add to every volume of a
// backend (api.Source.MountOptions): each only takes something away from what
// a pod's processes can do, or changes how access times are kept. nosuid and
// nodev are always set. Pods cannot set mount options.
var SafeOptions = []string{"noexec", "noatime", "nodiratime", "relatime", "strictatime", "nosymfollow"}

// isAtime reports whether o is one of the atime modes, of which a mount has
// one.
func isAtime(o string) bool { return o == "noatime" || o == "relatime" || o == "strictatime" }

// CheckOptions reports whether opts are SafeOptions, each once, with at most
// one of the atime modes (noatime, relatime, strictatime).
func CheckOptions(opts []string) error {
	seen := map[string]bool{}
	atime := ""
	for _, o := range opts {
		if !slices.Contains(SafeOptions, o) {
			return fmt.Errorf("mount option %q is not one of %s", o, strings.Join(SafeOptions, ", "))
		}
		if seen[o] {
			return fmt.Errorf("mount option %q is given twice: give it once", o)
		}
		seen[o] = true
		if isAtime(o) {
			if atime != "" {
				return fmt.Errorf("mount options %q and %q exclude each other: a mount has one atime mode (noatime, relatime or strictatime); keep one", atime, o)
			}
			atime = o
		}
	}
	return nil
}
