//go:build !linux && !windows

package mount

import (
	"os"

	"github.com/ephemera-csi/ephemera/api"
)

// New returns an implementation whose every method returns ErrNotSupported, so
// that the SDK builds on macOS and the BSDs.
func New() Interface { return unsupported{} }

type unsupported struct{}

func (unsupported) MakeTarget(root, target string) error             { return ErrNotSupported }
func (unsupported) Mount(string, api.Source, string) error           { return ErrNotSupported }
func (unsupported) SetReadOnly(string, string, bool) error           { return ErrNotSupported }
func (unsupported) Unmount(root, target string) error                { return ErrNotSupported }
func (unsupported) IsMountPoint(root, target string) (bool, error)   { return false, ErrNotSupported }
func (unsupported) Inspect(root, target string) (*Mounted, error)    { return nil, ErrNotSupported }
func (unsupported) RemoveTarget(root, target string) error           { return ErrNotSupported }
func (unsupported) OpenTarget(root, target string) (*os.Root, error) { return nil, ErrNotSupported }
func (unsupported) Shows(*Mounted, api.Source) (bool, error)         { return false, ErrNotSupported }
func (unsupported) MountedAt(api.Source) ([]string, error)           { return nil, ErrNotSupported }
func (unsupported) Published(root string) ([]string, error)          { return nil, ErrNotSupported }
