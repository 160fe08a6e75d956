package drivertest

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/ephemera-csi/ephemera/framework/mount"
)

// isMountPoint reports whether path is a mount point, like the kubelet's
// IsLikelyNotMountPoint check: false for a missing path. It consults
// /proc/self/mountinfo, so a plain directory tree (fake mounter) is never
// mounted.
func isMountPoint(path string) (bool, error) {
	_, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	mounts, err := linuxMountPoints()
	if err != nil {
		return false, err
	}
	for _, p := range candidatePaths(path) {
		if mounts[p] {
			return true, nil
		}
	}
	return false, nil
}

// mountPointsUnder returns the mount points strictly below dir.
func mountPointsUnder(dir string) (map[string]bool, error) {
	out := map[string]bool{}
	mounts, err := linuxMountPoints()
	if err != nil {
		return nil, err
	}
	// Compare in the resolved namespace but report paths below dir.
	for _, base := range candidatePaths(dir) {
		prefix := base + string(filepath.Separator)
		for m := range mounts {
			if rel, ok := strings.CutPrefix(m, prefix); ok {
				out[filepath.Join(dir, rel)] = true
			}
		}
	}
	return out, nil
}

// candidatePaths returns path and, if different, its symlink-resolved form,
// since /proc/self/mountinfo lists resolved paths.
func candidatePaths(path string) []string {
	path = filepath.Clean(path)
	out := []string{path}
	if r, err := filepath.EvalSymlinks(path); err == nil && r != path {
		out = append(out, r)
	}
	return out
}

// linuxMountPoints returns the mount points of /proc/self/mountinfo.
func linuxMountPoints() (map[string]bool, error) {
	infos, err := mount.ReadMountInfo()
	if err != nil {
		return nil, err
	}
	out := make(map[string]bool, len(infos))
	for _, mi := range infos {
		out[mi.MountPoint] = true
	}
	return out, nil
}
