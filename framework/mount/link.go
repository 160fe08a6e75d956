package mount

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/volume"
	"github.com/ephemera-csi/ephemera/framework/internal/winpath"
)

// This file holds the Windows implementation's logic, without a build tag, so
// that it is compiled and unit tested on Linux too (where the same calls work on
// POSIX symlinks). mount_windows.go only wires it to the os package.

// NormalizeWindowsPath turns a path as the kubelet may send it into the form
// Windows calls expect, the way the kubelet and k8s.io/mount-utils do: every "/"
// becomes "\", and a path rooted without a drive ("\var\lib\kubelet") gets "c:". A
// UNC path ("\\server\share") keeps its prefix. It is a pure string function, so
// it can be used (and tested) on any platform.
func NormalizeWindowsPath(p string) string {
	p = strings.ReplaceAll(p, "/", `\`)
	if strings.HasPrefix(p, `\`) && !strings.HasPrefix(p, `\\`) {
		p = "c:" + p
	}
	return p
}

// sameLinkTarget reports whether dest, the destination of a link as Readlink
// returns it, names the directory dir. On Windows the comparison goes through
// windowsPathKey; elsewhere only trailing slashes are ignored.
func sameLinkTarget(dest, dir string, windows bool) bool {
	if windows {
		return winpath.Key(dest) == winpath.Key(dir)
	}
	trim := func(p string) string {
		if t := strings.TrimRight(p, "/"); t != "" {
			return t
		}
		return p
	}
	return trim(dest) == trim(dir)
}

// linkFS is the part of the os package the link implementation uses, so that
// tests can return what Windows returns (ModeIrregular for a junction).
type linkFS interface {
	Lstat(name string) (fs.FileInfo, error)
	Stat(name string) (fs.FileInfo, error)
	Readlink(name string) (string, error)
	Symlink(oldname, newname string) error
	Remove(name string) error
	// IsEmptyDir reports whether the directory name has no entries.
	IsEmptyDir(name string) (bool, error)
	// ReadDir lists the directory name.
	ReadDir(name string) ([]fs.DirEntry, error)
}

type osFS struct{}

func (osFS) Lstat(name string) (fs.FileInfo, error)     { return os.Lstat(name) }
func (osFS) Stat(name string) (fs.FileInfo, error)      { return os.Stat(name) }
func (osFS) Readlink(name string) (string, error)       { return os.Readlink(name) }
func (osFS) Symlink(oldname, newname string) error      { return os.Symlink(oldname, newname) }
func (osFS) Remove(name string) error                   { return os.Remove(name) }
func (osFS) ReadDir(name string) ([]fs.DirEntry, error) { return os.ReadDir(name) }
func (osFS) IsEmptyDir(name string) (_ bool, err error) {
	f, err := os.Open(name)
	if err != nil {
		return false, err
	}
	defer f.Close()
	_, err = f.Readdirnames(1)
	if errors.Is(err, io.EOF) {
		return true, nil
	}
	return false, err
}

// isLink reports whether mode is what the kubelet's Windows mounter counts as
// "mounted": a symbolic link, or (Go 1.23 and later) a junction or volume mount
// point, which Lstat reports as irregular.
func isLink(mode fs.FileMode) bool { return mode&(fs.ModeSymlink|fs.ModeIrregular) != 0 }

// linkMounter publishes a directory by replacing the target with a directory
// symbolic link to it. It is the Windows implementation.
type linkMounter struct {
	fs linkFS
	// clean normalizes every incoming path (NormalizeWindowsPath on Windows).
	clean func(string) string
	// windows selects Windows rules for comparing link destinations.
	windows bool
}

func newLinkMounter(fsys linkFS, clean func(string) string) *linkMounter {
	if clean == nil {
		clean = func(p string) string { return p }
	}
	return &linkMounter{fs: fsys, clean: clean, windows: filepath.Separator == '\\'}
}

// NewLink returns the Windows implementation working on the host's own
// filesystem: on Windows it is what [New] returns; on Linux it publishes with
// POSIX directory symlinks and no privilege. It exists so that the framework's
// Windows behaviour (publish by link, unpublish removes the link only,
// republish-repair of a dangling link, reconcile) is tested end to end on
// Linux. Do not use it to serve pods on Linux: container runtimes resolve a
// symlinked volume on the host, outside the pod's mount namespace rules.
func NewLink() Interface {
	if filepath.Separator == '\\' {
		return newLinkMounter(osFS{}, NormalizeWindowsPath)
	}
	return newLinkMounter(osFS{}, nil)
}

// checkBeneath checks that target lies below root and that no component between
// them (target's parent included, root and target excluded) is a link. It returns
// an error wrapping fs.ErrNotExist when a component is missing.
func (m *linkMounter) checkBeneath(root, target string) error {
	parent, _, err := splitBeneath(root, target)
	if err != nil {
		return err
	}
	if parent == "." {
		parent = ""
	}
	p := filepath.Clean(root)
	for _, c := range strings.Split(parent, string(filepath.Separator)) {
		if c == "" {
			continue
		}
		p = filepath.Join(p, c)
		fi, err := m.fs.Lstat(p)
		if err != nil {
			return err
		}
		if isLink(fi.Mode()) {
			return fmt.Errorf("%q below root %q: %w", p, root, ErrSymlink)
		}
		if !fi.IsDir() {
			return &fs.PathError{Op: "lstat", Path: p, Err: errors.New("not a directory")}
		}
	}
	return nil
}

// MakeTarget creates nothing: Windows links are created where nothing exists (see
// Mount). It checks that target is below root and that its parent exists as a
// directory, reached without a link.
func (m *linkMounter) MakeTarget(root, target string) error {
	return m.checkBeneath(m.clean(root), m.clean(target))
}

// Mount links target to the directory src.Path. The source must already exist as
// a directory (os.Symlink on Windows makes a file link otherwise); it is never
// created here. An empty directory at target (the kubelet creates one) is
// removed first; a non-empty one is ErrNotEmpty. A link at target that already
// points to src.Path is success. A dangling link (its destination is gone: a
// node reboot, a state directory moved) is removed and replaced; a live link to
// anything else is an error wrapping fs.ErrExist, since a pod may be using what
// it shows.
func (m *linkMounter) Mount(root string, src api.Source, target string) error {
	if !src.IsDir() {
		return fmt.Errorf("mount %s %q: tmpfs and block filesystems are not available on Windows, publish a directory: %w",
			src.FSType, src.Path, ErrNotSupported)
	}
	source, target := m.clean(src.Path), m.clean(target)
	if err := m.checkBeneath(m.clean(root), target); err != nil {
		return err
	}
	if !filepath.IsAbs(source) {
		return fmt.Errorf("source %q must be an absolute path", src.Path)
	}
	if src.Root != "" {
		if err := m.checkBeneath(m.clean(src.Root), source); err != nil {
			return fmt.Errorf("source %q beneath %q: %w", src.Path, src.Root, err)
		}
	}
	fi, err := m.fs.Stat(source)
	if err != nil {
		return fmt.Errorf("source of %q: %w", target, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("source %q of %q is not a directory", source, target)
	}
	fi, err = m.fs.Lstat(target)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return err
	case isLink(fi.Mode()):
		dest, err := m.fs.Readlink(target)
		if err == nil && sameLinkTarget(dest, source, m.windows) {
			return nil
		}
		if _, serr := m.fs.Stat(target); serr == nil {
			return fmt.Errorf("target %q is already a link to %q, not to %q: %w", target, dest, source, fs.ErrExist)
		}
		// Dangling: remove the link itself (never anything behind it).
		if err := m.fs.Remove(target); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove dangling link %q: %w", target, err)
		}
	case fi.IsDir():
		empty, err := m.fs.IsEmptyDir(target)
		if err != nil {
			return err
		}
		if !empty {
			return fmt.Errorf("target %q: %w", target, ErrNotEmpty)
		}
		if err := m.fs.Remove(target); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	default:
		return &fs.PathError{Op: "mount", Path: target, Err: errors.New("exists and is not a directory")}
	}
	if err := m.fs.Symlink(source, target); err != nil {
		return fmt.Errorf("link %q to %q: %w", target, source, err)
	}
	return nil
}

// SetReadOnly returns ErrNotSupported: a directory link cannot be made
// read-only, and pretending would hand a pod a writable volume it asked to be
// read-only.
func (m *linkMounter) SetReadOnly(root, target string, readOnly bool) error {
	if !readOnly {
		return nil
	}
	return fmt.Errorf("read-only publish of %q: a Windows directory link cannot be made read-only: %w",
		target, ErrNotSupported)
}

// Unmount removes the link at target, never what it points to. A missing target,
// or one that is not a link (a plain directory), is left alone and is not an error.
func (m *linkMounter) Unmount(root, target string) error {
	target = m.clean(target)
	if err := m.checkBeneath(m.clean(root), target); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	fi, err := m.fs.Lstat(target)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if !isLink(fi.Mode()) {
		return nil
	}
	if err := m.fs.Remove(target); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove link %q: %w", target, err)
	}
	return nil
}

// IsMountPoint reports whether target is a link (a symlink, or a junction or
// mount point, which Lstat reports as irregular) whose destination exists. The
// kubelet's Windows mounter counts any link as mounted; a dangling one is not
// published for the framework (so a republish repairs it), and Unmount still
// removes it.
func (m *linkMounter) IsMountPoint(root, target string) (bool, error) {
	mt, err := m.Inspect(root, target)
	return mt != nil, err
}

// Inspect describes the link at target whose destination exists (see
// IsMountPoint): Source is the link's destination.
func (m *linkMounter) Inspect(root, target string) (*Mounted, error) {
	target = m.clean(target)
	if err := m.checkBeneath(m.clean(root), target); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	fi, err := m.fs.Lstat(target)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if !isLink(fi.Mode()) {
		return nil, nil
	}
	// Any failure to reach the destination (missing, or on Windows a mount
	// point whose volume is detached) means nothing usable is published.
	if _, err := m.fs.Stat(target); err != nil {
		return nil, nil
	}
	dest, err := m.fs.Readlink(target)
	if err != nil {
		return nil, err
	}
	return &Mounted{Source: dest}, nil
}

// Shows reports whether the link mt describes points to the directory src.
func (m *linkMounter) Shows(mt *Mounted, src api.Source) (bool, error) {
	if mt == nil || !src.IsDir() {
		return false, nil
	}
	return sameLinkTarget(mt.Source, m.clean(src.Path), m.windows), nil
}

// MountedAt returns nil: a link does not pin its destination, and finding
// every link to a directory would mean walking the disk. Deleting a linked
// directory is guarded by the framework's own records and the kubelet root's
// links (Published).
func (m *linkMounter) MountedAt(api.Source) ([]string, error) { return nil, nil }

// OpenTarget opens the directory the link at target shows, after checking that
// no component between root and target is a link.
func (m *linkMounter) OpenTarget(root, target string) (*os.Root, error) {
	target = m.clean(target)
	if err := m.checkBeneath(m.clean(root), target); err != nil {
		return nil, err
	}
	return os.OpenRoot(target)
}

// Published walks root/pods/*/volumes/kubernetes.io~csi/*/mount for links
// whose destination exists.
func (m *linkMounter) Published(root string) ([]string, error) {
	root = m.clean(root)
	var out []string
	pods := filepath.Join(root, volume.PodsDir)
	uids, err := m.fs.ReadDir(pods)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	for _, u := range uids {
		if !u.IsDir() {
			continue
		}
		csiDir := filepath.Join(pods, u.Name(), "volumes", "kubernetes.io~csi")
		vols, err := m.fs.ReadDir(csiDir)
		if err != nil {
			continue
		}
		for _, v := range vols {
			if !v.IsDir() {
				continue
			}
			t := filepath.Join(csiDir, v.Name(), volume.MountDir)
			if ok, err := m.IsMountPoint(root, t); err == nil && ok {
				out = append(out, t)
			}
		}
	}
	return out, nil
}

// RemoveTarget removes target (an empty directory, or a link, never what it
// points to) below root. A directory that is not empty is left in place and is
// not an error: MakeTarget creates nothing here and Mount never links over one
// (ErrNotEmpty), so its content is not ours, and failing would turn the
// rollback of that refused publish into an endless retry.
func (m *linkMounter) RemoveTarget(root, target string) error {
	root, target = m.clean(root), m.clean(target)
	err := m.checkBeneath(root, target)
	if err == nil {
		var fi fs.FileInfo
		if fi, err = m.fs.Lstat(target); err == nil && fi.IsDir() && !isLink(fi.Mode()) {
			if empty, eerr := m.fs.IsEmptyDir(target); eerr == nil && !empty {
				return nil
			}
		}
	}
	if err == nil {
		err = m.fs.Remove(target)
	}
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}
