// Package exepages gives back to the kernel the pages of the running binary
// that starting up touched.
//
// A Go binary's startup (the runtime, the initializers of a few hundred
// packages, flag parsing, the startup reconcile) runs code spread all over
// the executable, and the kernel maps the file's pages around each one
// touched (fault-around, 64 KiB windows): most of the scratch driver's binary
// is resident two seconds after start, counted in its RSS and charged to its
// container's memory cgroup, though serving a NodePublishVolume needs a
// fraction of it (docs/operations.md, "Memory and CPU of the driver", has the
// numbers). Release gives those pages back:
// over the executable's read-only file mappings (code and read-only data; the
// writable data is left alone, its written pages are anonymous), it marks
// them for random access (madvise MADV_RANDOM: a later page fault reads the
// page it needs, not a window around it) and asks the kernel to reclaim them
// (MADV_PAGEOUT, Linux 5.4 and later). Clean file pages no other process
// maps are dropped; what the process runs afterwards faults back in, a page
// at a time, from the page cache or, the first time, from the disk. [Release]
// does it and says what it gave back in a [Result].
package exepages
