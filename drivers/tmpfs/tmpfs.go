// Package tmpfs is a memory-backed backend: each volume is a tmpfs mounted
// straight onto the pod's target path with a hard size limit (size=). Nothing is
// written to disk and nothing survives a node reboot.
//
// tmpfs pages count against node memory: budget them like memory, not like disk.
// They are charged to the memory cgroup of whoever writes them (normally the pod's
// container), but the kubelet does not count inline volumes against a pod's
// ephemeral-storage, so the node budget (Options.Capacity) is what bounds them.
//
// Attributes: "size" (handled by the framework; required unless Options.DefaultSize
// is set), "mode" (octal, default 01777 like /tmp),
// "uid", "gid", "nr_inodes". fsType must be unset or "tmpfs". Linux only: on other
// platforms Create fails with mount.ErrNotSupported.
package tmpfs

import (
	"context"
	"fmt"
	"io/fs"
	"math"
	"runtime"
	"strconv"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/mount"
)

// Attribute names.
const (
	ParamMode     = "mode"
	ParamUID      = "uid"
	ParamGID      = "gid"
	ParamNrInodes = "nr_inodes"
)

// SourceName is the mount source shown in /proc/mounts for Ephemera's tmpfs
// volumes.
const SourceName = "ephemera-tmpfs"

// Options configure the backend.
type Options struct {
	// DefaultSize applies to volumes without a "size" attribute. Defaults to 0:
	// "size" is required, so a tmpfs is never mounted without a limit.
	DefaultSize int64
	// DefaultMode is the root directory mode. Defaults to 01777 like /tmp, so any
	// container user can write; pods set "mode" to narrow it.
	DefaultMode fs.FileMode
}

// Backend implements framework.Backend, framework.Validator and
// framework.Finder.
type Backend struct{ opts Options }

// New returns a tmpfs backend.
func New(opts Options) *Backend {
	if opts.DefaultMode == 0 {
		opts.DefaultMode = 0o777 | fs.ModeSticky
	}
	return &Backend{opts: opts}
}

// Validate checks the tmpfs attributes and applies the default size.
func (b *Backend) Validate(v *api.Volume) error {
	if err := v.Params.Only(ParamMode, ParamUID, ParamGID, ParamNrInodes); err != nil {
		return err
	}
	if v.FSType != "" && v.FSType != "tmpfs" {
		return api.InvalidParamf("fsType %q is not supported by the tmpfs backend; leave it unset", v.FSType)
	}
	if v.Size == 0 {
		if b.opts.DefaultSize == 0 {
			return api.InvalidParamf("attribute %q is required for tmpfs volumes (for example size: 64Mi); tmpfs uses node memory", api.ParamSize)
		}
		v.Size = b.opts.DefaultSize
	}
	_, err := b.options(v)
	return err
}

func (b *Backend) options(v *api.Volume) ([]string, error) {
	mode, err := v.Params.FileMode(ParamMode, b.opts.DefaultMode)
	if err != nil {
		return nil, err
	}
	uid, err := v.Params.Int(ParamUID, -1, 0, math.MaxUint32-1)
	if err != nil {
		return nil, err
	}
	gid, err := v.Params.Int(ParamGID, -1, 0, math.MaxUint32-1)
	if err != nil {
		return nil, err
	}
	inodes, err := v.Params.Int(ParamNrInodes, 0, 1, math.MaxInt64)
	if err != nil {
		return nil, err
	}
	opts := []string{"size=" + strconv.FormatInt(v.Size, 10), "mode=" + octal(mode)}
	if uid >= 0 {
		opts = append(opts, "uid="+strconv.FormatInt(uid, 10))
	}
	if gid >= 0 {
		opts = append(opts, "gid="+strconv.FormatInt(gid, 10))
	}
	if inodes > 0 {
		opts = append(opts, "nr_inodes="+strconv.FormatInt(inodes, 10))
	}
	return opts, nil
}

// octal renders a FileMode the way tmpfs' mode= option expects.
func octal(m fs.FileMode) string { return fmt.Sprintf("%04o", api.ModeBits(m)) }

// Create returns the tmpfs to mount at the target. The framework mounts it; there
// is no storage to create beforehand.
func (b *Backend) Create(_ context.Context, v *api.Volume) (api.Source, error) {
	if runtime.GOOS != "linux" {
		return api.Source{}, fmt.Errorf("tmpfs volumes: %w (use the dir backend)", mount.ErrNotSupported)
	}
	opts, err := b.options(v)
	if err != nil {
		return api.Source{}, err
	}
	return api.Source{Path: SourceName, FSType: "tmpfs", Options: opts}, nil
}

// Find returns the source every tmpfs volume is mounted from: a tmpfs of this
// backend's source name. The storage lives only in that mount, so at a
// volume's own target it identifies the volume.
func (b *Backend) Find(context.Context, *api.Volume) (api.Source, error) {
	return api.Source{Path: SourceName, FSType: "tmpfs"}, nil
}

// Delete has nothing to free: unmounting the target released the memory.
func (b *Backend) Delete(context.Context, *api.Volume) error { return nil }
