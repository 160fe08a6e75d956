package api

import (
	"fmt"
	"io/fs"
	"slices"
	"strconv"
)

// Source is what a backend hands the framework to publish at a volume's target.
// The framework performs the mount (Linux) or link (Windows) through its platform
// seam, so backends never need mount privileges or syscalls of their own.
type Source struct {
	// Path is a directory to bind-mount (Linux) or link (Windows) at the target
	// when FSType is empty; otherwise the device to mount ("tmpfs" for tmpfs, a
	// block device such as /dev/loop3 for a filesystem).
	Path string `json:"path"`
	// FSType is "" for a directory, or the filesystem type to mount ("tmpfs",
	// "ext4", "xfs").
	FSType string `json:"fsType,omitempty"`
	// Options is filesystem-specific mount data, for example
	// ["size=67108864", "mode=0755"] for tmpfs: what the framework mounts the
	// filesystem with. A tmpfs source sets Tmpfs too, and Options to its
	// MountData.
	Options []string `json:"options,omitempty"`
	// Tmpfs are a tmpfs source's settings (FSType "tmpfs"), typed, so that
	// nothing needs to read them back from Options: a plugin server sends
	// them to the driver as they are. tmpfs.Backend sets it.
	Tmpfs *Tmpfs `json:"tmpfs,omitempty"`
	// Root, when set, confines a directory source: Path must lie beneath Root
	// and is resolved from Root without following symlinks (or ".."), so a
	// directory handed over by a less trusted party, such as an out-of-process
	// plugin, can never publish anything outside its own area. Backends that
	// name their own directories leave it empty.
	Root string `json:"root,omitempty"`
	// MountOptions are mount options of the mount at the target beside nosuid
	// and nodev, which every published volume has: an operator's choice per
	// backend (framework Options.Volumes.MountOptions, from mount.SafeOptions), which
	// the framework sets before it mounts. Backends leave it empty. Linux only.
	MountOptions []string `json:"mountOptions,omitempty"`
}

// IsDir reports whether the source is a directory to bind or link.
func (s Source) IsDir() bool { return s.FSType == "" }

// File is one file a content provider puts into a volume.
type File struct {
	Data []byte
	// Mode is the file's permission bits; 0 means 0644.
	Mode fs.FileMode
}

// Tmpfs are the settings of a tmpfs source.
type Tmpfs struct {
	// Size is the filesystem's size in bytes (size=).
	Size int64 `json:"size"`
	// Inodes is its inode limit (nr_inodes=); 0 is none, which the
	// framework's backends never set.
	Inodes int64 `json:"inodes,omitempty"`
	// Mode is the root directory's permission bits, with sticky, setgid
	// and setuid (mode=).
	Mode fs.FileMode `json:"mode"`
	// UID and GID own the root directory (uid=, gid=); unset is root.
	UID *uint32 `json:"uid,omitempty"`
	GID *uint32 `json:"gid,omitempty"`
}

// MountData is t as tmpfs mount options, in the order size, mode, uid, gid,
// nr_inodes.
func (t Tmpfs) MountData() []string {
	opts := []string{"size=" + strconv.FormatInt(t.Size, 10), fmt.Sprintf("mode=%04o", ModeBits(t.Mode))}
	if t.UID != nil {
		opts = append(opts, "uid="+strconv.FormatUint(uint64(*t.UID), 10))
	}
	if t.GID != nil {
		opts = append(opts, "gid="+strconv.FormatUint(uint64(*t.GID), 10))
	}
	if t.Inodes != 0 {
		opts = append(opts, "nr_inodes="+strconv.FormatInt(t.Inodes, 10))
	}
	return opts
}

// Clone is a deep copy of s.
func (s Source) Clone() Source {
	c := s
	c.Options = slices.Clone(s.Options)
	c.MountOptions = slices.Clone(s.MountOptions)
	if s.Tmpfs != nil {
		t := *s.Tmpfs
		if t.UID != nil {
			uid := *t.UID
			t.UID = &uid
		}
		if t.GID != nil {
			gid := *t.GID
			t.GID = &gid
		}
		c.Tmpfs = &t
	}
	return c
}
