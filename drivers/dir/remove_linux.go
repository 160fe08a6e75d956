//go:build linux

package dir

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// checkEvery is how many entries removeAll removes between two looks at its
// context.
const checkEvery = 256

// removeAll removes dir and everything below it, as os.RemoveAll does (by
// descriptor, never following a link, linear in the entries), but stops
// with ctx's error once ctx is done, leaving the rest for the next call: a
// tree a pod filled with millions of entries never holds its volume's lock
// past the request's deadline. What is gone stays gone; the kubelet's retry
// removes the rest.
func removeAll(ctx context.Context, dir string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	parent, err := unix.Open(filepath.Dir(dir), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return &os.PathError{Op: "open", Path: filepath.Dir(dir), Err: err}
	}
	defer unix.Close(parent)
	n := 0
	return removeAt(ctx, parent, filepath.Base(dir), dir, &n)
}

// removeAt removes name in the directory parent (path is for messages).
func removeAt(ctx context.Context, parent int, name, path string, n *int) error {
	err := unix.Unlinkat(parent, name, 0)
	switch {
	case err == nil, errors.Is(err, unix.ENOENT):
		return nil
	case !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM):
		return &os.PathError{Op: "unlinkat", Path: path, Err: err}
	}
	fd, err := unix.Openat(parent, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return &os.PathError{Op: "openat", Path: path, Err: err}
	}
	d := os.NewFile(uintptr(fd), path)
	defer d.Close()
	for {
		// Read afresh after each batch: entries removed while reading may
		// make getdents skip others.
		if _, err := d.Seek(0, io.SeekStart); err != nil {
			return err
		}
		names, err := d.Readdirnames(1024)
		if len(names) == 0 {
			if err != nil && err != io.EOF {
				return err
			}
			break
		}
		for _, c := range names {
			if *n++; *n%checkEvery == 0 {
				if err := ctx.Err(); err != nil {
					return err
				}
			}
			if err := removeAt(ctx, fd, c, path+"/"+c, n); err != nil {
				return err
			}
		}
	}
	if err := unix.Unlinkat(parent, name, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		return &os.PathError{Op: "rmdir", Path: path, Err: err}
	}
	return nil
}
