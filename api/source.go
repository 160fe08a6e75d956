package api

import "io/fs"

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
	// ["size=67108864", "mode=0755"] for tmpfs.
	Options []string `json:"options,omitempty"`
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
