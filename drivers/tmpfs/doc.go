// Package tmpfs is a memory-backed backend ([Backend], built by [New] from
// [Options]): each volume is a tmpfs mounted straight onto the pod's target
// path with a hard size limit (size=). Nothing is
// written to disk and nothing survives a node reboot.
//
// tmpfs pages count against node memory: budget them like memory, not like disk.
// They are charged to the memory cgroup of whoever writes them (normally the pod's
// container), but the kubelet does not count inline volumes against a pod's
// ephemeral-storage, so the node budget (Options.Limits.Capacity) is what bounds them.
//
// Attributes: "size" (handled by the framework; required unless Options.DefaultSize
// is set), "mode" (octal, default 01777 like /tmp),
// "uid", "gid", "nr_inodes". fsType must be unset or "tmpfs". Linux only: on other
// platforms Create fails with api.ErrNotSupported.
//
// # Inodes
//
// size= limits the pages of file data, not the number of files. An empty file, a
// directory or a short symlink takes no page of size, but its inode and dentry take
// kernel memory, mostly charged to the memory cgroup of the process that created
// it, which stays as long as the files do: dropping caches does not free it
// (TestInodeCost, EPHEMERA_TMPFS_INODE_COST=1, measures it; docs/operations.md,
// "Capacity planning", has the numbers). Without nr_inodes the kernel allows as
// many inodes as half the node's pages, so a volume of any size could pin
// gigabytes of kernel memory.
//
// So every volume gets nr_inodes: the "nr_inodes" attribute, at most
// Options.MaxInodes (default 1Mi; 0, "unlimited" to the kernel, is refused), or
// else size/Options.BytesPerInode (default one inode per 4KiB page), at least
// Options.MinInodes (default 1024) and at most MaxInodes. A file holding data
// takes at least one page of size, so the default never runs out before the size
// does for files with data; with an inode's kernel memory below a page, it bounds
// the kernel memory of a volume's inodes to a fraction of its size (a 64Mi volume
// gets 16384 inodes). Inode kernel memory is not part of "size" nor of the
// framework's Capacity budget: plan for it on top. Creating a file beyond the
// limit fails with ENOSPC.
package tmpfs
