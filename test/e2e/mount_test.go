//go:build e2e && linux

package e2e

import (
	"fmt"

	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/ephemera-csi/ephemera/framework/mount"
)

// mountInfo is one line of /proc/self/mountinfo.
type mountInfo struct {
	ID, Parent int
	Dev        string // major:minor
	Root       string
	MountPoint string
	Options    string // per-mount options (ro/rw, ...)
	FSType     string
	Source     string
	SuperOpts  string // super-block options (size=..., mode=...)
}

func (m mountInfo) readOnly() bool {
	for _, o := range strings.Split(m.Options, ",") {
		if o == "ro" {
			return true
		}
	}
	return false
}

func readMountInfo() ([]mountInfo, error) {
	infos, err := mount.ReadMountInfo()
	if err != nil {
		return nil, err
	}
	out := make([]mountInfo, len(infos))
	for i, mi := range infos {
		out[i] = mountInfo{
			ID: mi.ID, Parent: mi.ParentID, Dev: fmt.Sprintf("%d:%d", mi.Major, mi.Minor),
			Root: mi.Root, MountPoint: mi.MountPoint, Options: mi.Options,
			FSType: mi.FSType, Source: mi.Source, SuperOpts: mi.SuperOptions,
		}
	}
	return out, nil
}

// mountsAt returns the mounts whose mount point is exactly path (stacked mounts
// appear more than once).
func mountsAt(path string) []mountInfo {
	all, _ := readMountInfo()
	var out []mountInfo
	for _, m := range all {
		if m.MountPoint == path {
			out = append(out, m)
		}
	}
	return out
}

// mountsUnder returns the mounts at or below dir.
func mountsUnder(dir string) []mountInfo {
	dir = filepath.Clean(dir)
	all, _ := readMountInfo()
	var out []mountInfo
	for _, m := range all {
		if m.MountPoint == dir || strings.HasPrefix(m.MountPoint, dir+"/") {
			out = append(out, m)
		}
	}
	return out
}

// unmountAllUnder unmounts every mount at or below dir, deepest first, repeating
// while anything is left (stacked mounts), lazily as a last resort.
func unmountAllUnder(dir string) []string {
	var failed []string
	for round := 0; round < 10; round++ {
		ms := mountsUnder(dir)
		if len(ms) == 0 {
			return nil
		}
		sort.SliceStable(ms, func(i, j int) bool {
			di, dj := strings.Count(ms[i].MountPoint, "/"), strings.Count(ms[j].MountPoint, "/")
			if di != dj {
				return di > dj
			}
			return ms[i].ID > ms[j].ID // later mounts first when stacked
		})
		failed = failed[:0]
		for _, m := range ms {
			flags := 0
			if round >= 3 {
				flags = syscall.MNT_DETACH
			}
			if err := syscall.Unmount(m.MountPoint, flags); err != nil && err != syscall.EINVAL && err != syscall.ENOENT {
				failed = append(failed, m.MountPoint+": "+err.Error())
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return failed
}
