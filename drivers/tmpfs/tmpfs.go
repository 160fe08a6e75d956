package tmpfs

import (
	"context"
	"fmt"
	"io/fs"
	"runtime"
	"strconv"

	"github.com/ephemera-csi/ephemera/api"
)

// ParamNrInodes is the attribute of a volume's inode limit. The backend's
// other attributes are api.ParamMode, api.ParamUID and api.ParamGID
// (Backend.Attributes).
const ParamNrInodes = "nr_inodes"

// SourceName is the mount source shown in /proc/mounts for Ephemera's tmpfs
// volumes.
const SourceName = "ephemera-tmpfs"

// Options configure the backend. New refuses negative values and a
// DefaultMode with bits other than the permission, sticky, setgid and setuid
// bits, naming the field.
type Options struct {
	// DefaultSize applies to volumes without a "size" attribute. Defaults to 0:
	// "size" is required, so a tmpfs is never mounted without a limit.
	DefaultSize int64
	// DefaultMode is the root directory mode: permission bits plus
	// fs.ModeSticky, fs.ModeSetgid and fs.ModeSetuid (not the octal 0o1000 of
	// chmod(2)). Defaults to 0o777|fs.ModeSticky (01777, like /tmp) when zero,
	// so any container user can write; pods set "mode" to narrow it.
	DefaultMode fs.FileMode
	// BytesPerInode derives the inode limit (nr_inodes) of a volume without a
	// "nr_inodes" attribute: size/BytesPerInode, at least MinInodes and at most
	// MaxInodes. Defaults to DefaultBytesPerInode (4096: one inode per page of
	// size) when zero.
	BytesPerInode int64
	// MinInodes is the least nr_inodes a volume without "nr_inodes" gets, so
	// that small volumes still hold a useful number of files. Defaults to
	// DefaultMinInodes (1024) when zero. MaxInodes wins when it is lower.
	MinInodes int64
	// MaxInodes is the largest "nr_inodes" a pod may request, and the upper
	// bound of the derived default. Defaults to DefaultMaxInodes (1Mi inodes)
	// when zero; there is no "unlimited".
	MaxInodes int64
	// MaxInodesName is what a refusal of a pod's "nr_inodes" calls MaxInodes:
	// the flag that sets it in a driver with flags (ephemera-scratch:
	// "--tmpfs-max-inodes"). Defaults to "tmpfs.Options.MaxInodes".
	MaxInodesName string
}

// Defaults of Options' inode limits. Every inode a pod creates (an empty file,
// a directory, a symlink) costs kernel memory (see the package documentation)
// that "size" does not limit and dropping caches does not free.
const (
	// DefaultBytesPerInode is one inode per 4KiB page: a file holding data
	// takes at least one page of size anyway, so only empty files, directories
	// and symlinks can hit the limit before the size does, and their kernel
	// memory is bounded by a fraction of size.
	DefaultBytesPerInode = 4096
	// DefaultMinInodes is the floor of the derived default: a 1Mi volume still
	// holds 1024 entries.
	DefaultMinInodes = 1024
	// DefaultMaxInodes is 1Mi inodes: what a 4Gi volume (the scratch driver's
	// default --max-volume-size) derives.
	DefaultMaxInodes = 1 << 20
)

// Backend implements framework.Backend, framework.AttributeDeclarer,
// framework.Validator, framework.Finder and framework.MountOnly.
type Backend struct {
	opts  Options
	attrs api.Attributes
}

// New returns a tmpfs backend, or an error naming the first invalid option. It
// starts nothing and touches no file.
func New(opts Options) (*Backend, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	opts.setDefaults()
	return &Backend{opts: opts, attrs: api.Attributes{
		api.ModeAttr(opts.DefaultMode),
		api.UIDAttr(), // none: the tmpfs root is the mounter's (the driver's)
		api.GIDAttr(),
		// Checked by Validate, whose messages need the size and the caps.
		api.StringAttr(ParamNrInodes),
	}}, nil
}

// Attributes declares the tmpfs attributes: "mode" (Options.DefaultMode),
// "uid", "gid" (unset: the tmpfs root is the driver's) and "nr_inodes".
func (b *Backend) Attributes() api.Attributes { return b.attrs }

// modeBits are the FileMode bits DefaultMode may have: those tmpfs' mode=
// takes (api.ModeBits).
const modeBits = fs.ModePerm | fs.ModeSticky | fs.ModeSetgid | fs.ModeSetuid

func (o *Options) validate() error {
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"DefaultSize", o.DefaultSize},
		{"BytesPerInode", o.BytesPerInode},
		{"MinInodes", o.MinInodes},
		{"MaxInodes", o.MaxInodes},
	} {
		if f.v < 0 {
			return fmt.Errorf("tmpfs backend: %s %d must not be negative (0 takes the default)", f.name, f.v)
		}
	}
	if extra := o.DefaultMode &^ modeBits; extra != 0 {
		return fmt.Errorf("tmpfs backend: DefaultMode %#o has bits %#o other than the permission, sticky, setgid and setuid bits; "+
			"write 01777 as 0o777|fs.ModeSticky (fs.ModeSetgid, fs.ModeSetuid), not 0o1777", uint32(o.DefaultMode), uint32(extra))
	}
	return nil
}

