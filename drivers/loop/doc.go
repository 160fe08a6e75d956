// Package loop is a backend ([Backend], built by [New] from [Options]) whose
// volumes are ext4 or xfs filesystems on loop devices: a pod's volume cannot
// grow past its "size", whatever the pod writes, and it is ordinary disk (not
// memory like tmpfs).
//
// # Design
//
// Each volume is a sparse backing file <Options.Dir>/<volumeID>.img of exactly the
// volume's size, bound to a loop device and formatted. Create returns the device
// (api.Source{Path: "/dev/loopN", FSType: "ext4"|"xfs"}); the framework mounts it
// at the target (nosuid, nodev) and unmounts it before Delete. Create is
// idempotent step by step, so a call after a crash or a retry finishes what an
// earlier one started:
//
//  1. The backing file is opened with O_CREAT and sized with ftruncate; an
//     existing file of the right size is reused.
//  2. A loop device already bound to that file (found in
//     /sys/block/loop*/loop/backing_file and confirmed by device and inode with
//     LOOP_GET_STATUS64) is reused; otherwise one is bound through
//     /dev/loop-control: LOOP_CTL_GET_FREE, then LOOP_CONFIGURE on /dev/loopN,
//     retried when another process configured the same free device first. No
//     losetup is executed. Devices are not autoclear: they stay bound until Delete.
//  3. mkfs runs only when the device holds no filesystem yet, detected from the
//     superblock magic (ext4: 0xEF53 at byte 1080; xfs: "XFSB" at byte 0 with
//     sb_inprogress clear). An existing filesystem is never reformatted.
//
// v.State records {"device", "file"} for operators; Delete and Check work from
// the volume ID alone: Delete detaches every device bound to the file (also a
// device whose file was deleted, reported by the kernel as "<path> (deleted)")
// and then removes the file. A device whose filesystem is still mounted is not
// detached: Delete fails with an error wrapping api.ErrBusy and keeps the file.
// List reports the backing files in Dir and the devices bound to deleted files of
// Dir, so the startup reconcile also frees devices leaked by a crash.
//
// # Attributes
//
//   - "size" (framework attribute): required unless Options.DefaultSize is set;
//     rounded up to 4KiB. Minimum 1Mi for ext4 and 300Mi for xfs (the smallest
//     filesystem mkfs.xfs makes).
//   - "fsType": "ext4" or "xfs"; the pod's csi.fsType is accepted too (they
//     must agree when both are set). Default Options.DefaultFSType (ext4).
//   - "mode", "uid", "gid": the filesystem root's mode (octal, default 0777)
//     and owner (default 0:0), set when the volume is formatted: mkfs.ext4 -E
//     root_owner plus debugfs for the mode; a mkfs.xfs protofile for xfs, whose
//     format cannot express the sticky bit (refused for xfs). With a pod fsGroup
//     and no "gid", the root's group is the fsGroup (mode 2775 unless "mode").
//
// # Choices
//
// ext4 keeps its journal. A published volume outlives a driver restart and a
// node reboot (the backing file stays on disk and a republish re-attaches it);
// the journal makes that remount consistent without an fsck, for a few percent
// of the volume's space and no measurable mkfs time (lazy_journal_init;
// docs/operations.md, "Capacity planning", has the numbers). mkfs.ext4 runs
// with -m 0 (no blocks reserved for root), lazy inode table and journal
// initialisation and nodiscard (the file is sparse already); mkfs.xfs with -K.
//
// Loop devices use direct I/O (LO_FLAGS_DIRECT_IO) on the backing file unless
// Options.BufferedIO is set: without it every block is cached twice, once in the
// volume's filesystem and once in the backing file's page cache. A backing
// filesystem without O_DIRECT support falls back to buffered I/O automatically.
// No "discard" mount option is set: space a pod frees stays allocated in the
// backing file until the volume is deleted, which the size bounds anyway.
//
// # Node requirements
//
// Linux with the loop module and /dev/loop-control; e2fsprogs (mkfs.ext4,
// debugfs) for ext4 and xfsprogs (mkfs.xfs) for xfs, found in PATH or configured
// in Options. In a container the driver must be privileged (CAP_SYS_ADMIN for
// LOOP_CONFIGURE and mount) with the host's /dev mounted, so that new
// /dev/loopN nodes appear (a missing node is created with mknod from sysfs).
//
// Disk: backing files live on the filesystem of Options.Dir (normally
// <state-dir>/loop, next to the driver's state.db). They are sparse: a volume
// uses node disk as its pod writes, up to its size, so the sizes of all volumes
// may exceed the free space, and when that disk is full a pod's write fails with
// EIO (the loop device cannot write its file), not ENOSPC. Budget the sum of
// sizes (Options.MaxSize, the framework's MaxVolumesPerNode), or set
// Options.Preallocate to reserve each volume's space at publish (fallocate: a
// full disk then fails the publish with ResourceExhausted).
//
// Capacity: "size" is the size of the device. The filesystem's metadata comes
// out of it (ext4's journal and inode tables, xfs's log), a large share of a
// small volume, shrinking in proportion as volumes grow (docs/operations.md,
// "Capacity planning", has the numbers).
//
// Known limit: the kernel reports a backing file's path as seen from the mount
// namespace that opened it. After the driver's container is replaced, devices
// are still matched by device and inode while their file exists; a device whose
// file was also deleted by someone else is no longer recognised and must be
// detached by hand (losetup -d).
//
// On platforms other than Linux, Create fails with an error wrapping
// api.ErrNotSupported and List returns nothing.
package loop
