package mount

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// MountInfo is one line of /proc/self/mountinfo (see proc_pid_mountinfo(5)).
type MountInfo struct {
	// ID and ParentID are the mount's ID and its parent's.
	ID, ParentID int
	// Major and Minor are the st_dev of files on the filesystem.
	Major, Minor int
	// Root is the directory of the filesystem that is mounted (not "/" for a bind
	// mount of a subdirectory).
	Root string
	// MountPoint is where it is mounted, relative to the process's root.
	MountPoint string
	// FSType is the filesystem type, for example "tmpfs" or "ext4".
	FSType string
	// Source is the filesystem-specific source, for example "/dev/loop3", or
	// "none".
	Source string
	// Options are the per-mount options ("rw,nosuid,relatime"), and SuperOptions
	// the per-superblock ones ("rw,size=1024k"). Both are as the kernel prints
	// them, with escapes left in place.
	Options, SuperOptions string
}

// ReadMountInfo reads and parses /proc/self/mountinfo. Its cost grows with the
// number of mounts on the node: use it for reconciliation and tests, not on the
// publish path (use [Interface.IsMountPoint]).
func ReadMountInfo() ([]MountInfo, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	return ParseMountInfo(bytes.NewReader(b))
}

// ParseMountInfo parses the mountinfo format. Octal escapes (\040 for a space,
// \011, \012, \134) in Root, MountPoint, FSType and Source are decoded.
func ParseMountInfo(r io.Reader) ([]MountInfo, error) {
	var infos []MountInfo
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if line == "" {
			continue
		}
		mi, err := parseMountInfoLine(line)
		if err != nil {
			return nil, fmt.Errorf("mountinfo line %d %q: %w", n, line, err)
		}
		infos = append(infos, mi)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	return infos, nil
}

func parseMountInfoLine(line string) (MountInfo, error) {
	// 36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
	// Spaces inside fields are escaped, so a single space separates fields and
	// an empty field (an empty source) stays a field.
	f := strings.Split(line, " ")
	sep := -1
	for i := 6; i < len(f); i++ {
		if f[i] == "-" {
			sep = i
			break
		}
	}
	if len(f) < 10 || sep < 0 || len(f) != sep+4 {
		return MountInfo{}, fmt.Errorf("want 6 fields, optional fields, \"-\" and 3 fields; got %d fields", len(f))
	}
	var mi MountInfo
	var err error
	if mi.ID, err = strconv.Atoi(f[0]); err != nil {
		return MountInfo{}, fmt.Errorf("mount ID: %w", err)
	}
	if mi.ParentID, err = strconv.Atoi(f[1]); err != nil {
		return MountInfo{}, fmt.Errorf("parent ID: %w", err)
	}
	maj, min, ok := strings.Cut(f[2], ":")
	if !ok {
		return MountInfo{}, fmt.Errorf("device %q: want major:minor", f[2])
	}
	if mi.Major, err = strconv.Atoi(maj); err != nil {
		return MountInfo{}, fmt.Errorf("device major: %w", err)
	}
	if mi.Minor, err = strconv.Atoi(min); err != nil {
		return MountInfo{}, fmt.Errorf("device minor: %w", err)
	}
	mi.Root = unescape(f[3])
	mi.MountPoint = unescape(f[4])
	mi.Options = f[5]
	mi.FSType = unescape(f[sep+1])
	mi.Source = unescape(f[sep+2])
	mi.SuperOptions = f[sep+3]
	return mi, nil
}

// unescape decodes the kernel's \ooo escapes; anything else is kept as is.
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) && s[i+1] <= '3' {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(c byte) bool { return '0' <= c && c <= '7' }

// MountsAt counts the mounts whose MountPoint is path (after cleaning it); more
// than one means mounts are stacked there.
func MountsAt(infos []MountInfo, path string) int {
	path = filepath.Clean(path)
	n := 0
	for i := range infos {
		if infos[i].MountPoint == path {
			n++
		}
	}
	return n
}

// MountsUnder returns the mounts at dir or below it (a separator-aware prefix
// match), in mount table order; unmount them in reverse order.
func MountsUnder(infos []MountInfo, dir string) []MountInfo {
	dir = filepath.Clean(dir)
	prefix := dir + "/"
	if dir == "/" {
		prefix = "/"
	}
	var out []MountInfo
	for _, mi := range infos {
		if mi.MountPoint == dir || strings.HasPrefix(mi.MountPoint, prefix) {
			out = append(out, mi)
		}
	}
	return out
}
