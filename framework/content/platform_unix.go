//go:build unix

package content

import (
	"errors"
	"io/fs"
	"os"
	"syscall"
)

// noSpace reports whether err says the volume is full: no blocks, no inodes,
// a quota or a file too large for it.
func noSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) || errors.Is(err, syscall.EFBIG)
}

// fileGID returns the group of fi, or -1 when unknown.
func fileGID(fi fs.FileInfo) int {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Gid)
	}
	return -1
}

// syncDir fsyncs the directory name below r so that the entries created in it
// are durable.
func syncDir(r *os.Root, name string) error {
	f, err := r.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
