//go:build !linux && !windows

package mount

import "github.com/ephemera-csi/ephemera/api"

// New returns an implementation whose every method returns ErrNotSupported, so
// that the SDK builds on macOS and the BSDs.
func New() Interface { return unsupported{} }

type unsupported struct{}

func (unsupported) MakeTarget(root, target string) error      { return ErrNotSupported }
func (unsupported) Mount(src api.Source, target string) error { return ErrNotSupported }
func (unsupported) SetReadOnly(string, bool) error            { return ErrNotSupported }
func (unsupported) Unmount(target string) error               { return ErrNotSupported }
func (unsupported) IsMountPoint(target string) (bool, error)  { return false, ErrNotSupported }
func (unsupported) RemoveTarget(root, target string) error    { return ErrNotSupported }
