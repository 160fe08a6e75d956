//go:build e2e

package e2e

import (
	"bufio"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
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

// unescapeMount decodes the octal escapes (\040 etc.) of mountinfo paths.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func readMountInfo() ([]mountInfo, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mountInfo
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		sep := -1
		for i, x := range fs {
			if x == "-" {
				sep = i
				break
			}
		}
		if sep < 6 || len(fs) < sep+4 {
			continue
		}
		id, _ := strconv.Atoi(fs[0])
		parent, _ := strconv.Atoi(fs[1])
		out = append(out, mountInfo{
			ID: id, Parent: parent, Dev: fs[2],
			Root: unescapeMount(fs[3]), MountPoint: unescapeMount(fs[4]), Options: fs[5],
			FSType: fs[sep+1], Source: unescapeMount(fs[sep+2]), SuperOpts: fs[sep+3],
		})
	}
	return out, sc.Err()
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
