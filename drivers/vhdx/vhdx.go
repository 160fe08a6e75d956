package vhdx

import (
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/ephemera-csi/ephemera/api"
)

// ParamFSType is the backend's one attribute (Backend.Attributes): unset or
// "ntfs".
const ParamFSType = "fsType"

// attributes are the vhdx attributes; Validate checks the fsType, which may
// be spelt in any case.
var attributes = api.Attributes{api.StringAttr(ParamFSType)}

// FSNTFS is the only filesystem the backend formats.
const FSNTFS = "ntfs"

// Size limits.
const (
	// MinSize is the smallest volume accepted. The VHDX format's minimum is
	// 3MiB; the GPT layout, the Microsoft reserved partition and NTFS metadata
	// need more before a volume holds anything useful. 64MiB is a safe floor,
	// not a measured one.
	MinSize int64 = 64 << 20
	// MaxSize is the VHDX format's maximum, 64TiB.
	MaxSize int64 = 64 << 40
	// sizeAlign is the granularity sizes are rounded up to.
	sizeAlign int64 = 1 << 20
)

// File names in Options.Dir.
const (
	fileExt = ".vhdx"
	tmpExt  = ".vhdx.tmp"
	mntDir  = "mnt"
)

// Options configure the backend.
type Options struct {
	// Dir holds the VHDX files, <volumeID>.vhdx, and the folders their volumes
	// are mounted at, mnt\<volumeID>; normally <state-dir>\vhdx. Required,
	// absolute; created on first use. It must be on a local NTFS or ReFS
	// volume.
	Dir string
	// DefaultSize applies to volumes without a "size" attribute. Defaults to
	// 0: "size" is required.
	DefaultSize int64
	// MaxSize caps the size of a volume in bytes (after defaults and
	// rounding). 0: the VHDX maximum (64TiB), below the framework's
	// MaxVolumeSize.
	MaxSize int64
	// Dynamic creates dynamically expanding VHDX files instead of fixed-size
	// ones: fast and thin, but the node disk may be overcommitted (see the
	// package documentation).
	Dynamic bool

	// host replaces the operating system in tests.
	host host
}

// Backend implements framework.Backend, framework.AttributeDeclarer,
// framework.Validator, framework.Lister, framework.Stamper and
// framework.HealthChecker.
type Backend struct {
	opts Options
	host host
}

// New returns a VHDX backend. It does no I/O. On Windows it fails when the
// csi-proxy disk or volume API it calls in process cannot be initialised.
func New(opts Options) (*Backend, error) {
	if opts.Dir == "" || !isAbs(opts.Dir) {
		return nil, fmt.Errorf("vhdx backend: Dir %q must be an absolute path", opts.Dir)
	}
	if opts.DefaultSize < 0 || opts.MaxSize < 0 {
		return nil, fmt.Errorf("vhdx backend: DefaultSize and MaxSize must not be negative")
	}
	if opts.MaxSize == 0 || opts.MaxSize > MaxSize {
		opts.MaxSize = MaxSize
	}
	if opts.MaxSize < MinSize {
		return nil, fmt.Errorf("vhdx backend: MaxSize %s is below the minimum volume size %s", human(opts.MaxSize), human(MinSize))
	}
	h := opts.host
	if h == nil {
		var err error
		if h, err = newHost(); err != nil {
			return nil, fmt.Errorf("vhdx backend: %w", err)
		}
	}
	return &Backend{opts: opts, host: h}, nil
}

// isAbs accepts an absolute path of the host, or a Windows one (X:\...) on any
// system, so that configuration is validated the same way in tests.
func isAbs(p string) bool {
	if filepath.IsAbs(p) {
		return true
	}
	return len(p) >= 3 && (p[0]|0x20) >= 'a' && (p[0]|0x20) <= 'z' && p[1] == ':' && (p[2] == '\\' || p[2] == '/')
}

// Attributes declares the vhdx attribute: "fsType".
func (b *Backend) Attributes() api.Attributes { return attributes }

