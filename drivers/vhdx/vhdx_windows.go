//go:build windows

package vhdx

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"syscall"

	"github.com/Microsoft/go-winio/vhd"
	"github.com/kubernetes-csi/csi-proxy/v2/pkg/disk"
	diskapi "github.com/kubernetes-csi/csi-proxy/v2/pkg/disk/hostapi"
	"github.com/kubernetes-csi/csi-proxy/v2/pkg/volume"
	volumeapi "github.com/kubernetes-csi/csi-proxy/v2/pkg/volume/hostapi"
	"golang.org/x/sys/windows"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/stamp"
)

// Which API does what (all in-process; no csi-proxy server, no PowerShell):
//
//	create, attach, detach, find the disk   go-winio/vhd (virtdisk.dll)
//	online, GPT + basic partition           csi-proxy/v2 pkg/disk (WMI MSFT_Disk)
//	find, check, format (NTFS) the volume   csi-proxy/v2 pkg/volume (WMI MSFT_Volume)
//	mount/unmount in a folder               csi-proxy/v2 pkg/volume (SetVolumeMountPoint,
//	                                        DeleteVolumeMountPoint)
//	which volume is mounted at a folder     x/sys/windows GetVolumeNameForVolumeMountPoint
//	files and folders                       os
//	the storage stamp                       framework/stamp
//
// Contexts: none of these calls can be cancelled once started. csi-proxy's
// methods take a context and are passed the caller's, but v2.0.0-alpha.2 does
// not use it (its WMI calls take none). So every method checks ctx before it
// starts (step), and again before a second call that changes something
// (PrepareDisk's partitioning, Attach's attach after the open); a started call
// runs to completion. Calls that only look, or that must follow the one before
// (closing a handle), are not preceded by a check. The backend's steps are
// idempotent, so where a method stops the next Create or Delete carries on.

// newHost sets up csi-proxy's disk and volume APIs (in process; no I/O).
func newHost() (host, error) {
	d, err := disk.New(diskapi.New())
	if err != nil {
		return nil, fmt.Errorf("the csi-proxy disk API cannot be initialised: %w", err)
	}
	v, err := volume.New(volumeapi.New())
	if err != nil {
		return nil, fmt.Errorf("the csi-proxy volume API cannot be initialised: %w", err)
	}
	return &winHost{disk: d, volume: v}, nil
}

type winHost struct {
	disk   *disk.Disk
	volume *volume.Volume
}

// step returns ctx.Err() when ctx is done: checked before each system call,
// which runs to completion once started.
func step(ctx context.Context) error { return ctx.Err() }

