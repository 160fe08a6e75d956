//go:build !windows

package vhdx

import (
	"context"
	"fmt"

	"github.com/ephemera-csi/ephemera/api"
)

// newHost returns a host without virtual disks: Create fails with
// api.ErrNotSupported, while Delete and List find nothing, so a driver with
// the backend configured still starts and cleans up on Linux. It makes no
// system calls, so it has no use for the contexts.
func newHost() (host, error) { return unsupported{}, nil }

type unsupported struct{}

var errUnsupported = fmt.Errorf("VHDX volumes need Windows: %w (use the dir, tmpfs or loop backend)", api.ErrNotSupported)

func (unsupported) FileExists(context.Context, string) (bool, error)      { return false, nil }
func (unsupported) CreateVHDX(context.Context, string, int64, bool) error { return errUnsupported }
func (unsupported) Rename(context.Context, string, string) error          { return errUnsupported }
func (unsupported) RemoveFile(context.Context, string) error              { return nil }
func (unsupported) AttachedDisk(context.Context, string) (uint32, bool, error) {
	return 0, false, errUnsupported
}
func (unsupported) Attach(context.Context, string) error                  { return errUnsupported }
func (unsupported) Detach(context.Context, string) error                  { return errUnsupported }
func (unsupported) PrepareDisk(context.Context, uint32) error             { return errUnsupported }
func (unsupported) VolumeOnDisk(context.Context, uint32) (string, error)  { return "", errUnsupported }
func (unsupported) IsFormatted(context.Context, string) (bool, error)     { return false, errUnsupported }
func (unsupported) Format(context.Context, string) error                  { return errUnsupported }
func (unsupported) MkdirAll(context.Context, string) error                { return errUnsupported }
func (unsupported) MountedVolume(context.Context, string) (string, error) { return "", nil }
func (unsupported) Mount(context.Context, string, string) error           { return errUnsupported }
func (unsupported) Unmount(context.Context, string, string) error         { return errUnsupported }
func (unsupported) RemoveDir(context.Context, string) error               { return nil }
func (unsupported) ListFiles(context.Context, string) ([]string, error)   { return nil, nil }

// The storage area is never stamped: no storage can exist here (List finds
// none), so there is nothing a stamp would protect or prove a leftover, and
// Dir may be a Windows path that means nothing on this system.
func (unsupported) ReadStamp(context.Context, string) (string, error) { return "", nil }
func (unsupported) WriteStamp(context.Context, string, string) error  { return nil }