// Validate checks the attributes, applies the default size, rounds it up to
// 1MiB and sets v.FSType to "ntfs".
func (b *Backend) Validate(v *api.Volume) error {
	attr := v.Values.String(ParamFSType)
	for _, fs := range []string{attr, v.FSType} {
		if fs != "" && !strings.EqualFold(fs, FSNTFS) {
			return api.InvalidParamf("fsType %q is not supported by the vhdx backend; VHDX volumes are NTFS (leave fsType unset or set it to %q)", fs, FSNTFS)
		}
	}
	size, err := b.size(v.Size)
	if err != nil {
		return err
	}
	v.FSType, v.Size = FSNTFS, size
	return nil
}

// size returns the requested or default size rounded up to 1MiB, checked
// against MinSize and MaxSize.
func (b *Backend) size(requested int64) (int64, error) {
	size := requested
	if size == 0 {
		if b.opts.DefaultSize == 0 {
			return 0, api.InvalidParamf("attribute %q is required for vhdx volumes (for example size: 1Gi)", api.ParamSize)
		}
		size = b.opts.DefaultSize
	}
	if size < 0 || size > math.MaxInt64-sizeAlign {
		return 0, api.InvalidParamf("attribute %q: %d bytes is out of range", api.ParamSize, size)
	}
	size = (size + sizeAlign - 1) / sizeAlign * sizeAlign
	if size < MinSize {
		return 0, api.InvalidParamf("attribute %q: %s is below the minimum of %s for vhdx volumes", api.ParamSize, human(size), human(MinSize))
	}
	if size > b.opts.MaxSize {
		return 0, api.InvalidParamf("attribute %q: %s exceeds the vhdx backend's maximum of %s", api.ParamSize, human(size), human(b.opts.MaxSize))
	}
	return size, nil
}

