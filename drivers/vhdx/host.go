package vhdx

import (
	"fmt"
	"strconv"
	"strings"
)

// host is every operating-system operation the backend performs. The Windows
// implementation (vhdx_windows.go) calls virtdisk.dll and csi-proxy; tests use
// a fake that models a node's disks.
type host interface {
	// FileExists reports whether path exists.
	FileExists(path string) (bool, error)
	// CreateVHDX creates a new VHDX file of size bytes at path (fixed size
	// unless dynamic). It fails if path exists.
	CreateVHDX(path string, size int64, dynamic bool) error
	// Rename renames a file.
	Rename(from, to string) error
	// RemoveFile removes a file; nil if it does not exist.
	RemoveFile(path string) error
	// AttachedDisk returns the number of the disk the VHDX at path is attached
	// as, or ok false when it is not attached.
	AttachedDisk(path string) (disk uint32, ok bool, err error)
	// Attach attaches the VHDX at path for good (permanent lifetime, no drive
	// letter).
	Attach(path string) error
	// Detach detaches the VHDX at path.
	Detach(path string) error
	// PrepareDisk brings the disk online and gives it a GPT partition table with
	// one basic partition, unless it has them.
	PrepareDisk(disk uint32) error
	// VolumeOnDisk returns the ID of the volume of the disk's basic partition
	// (\\?\Volume{guid}\).
	VolumeOnDisk(disk uint32) (volumeID string, err error)
	// IsFormatted reports whether the volume holds an NTFS filesystem.
	IsFormatted(volumeID string) (bool, error)
	// Format formats the volume NTFS.
	Format(volumeID string) error
	// MkdirAll creates a directory and its parents.
	MkdirAll(dir string) error
	// MountedVolume returns the ID of the volume mounted at the folder dir, or
	// "" when none is (or dir does not exist).
	MountedVolume(dir string) (volumeID string, err error)
	// Mount mounts the volume at the existing, empty folder dir.
	Mount(volumeID, dir string) error
	// Unmount flushes the volume and removes its mount point at dir.
	Unmount(volumeID, dir string) error
	// RemoveDir removes the (empty) folder dir, and a stale mount point on it;
	// nil if it does not exist.
	RemoveDir(dir string) error
	// ListFiles returns the names of the entries of dir (none if it does not
	// exist).
	ListFiles(dir string) ([]string, error)
}

// parseDiskNumber extracts N from the physical path of a disk,
// \\.\PhysicalDriveN (the form GetVirtualDiskPhysicalPath returns).
func parseDiskNumber(physicalPath string) (uint32, error) {
	const prefix = `\\.\physicaldrive`
	if len(physicalPath) <= len(prefix) || !strings.EqualFold(physicalPath[:len(prefix)], prefix) {
		return 0, fmt.Errorf("unexpected physical path %q of a virtual disk", physicalPath)
	}
	n, err := strconv.ParseUint(physicalPath[len(prefix):], 10, 32)
	if err != nil {
		return 0, fmt.Errorf("unexpected physical path %q of a virtual disk: %v", physicalPath, err)
	}
	return uint32(n), nil
}

// volumeKey reduces a volume ID to "volume{guid}" in lower case, so that the
// forms Windows returns (\\?\Volume{guid}\, Volume{guid}, different case)
// compare equal. It returns "" for an ID without a volume GUID.
func volumeKey(id string) string {
	l := strings.ToLower(id)
	i := strings.Index(l, "volume{")
	if i < 0 {
		return ""
	}
	j := strings.IndexByte(l[i:], '}')
	if j < 0 {
		return ""
	}
	return l[i : i+j+1]
}

func sameVolume(a, b string) bool {
	ka := volumeKey(a)
	return ka != "" && ka == volumeKey(b)
}
