//go:build !windows

package vhdx

import (
	"fmt"

	"github.com/ephemera-csi/ephemera/framework/mount"
)

// newHost returns a host without virtual disks: Create fails with
// mount.ErrNotSupported, while Delete and List find nothing, so a driver with
// the backend configured still starts and cleans up on Linux.
func newHost() host { return unsupported{} }

type unsupported struct{}

var errUnsupported = fmt.Errorf("VHDX volumes need Windows: %w (use the dir, tmpfs or loop backend)", mount.ErrNotSupported)

func (unsupported) FileExists(string) (bool, error)           { return false, nil }
func (unsupported) CreateVHDX(string, int64, bool) error      { return errUnsupported }
func (unsupported) Rename(string, string) error               { return errUnsupported }
func (unsupported) RemoveFile(string) error                   { return nil }
func (unsupported) AttachedDisk(string) (uint32, bool, error) { return 0, false, errUnsupported }
func (unsupported) Attach(string) error                       { return errUnsupported }
func (unsupported) Detach(string) error                       { return errUnsupported }
func (unsupported) PrepareDisk(uint32) error                  { return errUnsupported }
func (unsupported) VolumeOnDisk(uint32) (string, error)       { return "", errUnsupported }
func (unsupported) IsFormatted(string) (bool, error)          { return false, errUnsupported }
func (unsupported) Format(string) error                       { return errUnsupported }
func (unsupported) MkdirAll(string) error                     { return errUnsupported }
func (unsupported) MountedVolume(string) (string, error)      { return "", nil }
func (unsupported) Mount(string, string) error                { return errUnsupported }
func (unsupported) Unmount(string, string) error              { return errUnsupported }
func (unsupported) RemoveDir(string) error                    { return nil }
func (unsupported) ListFiles(string) ([]string, error)        { return nil, nil }
