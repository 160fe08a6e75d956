package content

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
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

// maxChargedEntries bounds the walk of Charged: far more than the
// DefaultMaxFiles files Write accepts, with their directories.
const maxChargedEntries = 4 * DefaultMaxFiles

// Charged is Charge of the content Write left in r: what its current
// timestamped directory holds (files in whole pages, and an inode per
// entry), its links, and any other timestamped directory a Write cut short
// left behind (the next Write removes it). It returns 0 when r has no
// content. It reads at most a bounded number of entries, more than Write
// ever creates: past them it fails.
func Charged(r *os.Root, pageSize int64) (int64, error) {
	f, err := r.Open(".")
	if err != nil {
		return 0, err
	}
	ents, err := f.ReadDir(-1)
	f.Close()
	if err != nil {
		return 0, err
	}
	var n int64
	seen := 0
	for _, e := range ents {
		name := e.Name()
		switch {
		case name == DataDir || name == dataTmp:
			n += InodeCharge
		case tsPattern.MatchString(name) && e.IsDir():
			c, err := chargedDir(r, name, pageSize, &seen)
			if err != nil {
				return 0, err
			}
			n += c
		case e.Type()&fs.ModeSymlink != 0:
			if t, err := readLink(r, name); err == nil && t == DataDir+"/"+name {
				n += InodeCharge + linkPage(t, pageSize) // a top-level link Write made
			}
		}
	}
	return n, nil
}

// chargedDir is the charge of the tree at name in r, walked without
// following links.
func chargedDir(r *os.Root, name string, pageSize int64, seen *int) (int64, error) {
	sub, err := r.OpenRoot(name)
	if err != nil {
		return 0, err
	}
	defer sub.Close()
	var n int64
	err = fs.WalkDir(sub.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if *seen++; *seen > maxChargedEntries {
			return errors.New("more entries than content ever has")
		}
		n += InodeCharge
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			n += pages(fi.Size(), pageSize)
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("reading the content in %s: %w", name, err)
	}
	return n, nil
}
