package vhdx

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// host is every operating-system operation the backend performs. The Windows
// implementation (vhdx_windows.go) calls virtdisk.dll and csi-proxy; tests use
// a fake that models a node's disks.
//
// Every method can block on I/O and takes a context. A method does not start
// a system call once ctx is done: it returns an error wrapping ctx.Err()
// instead. A system call that has started runs to completion: none of those
// behind the methods (virtdisk.dll, WMI through csi-proxy, which accepts a
// context but does not use it, file operations) can be cancelled, and
// abandoning one in a goroutine would leave it changing the volume while the
// next Create or Delete works on it. A method that makes several system calls
// that change something may check ctx between them, so wherever it stops it
// must leave a state that the backend's next idempotent Create or Delete
// completes.
type host interface {
	// FileExists reports whether path exists.
	FileExists(ctx context.Context, path string) (bool, error)
	// CreateVHDX creates a new VHDX file of size bytes at path (fixed size
	// unless dynamic). It fails if path exists.
	CreateVHDX(ctx context.Context, path string, size int64, dynamic bool) error
	// Rename renames a file.
	Rename(ctx context.Context, from, to string) error
	// RemoveFile removes a file; nil if it does not exist.
	RemoveFile(ctx context.Context, path string) error
	// AttachedDisk returns the number of the disk the VHDX at path is attached
	// as, or ok false when it is not attached.
	AttachedDisk(ctx context.Context, path string) (disk uint32, ok bool, err error)
	// Attach attaches the VHDX at path for good (permanent lifetime, no drive
	// letter).
	Attach(ctx context.Context, path string) error
	// Detach detaches the VHDX at path.
	Detach(ctx context.Context, path string) error
	// PrepareDisk brings the disk online and gives it a GPT partition table with
	// one basic partition, unless it has them.
	PrepareDisk(ctx context.Context, disk uint32) error
	// VolumeOnDisk returns the ID of the volume of the disk's basic partition
	// (\\?\Volume{guid}\).
	VolumeOnDisk(ctx context.Context, disk uint32) (volumeID string, err error)
	// IsFormatted reports whether the volume holds an NTFS filesystem.
	IsFormatted(ctx context.Context, volumeID string) (bool, error)
	// Format formats the volume NTFS.
	Format(ctx context.Context, volumeID string) error
	// MkdirAll creates a directory and its parents.
	MkdirAll(ctx context.Context, dir string) error
	// MountedVolume returns the ID of the volume mounted at the folder dir, or
	// "" when none is (or dir does not exist).
	MountedVolume(ctx context.Context, dir string) (volumeID string, err error)
	// Mount mounts the volume at the existing, empty folder dir.
	Mount(ctx context.Context, volumeID, dir string) error
	// Unmount flushes the volume and removes its mount point at dir.
	Unmount(ctx context.Context, volumeID, dir string) error
	// RemoveDir removes the (empty) folder dir, and a stale mount point on it;
	// nil if it does not exist.
	RemoveDir(ctx context.Context, dir string) error
	// ListFiles returns the names of the entries of dir (none if it does not
	// exist).
	ListFiles(ctx context.Context, dir string) ([]string, error)
	// ReadStamp returns the state store identity stamped in dir
	// (framework/stamp.Read), "" when none.
	ReadStamp(ctx context.Context, dir string) (string, error)
	// WriteStamp durably stamps dir, created if missing, with id
	// (framework/stamp.Write).
	WriteStamp(ctx context.Context, dir, id string) error
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
