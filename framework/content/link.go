package content

import (
	"os"
	"path/filepath"
)

// The link helpers are the only places that create, read or swap links. A
// Windows implementation without symlink privileges would replace them (see the
// package documentation).

// makeLink creates name as a link to target, both relative to r.
func makeLink(r *os.Root, target, name string) error {
	return r.Symlink(filepath.FromSlash(target), name)
}

// readLink returns the target of the link name in slash form.
func readLink(r *os.Root, name string) (string, error) {
	t, err := r.Readlink(name)
	if err != nil {
		return "", err
	}
	return filepath.ToSlash(t), nil
}

// replaceLink atomically renames the link tmp over name. rename(2) replaces a
// file or a symlink (without following it) but not a directory, so a directory
// planted at name is removed first (os.Root.RemoveAll never follows links).
func replaceLink(r *os.Root, tmp, name string) error {
	if fi, err := r.Lstat(name); err == nil && fi.IsDir() {
		if err := r.RemoveAll(name); err != nil {
			return err
		}
	}
	return r.Rename(tmp, name)
}