func (*winHost) FileExists(ctx context.Context, path string) (bool, error) {
	if err := step(ctx); err != nil {
		return false, err
	}
	_, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// CreateVHDX allocates the whole file of a fixed-size VHDX before it returns,
// which takes seconds per GiB: a deadline that passes meanwhile is seen by the
// backend's next step.
func (*winHost) CreateVHDX(ctx context.Context, path string, size int64, dynamic bool) error {
	if err := step(ctx); err != nil {
		return err
	}
	flags := vhd.CreateVirtualDiskFlagFullPhysicalAllocation
	if dynamic {
		flags = vhd.CreateVirtualDiskFlagNone
	}
	params := &vhd.CreateVirtualDiskParameters{
		Version:  2,
		Version2: vhd.CreateVersion2{MaximumSize: uint64(size)},
	}
	h, err := vhd.CreateVirtualDisk(path, vhd.VirtualDiskAccessNone, flags, params)
	if errors.Is(err, windows.ERROR_DISK_FULL) || errors.Is(err, windows.ERROR_HANDLE_DISK_FULL) {
		return fmt.Errorf("%w: %w", api.ErrResourceExhausted, err) // the kubelet retries
	}
	if err != nil {
		return err
	}
	return syscall.CloseHandle(h)
}

func (*winHost) Rename(ctx context.Context, from, to string) error {
	if err := step(ctx); err != nil {
		return err
	}
	return os.Rename(from, to)
}

func (*winHost) RemoveFile(ctx context.Context, path string) error {
	if err := step(ctx); err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

func open(path string) (syscall.Handle, error) {
	return vhd.OpenVirtualDisk(path, vhd.VirtualDiskAccessNone,
		vhd.OpenVirtualDiskFlagCachedIO|vhd.OpenVirtualDiskFlagIgnoreRelativeParentLocator)
}

// AttachedDisk opens the file and asks for its physical path, which only an
// attached virtual disk has.
func (*winHost) AttachedDisk(ctx context.Context, path string) (uint32, bool, error) {
	if err := step(ctx); err != nil {
		return 0, false, err
	}
	h, err := open(path)
	if err != nil {
		return 0, false, err
	}
	defer syscall.CloseHandle(h) //nolint:errcheck
	p, err := vhd.GetVirtualDiskPhysicalPath(h)
	if err != nil || p == "" {
		return 0, false, nil // not attached
	}
	n, err := parseDiskNumber(p)
	return n, err == nil, err
}

func (*winHost) Attach(ctx context.Context, path string) error {
	if err := step(ctx); err != nil {
		return err
	}
	h, err := open(path)
	if err != nil {
		return err
	}
	defer syscall.CloseHandle(h) //nolint:errcheck
	if err := step(ctx); err != nil {
		return err
	}
	return vhd.AttachVirtualDisk(h,
		vhd.AttachVirtualDiskFlagPermanentLifetime|vhd.AttachVirtualDiskFlagNoDriveLetter,
		&vhd.AttachVirtualDiskParameters{Version: 2})
}

func (*winHost) Detach(ctx context.Context, path string) error {
	if err := step(ctx); err != nil {
		return err
	}
	return vhd.DetachVhd(path)
}

// PrepareDisk makes two WMI calls; stopped between them, it leaves an online
// disk that the next Create partitions.
func (w *winHost) PrepareDisk(ctx context.Context, n uint32) error {
	if err := step(ctx); err != nil {
		return err
	}
	if _, err := w.disk.SetDiskState(ctx, &disk.SetDiskStateRequest{DiskNumber: n, IsOnline: true}); err != nil {
		return fmt.Errorf("bringing disk %d online: %w", n, err)
	}
	if err := step(ctx); err != nil {
		return err
	}
	_, err := w.disk.PartitionDisk(ctx, &disk.PartitionDiskRequest{DiskNumber: n})
	return err
}

func (w *winHost) VolumeOnDisk(ctx context.Context, n uint32) (string, error) {
	if err := step(ctx); err != nil {
		return "", err
	}
	resp, err := w.volume.ListVolumesOnDisk(ctx, &volume.ListVolumesOnDiskRequest{DiskNumber: n})
	if err != nil {
		return "", err
	}
	if len(resp.VolumeIDs) == 0 {
		return "", fmt.Errorf("no volume on disk %d", n)
	}
	return resp.VolumeIDs[0], nil
}

func (w *winHost) IsFormatted(ctx context.Context, id string) (bool, error) {
	if err := step(ctx); err != nil {
		return false, err
	}
	resp, err := w.volume.IsVolumeFormatted(ctx, &volume.IsVolumeFormattedRequest{VolumeID: id})
	if err != nil {
		return false, err
	}
	return resp.Formatted, nil
}

func (w *winHost) Format(ctx context.Context, id string) error {
	if err := step(ctx); err != nil {
		return err
	}
	_, err := w.volume.FormatVolume(ctx, &volume.FormatVolumeRequest{VolumeID: id})
	return err
}

func (*winHost) MkdirAll(ctx context.Context, dir string) error {
	if err := step(ctx); err != nil {
		return err
	}
	return os.MkdirAll(dir, 0o700)
}

func withSep(p string) string { return strings.TrimRight(p, `\`) + `\` }

// MountedVolume asks Windows which volume the folder is a mount point of.
func (*winHost) MountedVolume(ctx context.Context, dir string) (string, error) {
	if err := step(ctx); err != nil {
		return "", err
	}
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	p, err := windows.UTF16PtrFromString(withSep(dir))
	if err != nil {
		return "", err
	}
	buf := make([]uint16, 50) // \\?\Volume{GUID}\ is 49 characters
	if err := windows.GetVolumeNameForVolumeMountPoint(p, &buf[0], uint32(len(buf))); err != nil {
		return "", nil // not a mount point (or one whose volume is gone)
	}
	return windows.UTF16ToString(buf), nil
}

func (w *winHost) Mount(ctx context.Context, id, dir string) error {
	if err := step(ctx); err != nil {
		return err
	}
	_, err := w.volume.MountVolume(ctx, &volume.MountVolumeRequest{VolumeID: id, TargetPath: dir})
	return err
}

func (w *winHost) Unmount(ctx context.Context, id, dir string) error {
	if err := step(ctx); err != nil {
		return err
	}
	_, err := w.volume.UnmountVolume(ctx, &volume.UnmountVolumeRequest{VolumeID: id, TargetPath: dir})
	return err
}

// RemoveDir removes a stale mount point (its volume detached) and the folder.
func (*winHost) RemoveDir(ctx context.Context, dir string) error {
	if err := step(ctx); err != nil {
		return err
	}
	if p, err := windows.UTF16PtrFromString(withSep(dir)); err == nil {
		_ = windows.DeleteVolumeMountPoint(p) // fails when dir is no mount point
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

func (*winHost) ListFiles(ctx context.Context, dir string) ([]string, error) {
	if err := step(ctx); err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	names := make([]string, len(entries))
	for i, e := range entries {
		names[i] = e.Name()
	}
	return names, nil
}

func (*winHost) ReadStamp(ctx context.Context, dir string) (string, error) {
	if err := step(ctx); err != nil {
		return "", err
	}
	return stamp.Read(dir)
}

func (*winHost) WriteStamp(ctx context.Context, dir, id string) error {
	if err := step(ctx); err != nil {
		return err
	}
	return stamp.Write(dir, id)
}