func (o *Options) setDefaults() {
	if o.DefaultMode == 0 {
		o.DefaultMode = 0o777 | fs.ModeSticky
	}
	if o.BytesPerInode == 0 {
		o.BytesPerInode = DefaultBytesPerInode
	}
	if o.MinInodes == 0 {
		o.MinInodes = DefaultMinInodes
	}
	if o.MaxInodes == 0 {
		o.MaxInodes = DefaultMaxInodes
	}
}

// Validate checks the tmpfs attributes and applies the default size.
func (b *Backend) Validate(v *api.Volume) error {
	if v.FSType != "" && v.FSType != "tmpfs" {
		return api.InvalidParamf("fsType %q is not supported by the tmpfs backend; leave it unset", v.FSType)
	}
	if v.Size == 0 {
		if b.opts.DefaultSize == 0 {
			return api.InvalidParamf("attribute %q is required for tmpfs volumes (for example size: 64Mi); tmpfs uses node memory", api.ParamSize)
		}
		v.Size = b.opts.DefaultSize
	}
	_, err := b.settings(v)
	return err
}

// settings are the tmpfs settings of v, whose attributes are applied
// (b.attrs.Apply).
func (b *Backend) settings(v *api.Volume) (*api.Tmpfs, error) {
	inodes, err := b.inodes(v)
	if err != nil {
		return nil, err
	}
	t := &api.Tmpfs{Size: v.Size, Inodes: inodes, Mode: v.Values.Mode(api.ParamMode)}
	for _, id := range []struct {
		key string
		to  **uint32
	}{{api.ParamUID, &t.UID}, {api.ParamGID, &t.GID}} {
		if v.Values.Has(id.key) {
			n := uint32(v.Values.Int(id.key))
			*id.to = &n
		}
	}
	return t, nil
}

// inodes returns the volume's nr_inodes: the "nr_inodes" attribute, at most
// MaxInodes, or else the default derived from the size. It is never 0, which
// the kernel reads as "unlimited".
func (b *Backend) inodes(v *api.Volume) (int64, error) {
	def := b.defaultInodes(v.Size)
	if !v.Values.Has(ParamNrInodes) {
		return def, nil
	}
	s := v.Values.String(ParamNrInodes)
	n, err := strconv.ParseInt(s, 10, 64)
	switch {
	case err != nil || n < 0:
		return 0, api.InvalidParamf("attribute %q: %q is not a whole number of inodes between 1 and %d", ParamNrInodes, s, b.opts.MaxInodes)
	case n == 0:
		return 0, api.InvalidParamf("attribute %q: 0 means no inode limit to the kernel, which would leave the kernel "+
			"memory of the volume's files unbounded; request between 1 and %d, or leave %q out for the default (%d for this size)",
			ParamNrInodes, b.opts.MaxInodes, ParamNrInodes, def)
	case n > b.opts.MaxInodes:
		name := b.opts.MaxInodesName
		if name == "" {
			name = "tmpfs.Options.MaxInodes"
		}
		return 0, api.InvalidParamf("attribute %q: %d exceeds this driver's cap of %d inodes (%s): inodes take kernel memory that %q does not limit; request at most %d, "+
			"or leave %q out for the default (%d for this size)", ParamNrInodes, n, b.opts.MaxInodes, name, api.ParamSize,
			b.opts.MaxInodes, ParamNrInodes, def)
	}
	return n, nil
}

// defaultInodes is size/BytesPerInode, at least MinInodes, at most MaxInodes.
func (b *Backend) defaultInodes(size int64) int64 {
	return min(max(size/b.opts.BytesPerInode, b.opts.MinInodes), b.opts.MaxInodes)
}

// Create returns the tmpfs to mount at the target. The framework mounts it; there
// is no storage to create beforehand.
func (b *Backend) Create(_ context.Context, v *api.Volume) (api.Source, error) {
	if runtime.GOOS != "linux" {
		return api.Source{}, fmt.Errorf("tmpfs volumes: %w (use the dir backend)", api.ErrNotSupported)
	}
	t, err := b.settings(v)
	if err != nil {
		return api.Source{}, err
	}
	return api.Source{Path: SourceName, FSType: "tmpfs", Options: t.MountData(), Tmpfs: t}, nil
}

// Find returns the source every tmpfs volume is mounted from: a tmpfs of this
// backend's source name. The storage lives only in that mount, so at a
// volume's own target it identifies the volume.
func (b *Backend) Find(context.Context, *api.Volume) (api.Source, error) {
	return api.Source{Path: SourceName, FSType: "tmpfs"}, nil
}

// MountOnly declares that a tmpfs volume is nothing but its mount: Create
// changes nothing on the node, and unmounting frees the memory. A crash can
// leave nothing of it but a mount at its target, which the framework finds in
// the mount table, so a publish needs no intent record.
func (b *Backend) MountOnly() {}

// Delete has nothing to free: unmounting the target released the memory.
func (b *Backend) Delete(context.Context, *api.Volume) error { return nil }