// human renders a byte count as an exact binary quantity when possible.
func human(n int64) string {
	for _, u := range []struct {
		suffix string
		shift  uint
	}{{"Ti", 40}, {"Gi", 30}, {"Mi", 20}, {"Ki", 10}} {
		if n >= 1<<u.shift && n%(1<<u.shift) == 0 {
			return strconv.FormatInt(n>>u.shift, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10) + " bytes"
}

// validID accepts the volume IDs the framework derives ("csi-" and hex) and
// anything else that is a safe single file name.
func validID(id string) error {
	if id == "" || id == "." || id == ".." || len(id) > 128 || strings.ContainsAny(id, `/\:*?"<>|`) || strings.HasSuffix(id, ".") || strings.HasSuffix(id, " ") {
		return fmt.Errorf("vhdx backend: invalid volume ID %q", id)
	}
	return nil
}

// paths of one volume: the VHDX file, its temporary name while being created,
// and the folder its volume is mounted at.
type paths struct{ file, tmp, mnt string }

func (b *Backend) paths(id string) (paths, error) {
	if err := validID(id); err != nil {
		return paths{}, err
	}
	return paths{
		file: join(b.opts.Dir, id+fileExt),
		tmp:  join(b.opts.Dir, id+tmpExt),
		mnt:  join(b.opts.Dir, mntDir, id),
	}, nil
}

// join joins with the separator Dir uses, so that a Windows Dir keeps
// backslashes when tested on Linux.
func join(elem ...string) string {
	if strings.Contains(elem[0], `\`) {
		return strings.TrimRight(elem[0], `\`) + `\` + strings.Join(elem[1:], `\`)
	}
	return filepath.Join(elem...)
}

// Create provisions the volume (see the package documentation) and returns the
// folder its NTFS volume is mounted at. Every step first looks at what exists,
// so a call interrupted anywhere (driver crash, node reboot, ctx done) is
// finished by the next one. When ctx is done, Create returns an error wrapping
// ctx.Err() before the next step; a step already started runs to completion.
func (b *Backend) Create(ctx context.Context, v *api.Volume) (api.Source, error) {
	p, err := b.paths(v.ID)
	if err != nil {
		return api.Source{}, err
	}
	size, err := b.size(v.Size)
	if err != nil {
		return api.Source{}, err
	}
	h := b.host
	if err := h.MkdirAll(ctx, b.opts.Dir); err != nil {
		return api.Source{}, fmt.Errorf("vhdx: %w", err)
	}
	// 1. The file, created under a temporary name so that a crash while
	// allocating it never leaves a half-written .vhdx behind.
	exists, err := h.FileExists(ctx, p.file)
	if err != nil {
		return api.Source{}, fmt.Errorf("vhdx: %w", err)
	}
	if !exists {
		if err := h.RemoveFile(ctx, p.tmp); err != nil {
			return api.Source{}, fmt.Errorf("vhdx: removing leftover %s: %w", p.tmp, err)
		}
		if err := h.CreateVHDX(ctx, p.tmp, size, b.opts.Dynamic); err != nil {
			return api.Source{}, fmt.Errorf("vhdx: creating %s (%s): %w", p.file, human(size), err)
		}
		// Renamed even when ctx ended while the file was allocated: the
		// rename is instant, and the next Create would otherwise throw the
		// complete file away and allocate it again.
		if err := h.Rename(context.WithoutCancel(ctx), p.tmp, p.file); err != nil {
			return api.Source{}, fmt.Errorf("vhdx: %w", err)
		}
	}
	// 2. Attached, for good.
	disk, attached, err := h.AttachedDisk(ctx, p.file)
	if err != nil {
		return api.Source{}, fmt.Errorf("vhdx: %w", err)
	}
	if !attached {
		if err := h.Attach(ctx, p.file); err != nil {
			return api.Source{}, fmt.Errorf("vhdx: attaching %s: %w", p.file, err)
		}
		disk, attached, err = h.AttachedDisk(ctx, p.file)
		if err != nil && ctx.Err() != nil {
			return api.Source{}, fmt.Errorf("vhdx: %s attached, its disk not looked up: %w", p.file, err)
		}
		if err != nil || !attached {
			return api.Source{}, fmt.Errorf("vhdx: %s attached but its disk was not found: %w", p.file, errors.Join(err, api.ErrUnavailable))
		}
	}
	// 3 and 4. Partitioned and formatted.
	if err := h.PrepareDisk(ctx, disk); err != nil {
		return api.Source{}, fmt.Errorf("vhdx: partitioning disk %d of %s: %w", disk, p.file, err)
	}
	vol, err := h.VolumeOnDisk(ctx, disk)
	if err != nil {
		return api.Source{}, fmt.Errorf("vhdx: finding the volume on disk %d of %s: %w", disk, p.file, err)
	}
	formatted, err := h.IsFormatted(ctx, vol)
	if err != nil {
		return api.Source{}, fmt.Errorf("vhdx: %w", err)
	}
	if !formatted {
		if err := h.Format(ctx, vol); err != nil {
			return api.Source{}, fmt.Errorf("vhdx: formatting %s NTFS: %w", vol, err)
		}
	}
	// 5. Mounted in its folder.
	if err := h.MkdirAll(ctx, p.mnt); err != nil {
		return api.Source{}, fmt.Errorf("vhdx: %w", err)
	}
	mounted, err := h.MountedVolume(ctx, p.mnt)
	if err != nil {
		return api.Source{}, fmt.Errorf("vhdx: %w", err)
	}
	switch {
	case mounted == "":
		if err := h.Mount(ctx, vol, p.mnt); err != nil {
			return api.Source{}, fmt.Errorf("vhdx: mounting %s at %s: %w", vol, p.mnt, err)
		}
	case !sameVolume(mounted, vol):
		return api.Source{}, fmt.Errorf("vhdx: %s has volume %s mounted, not %s of %s; unmount it (mountvol %s /D)", p.mnt, mounted, vol, p.file, p.mnt)
	}
	return api.Source{Path: p.mnt}, nil
}

// Delete unmounts, detaches and deletes the volume, skipping what is already
// gone; nil when nothing is left. When ctx is done, Delete returns an error
// wrapping ctx.Err() before the next step, and the next Delete finishes.
func (b *Backend) Delete(ctx context.Context, v *api.Volume) error {
	p, err := b.paths(v.ID)
	if err != nil {
		return err
	}
	h := b.host
	mounted, err := h.MountedVolume(ctx, p.mnt)
	if err != nil {
		return fmt.Errorf("vhdx: %w", err)
	}
	if mounted != "" {
		if err := h.Unmount(ctx, mounted, p.mnt); err != nil {
			return fmt.Errorf("vhdx: unmounting %s: %w", p.mnt, err)
		}
	}
	exists, err := h.FileExists(ctx, p.file)
	if err != nil {
		return fmt.Errorf("vhdx: %w", err)
	}
	if exists {
		if _, attached, err := h.AttachedDisk(ctx, p.file); err != nil {
			return fmt.Errorf("vhdx: %w", err)
		} else if attached {
			if err := h.Detach(ctx, p.file); err != nil {
				return fmt.Errorf("vhdx: detaching %s: %w", p.file, err)
			}
		}
		if err := h.RemoveFile(ctx, p.file); err != nil {
			return fmt.Errorf("vhdx: %w", err)
		}
	}
	if err := h.RemoveFile(ctx, p.tmp); err != nil {
		return fmt.Errorf("vhdx: %w", err)
	}
	if err := h.RemoveDir(ctx, p.mnt); err != nil {
		return fmt.Errorf("vhdx: %w", err)
	}
	return nil
}

// List returns the IDs of the volumes with a file in Dir (complete or being
// created) or a folder in Dir\mnt, so that the startup reconcile deletes the
// leftovers of a crash.
func (b *Backend) List(ctx context.Context) ([]string, error) {
	ids := map[string]bool{}
	names, err := b.host.ListFiles(ctx, b.opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("vhdx: %w", err)
	}
	for _, n := range names {
		lower := strings.ToLower(n)
		for _, ext := range []string{tmpExt, fileExt} {
			if strings.HasSuffix(lower, ext) {
				if id := n[:len(n)-len(ext)]; validID(id) == nil {
					ids[id] = true
				}
				break
			}
		}
	}
	mnts, err := b.host.ListFiles(ctx, join(b.opts.Dir, mntDir))
	if err != nil {
		return nil, fmt.Errorf("vhdx: %w", err)
	}
	for _, n := range mnts {
		if validID(n) == nil {
			ids[n] = true
		}
	}
	out := make([]string, 0, len(ids))
	for id := range ids {
		out = append(out, id)
	}
	sort.Strings(out)
	return out, nil
}

// Stamp returns the state store identity stamped in Dir (its
// .ephemera-store-id file, which List skips).
func (b *Backend) Stamp(ctx context.Context) (string, error) {
	return b.host.ReadStamp(ctx, b.opts.Dir)
}

// SetStamp stamps Dir with the state store's identity.
func (b *Backend) SetStamp(ctx context.Context, id string) error {
	return b.host.WriteStamp(ctx, b.opts.Dir, id)
}

// Check reports whether the volume is intact: its file exists, is attached, and
// a volume is mounted at its folder. It makes no WMI query (the kubelet asks
// for stats, and so for this check, every minute per volume): which volume is
// mounted is verified by Create.
func (b *Backend) Check(ctx context.Context, v *api.Volume) error {
	p, err := b.paths(v.ID)
	if err != nil {
		return err
	}
	exists, err := b.host.FileExists(ctx, p.file)
	switch {
	case err != nil:
		return err
	case !exists:
		return fmt.Errorf("VHDX file %s is missing", p.file)
	}
	disk, attached, err := b.host.AttachedDisk(ctx, p.file)
	switch {
	case err != nil:
		return err
	case !attached:
		return fmt.Errorf("VHDX file %s is not attached (node rebooted?); the next NodePublishVolume re-attaches it", p.file)
	}
	mounted, err := b.host.MountedVolume(ctx, p.mnt)
	switch {
	case err != nil:
		return err
	case mounted == "":
		return fmt.Errorf("the volume of %s (disk %d) is not mounted at %s", p.file, disk, p.mnt)
	}
	return nil
}
