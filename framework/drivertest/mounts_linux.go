package drivertest

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ephemera-csi/ephemera/framework/mount"
)

// detachLeftovers detaches, deepest first, every mount below the kubelet root
// that the test made and did not remove (it failed before its unpublish), so
// that a failing test leaves no mount on the machine. A passing test has
// none: RequireClean says so.
func (h *Harness) detachLeftovers() {
	root, err := filepath.Abs(h.Options.Node.KubeletRootDir)
	if err != nil {
		return
	}
	now, err := mountPointsUnder(root)
	if err != nil {
		h.t.Logf("drivertest: listing the mounts left below %s: %v", root, err)
		return
	}
	var left []string
	for p := range now {
		if !h.before[p] {
			left = append(left, p)
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(left))) // children before their parents
	for _, p := range left {
		err := unix.Unmount(p, unix.MNT_DETACH)
		if err != nil {
			h.t.Logf("drivertest: detaching %s, left by the test: %v", p, err)
		}
		for i := 0; err == nil && i < 8; i++ { // and what is stacked below it
			err = unix.Unmount(p, unix.MNT_DETACH)
		}
	}
}

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
