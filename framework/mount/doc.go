// Package mount is Ephemera's platform seam: the few operating-system calls the
// framework needs to publish a volume at a kubelet target path and to find out what
// is published there. Everything above this package is platform independent.
// [Interface] is the seam, [New] returns this platform's implementation, and
// [Mounted] describes what [Interface.Inspect] finds at a target.
//
// # Linux
//
// [New] returns an implementation built on golang.org/x/sys/unix system calls only;
// it never starts mount, umount or any other process. Target directories are
// created and removed relative to an open handle on the kubelet root with
// openat2(2) and RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS, so a symbolic link planted
// below the root is refused ([ErrSymlink]) instead of followed. A mount point is
// recognised by one statx(2) call (STATX_ATTR_MOUNT_ROOT, Linux 5.8 and later),
// which also sees bind mounts within one filesystem; IsMountPoint then settles a
// mount it finds (a rename of the target onto itself, so that no rename in flight
// can move it after the answer) and checks again, and the unsettled check
// ([UnsettledChecker]) is for answers that only report. /proc/self/mountinfo is
// read only by [ReadMountInfo], for reconciliation and tests. Published volumes
// are always nosuid and nodev.
//
// # Windows
//
// There are no bind mounts or tmpfs. [New] publishes a directory source by
// replacing the (empty) target directory with a directory symbolic link to it, as
// k8s.io/mount-utils and the kubelet expect: the kubelet treats a symlink or a
// junction at the target as mounted. Unmount removes the link only, never the data
// behind it. Filesystem sources and read-only publishing return [ErrNotSupported].
// [NewCSIProxy] returns the seam of an ordinary (not HostProcess) Windows
// container, a [CSIProxy]: the same link rules, each change on the host a call to
// csi-proxy v1. The rules are written once (link.go) for both, without build tags,
// and unit tested on Linux: [NewLink] on POSIX symlinks, the csi-proxy seam against
// a fake csi-proxy on a unix socket (package fakecsiproxy).
//
// # Other systems
//
// Every method returns [ErrNotSupported], so the SDK builds (and its unit tests run)
// on macOS and the BSDs.
//
// # Testing
//
// [Fake] implements [Interface] in memory, records every call and can inject an
// error into any method. The Linux tests that mount for real run as root and skip
// otherwise.
package mount
