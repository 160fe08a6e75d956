package dir

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/stamp"
)

// Options configure the backend.
type Options struct {
	// Root is the directory holding one subdirectory per volume. Required.
	Root string
	// AllowSoftSize accepts the "size" attribute without enforcing it.
	// Defaults to false: "size" is refused with a message naming hard-limit
	// backends.
	AllowSoftSize bool
	// Host, when set, creates and removes the volume directories (and Root)
	// instead of the os package: on a Windows node without HostProcess it is
	// the csi-proxy seam (*mount.CSIProxy), and Root must then lie below
	// csi-proxy's working directories (the kubelet root). The attributes
	// "mode", "uid" and "gid" are then refused (csi-proxy v1 creates
	// directories with its own account's rights and has no call to change
	// them). The stamp file in Root is still written by the driver itself.
	// Defaults to nil: the os package.
	Host Host
}

// Host creates and removes directories on the node for the backend (see
// Options.Host).
type Host interface {
	// Mkdir creates path and its missing parents; an existing directory is
	// not an error.
	Mkdir(ctx context.Context, path string) error
	// RemoveAll removes path and everything in it, following no link; a
	// missing path is not an error.
	RemoveAll(ctx context.Context, path string) error
}

// Backend implements framework.Backend, framework.AttributeDeclarer,
// framework.Validator, framework.Lister, framework.Finder and
// framework.Stamper.
type Backend struct{ opts Options }

// attributes are what Backend.Attributes declares.
var attributes = api.Attributes{api.ModeAttr(0o777), api.UIDAttr(), api.GIDAttr()}

// Attributes declares the dir attributes: "mode" (default 0777), "uid" and
// "gid" (unset: the directory is the driver's). Behind csi-proxy (Options.Host)
// it declares none, so that the three are refused as unknown.
func (b *Backend) Attributes() api.Attributes {
	if b.opts.Host != nil {
		return nil
	}
	return attributes
}

// New returns a directory backend.
func New(opts Options) (*Backend, error) {
	if !filepath.IsAbs(opts.Root) {
		return nil, fmt.Errorf("dir backend: Root %q must be an absolute path", opts.Root)
	}
	return &Backend{opts: opts}, nil
}

// Validate checks the attributes.
func (b *Backend) Validate(v *api.Volume) error {
	if b.opts.Host != nil {
		if err := v.Params.Only(); err != nil {
			return fmt.Errorf("%w (the dir backend behind csi-proxy has no mode, uid or gid: csi-proxy v1 cannot set them)", err)
		}
	}
	if v.FSType != "" {
		return api.InvalidParamf("fsType %q is not supported by the dir backend; leave it unset", v.FSType)
	}
	if v.Size > 0 && !b.opts.AllowSoftSize {
		return api.InvalidParamf("the dir backend cannot enforce attribute %q; remove it or use a backend with a hard limit (tmpfs, loop)", api.ParamSize)
	}
	return nil
}

// owner returns the mode and owner of v's directory (-1: unchanged); v's
// attributes are applied.
func owner(v *api.Volume) (mode fs.FileMode, uid, gid int64) {
	uid, gid = -1, -1
	if v.Values.Has(api.ParamUID) {
		uid = v.Values.Int(api.ParamUID)
	}
	if v.Values.Has(api.ParamGID) {
		gid = v.Values.Int(api.ParamGID)
	}
	return v.Values.Mode(api.ParamMode), uid, gid
}

func (b *Backend) path(id string) (string, error) {
	if id == "" || strings.ContainsAny(id, `/\`) || id == "." || id == ".." {
		return "", fmt.Errorf("dir backend: invalid volume ID %q", id)
	}
	return filepath.Join(b.opts.Root, id), nil
}

// Create makes the volume's directory; an existing one is kept (idempotent).
func (b *Backend) Create(ctx context.Context, v *api.Volume) (api.Source, error) {
	p, err := b.path(v.ID)
	if err != nil {
		return api.Source{}, err
	}
	if b.opts.Host != nil {
		if err := b.opts.Host.Mkdir(ctx, p); err != nil {
			return api.Source{}, err
		}
		return api.Source{Path: p}, nil
	}
	mode, uid, gid := owner(v)
	if err := os.MkdirAll(b.opts.Root, 0o700); err != nil {
		return api.Source{}, err
	}
	if err := os.Mkdir(p, 0o700); err != nil && !os.IsExist(err) {
		return api.Source{}, err
	}
	if err := os.Chmod(p, mode); err != nil {
		return api.Source{}, err
	}
	if uid >= 0 || gid >= 0 {
		if err := os.Lchown(p, int(uid), int(gid)); err != nil {
			return api.Source{}, fmt.Errorf("setting owner: %w", err)
		}
	}
	return api.Source{Path: p}, nil
}

// Delete removes the volume's directory and everything in it. It stops once
// ctx is done (on Linux, every 256 entries), so that a tree of millions of
// entries never holds the volume past its request's deadline; the next
// Delete removes the rest.
func (b *Backend) Delete(ctx context.Context, v *api.Volume) error {
	p, err := b.path(v.ID)
	if err != nil {
		return err
	}
	if b.opts.Host != nil {
		return b.opts.Host.RemoveAll(ctx, p)
	}
	return removeAll(ctx, p)
}

// Find returns the volume's directory when it exists.
func (b *Backend) Find(_ context.Context, v *api.Volume) (api.Source, error) {
	p, err := b.path(v.ID)
	if err != nil {
		return api.Source{}, err
	}
	fi, err := os.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return api.Source{}, fmt.Errorf("%w: no directory for volume %s", api.ErrNotFound, v.ID)
	}
	if err != nil {
		return api.Source{}, err
	}
	if !fi.IsDir() {
		return api.Source{}, fmt.Errorf("%s is not a directory", p)
	}
	return api.Source{Path: p}, nil
}

// Stamp returns the state store identity stamped in Root.
func (b *Backend) Stamp(context.Context) (string, error) { return stamp.Read(b.opts.Root) }

// SetStamp stamps Root with the state store's identity.
func (b *Backend) SetStamp(ctx context.Context, id string) error {
	if b.opts.Host != nil {
		if err := b.opts.Host.Mkdir(ctx, b.opts.Root); err != nil {
			return err
		}
	}
	return stamp.Write(b.opts.Root, id)
}

// List returns the IDs of the volume directories present.
func (b *Backend) List(context.Context) ([]string, error) {
	entries, err := os.ReadDir(b.opts.Root)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), "csi-") {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}
