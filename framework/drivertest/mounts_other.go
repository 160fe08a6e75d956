//go:build !linux

package drivertest

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
)

// detachLeftovers does nothing: the links a test leaves are removed with its
// temporary directories.
func (h *Harness) detachLeftovers() {}

// isMountPoint reports whether path is a mount point, like the kubelet's
// IsLikelyNotMountPoint check: false for a missing path. Without
// /proc/self/mountinfo, a symbolic link or irregular file (a Windows link or
// junction) counts as mounted, as in mount-utils for Windows.
func isMountPoint(path string) (bool, error) {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return fi.Mode()&(fs.ModeSymlink|fs.ModeIrregular) != 0, nil
}

// mountPointsUnder returns the mount points strictly below dir: the symbolic
// links and irregular files below it (isMountPoint).
func mountPointsUnder(dir string) (map[string]bool, error) {
	out := map[string]bool{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if p != dir && d.Type()&(fs.ModeSymlink|fs.ModeIrregular) != 0 {
			out[p] = true
		}
		return nil
	})
	return out, err
}
