package content

import (
	"path"
	"strings"

	"github.com/ephemera-csi/ephemera/api"
)

// InodeCharge is the kernel memory one entry of a memory-backed filesystem
// (tmpfs) pins beside its data: the inode and its dentry, charged to the
// memory cgroup of the process that created the entry. Measured 960 bytes
// per file on Linux 6.18 (shmem_inode_cache and dentry slabs, with their
// security blobs); rounded up.
const InodeCharge = 1024

// Charge is what writing files with Write takes from a memory-backed
// filesystem, the way the kernel charges it to the writer's memory cgroup:
// each file's data in whole pages of pageSize bytes, and InodeCharge for
// every entry Write creates (each file and directory, the timestamped
// directory, the ..data link and one link per top-level entry). While Write
// replaces content, the old and the new are both there: Charge of each.
func Charge(files map[string]api.File, pageSize int64) int64 {
	var n int64 = 2 * InodeCharge // the timestamped directory and ..data
	dirs := map[string]bool{}
	top := map[string]bool{}
	for name, f := range files {
		n += pages(int64(len(f.Data)), pageSize) + InodeCharge
		t, _, _ := strings.Cut(name, "/")
		top[t] = true
		for d := path.Dir(name); d != "." && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	n += int64(len(dirs)+len(top)) * InodeCharge
	for t := range top {
		n += linkPage(DataDir+"/"+t, pageSize)
	}
	return n
}

// shortLink is the longest link target (with its NUL) tmpfs keeps in the
// inode's own memory; a longer one takes a page.
const shortLink = 128

// linkPage is the page a link to target takes beside its inode.
func linkPage(target string, pageSize int64) int64 {
	if len(target)+1 > shortLink {
		return max(pageSize, 0)
	}
	return 0
}

// pages is size rounded up to whole pages.
func pages(size, pageSize int64) int64 {
	if size <= 0 || pageSize <= 0 {
		return max(size, 0)
	}
	return (size + pageSize - 1) / pageSize * pageSize
}
