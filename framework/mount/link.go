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

// linkState is what is at a path, for the Windows link rules.
type linkState int

const (
	// linkMissing: nothing is at the path.
	linkMissing linkState = iota
	// linkLive: a link (symbolic, a junction or a mount point) whose
	// destination can be reached.
	linkLive
	// linkDangling: a link whose destination cannot be reached (gone, or on
	// Windows a mount point whose volume is detached).
	linkDangling
	// linkDir: a directory that is no link.
	linkDir
	// linkOther: anything else (a file).
	linkOther
)

// linkHost is what the Windows link rules (linkMounter) ask of the host. The
// rules are written once; two hosts answer them: osHost, the driver's own
// view of the filesystem (HostProcess, and NewLink on Linux), and proxyHost,
// csi-proxy v1's answers completed by the driver's container's view of what
// csi-proxy has no call for (csiproxy.go). Paths are cleaned by the rules.
type linkHost interface {
	// state describes what is at path, without following a final link.
	state(path string) (linkState, error)
	// isDir reports whether path, following links, is a directory; an error
	// wrapping fs.ErrNotExist when it does not exist.
	isDir(path string) (bool, error)
	// readlink returns the destination of the link at path.
	readlink(path string) (string, error)
	// isEmptyDir reports whether the directory path has no entries.
	isEmptyDir(path string) (bool, error)
	// link makes target, where nothing exists, a directory link to source.
	link(source, target string) error
	// remove removes path: an empty directory, a file or a link, never what
	// the link points to.
	remove(path string) error
	// readDir lists the directory path.
	readDir(path string) ([]fs.DirEntry, error)
}

// osHost answers the link rules from a linkFS (the os package).
type osHost struct{ fs linkFS }

func (h osHost) state(path string) (linkState, error) {
	fi, err := h.fs.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return linkMissing, nil
	case err != nil:
		return 0, err
	case isLink(fi.Mode()):
		// Any failure to reach the destination (missing, or on Windows a
		// mount point whose volume is detached) leaves nothing usable there.
		if _, err := h.fs.Stat(path); err != nil {
			return linkDangling, nil
		}
		return linkLive, nil
	case fi.IsDir():
		return linkDir, nil
	}
	return linkOther, nil
}

func (h osHost) isDir(path string) (bool, error) {
	fi, err := h.fs.Stat(path)
	if err != nil {
		return false, err
	}
	return fi.IsDir(), nil
}

func (h osHost) readlink(path string) (string, error)       { return h.fs.Readlink(path) }
func (h osHost) isEmptyDir(path string) (bool, error)       { return h.fs.IsEmptyDir(path) }
func (h osHost) link(source, target string) error           { return h.fs.Symlink(source, target) }
func (h osHost) remove(path string) error                   { return h.fs.Remove(path) }
func (h osHost) readDir(path string) ([]fs.DirEntry, error) { return h.fs.ReadDir(path) }

// linkMounter publishes a directory by replacing the target with a directory
// symbolic link to it: the Windows rules, the only ones, whichever host
// (osHost for HostProcess, proxyHost for csi-proxy) carries them out.
type linkMounter struct {
	host linkHost
	// clean normalizes every incoming path (NormalizeWindowsPath on Windows).
	clean func(string) string
	// windows selects Windows rules for comparing link destinations.
	windows bool
}

func newLinkMounter(fsys linkFS, clean func(string) string) *linkMounter {
	if clean == nil {
		clean = func(p string) string { return p }
	}
	return &linkMounter{host: osHost{fs: fsys}, clean: clean, windows: filepath.Separator == '\\'}
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

// checkBeneath checks that target lies below root and that every component
// between them (target's parent included, root and target excluded) is a
// directory and no link, dangling or not. It returns an error wrapping
// fs.ErrNotExist when a component is missing. Through csi-proxy the answer
// holds only at the moment it is given (docs/security.md).
func (m *linkMounter) checkBeneath(root, target string) error {
	parent, _, err := splitBeneath(root, target)
	if err != nil {
		return err
	}
	if parent == "." {
		return nil
	}
	p := filepath.Clean(root)
	for _, c := range strings.Split(parent, string(filepath.Separator)) {
		p = filepath.Join(p, c)
		st, err := m.host.state(p)
		if err != nil {
			return err
		}
		switch st {
		case linkMissing:
			return &fs.PathError{Op: "lstat", Path: p, Err: fs.ErrNotExist}
		case linkLive, linkDangling:
			return fmt.Errorf("%q below root %q: %w", p, root, ErrSymlink)
		case linkOther:
			return &fs.PathError{Op: "lstat", Path: p, Err: errors.New("not a directory")}
		}
	}
	return nil
}

// remove removes path through the host; what is gone already is removed.
func (m *linkMounter) remove(path string) error {
	if err := m.host.remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
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
		return fmt.Errorf("mount %s %q: a Windows directory link publishes directories only (no tmpfs or block filesystem), publish a directory: %w",
			src.FSType, src.Path, ErrNotSupported)
	}
	root, source, target := m.clean(root), m.clean(src.Path), m.clean(target)
	if !filepath.IsAbs(source) {
		return fmt.Errorf("source %q must be an absolute path", src.Path)
	}
	if err := m.checkBeneath(root, target); err != nil {
		return err
	}
	if src.Root != "" {
		if err := m.checkBeneath(m.clean(src.Root), source); err != nil {
			return fmt.Errorf("source %q beneath %q: %w", src.Path, src.Root, err)
		}
	}
	dir, err := m.host.isDir(source)
	if err != nil {
		return fmt.Errorf("source of %q: %w", target, err)
	}
	if !dir {
		return fmt.Errorf("source %q of %q is not a directory", source, target)
	}
	st, err := m.host.state(target)
	if err != nil {
		return err
	}
	switch st {
	case linkMissing:
	case linkLive, linkDangling:
		dest, err := m.host.readlink(target)
		if err == nil && sameLinkTarget(dest, source, m.windows) {
			return nil // the link Mount would make, however the host spells it
		}
		if st == linkLive {
			if err != nil {
				return err
			}
			return fmt.Errorf("target %q is already a link to %q, not to %q: %w", target, dest, source, fs.ErrExist)
		}
		// Dangling: remove the link itself, never anything behind it.
		if err := m.remove(target); err != nil {
			return fmt.Errorf("remove dangling link %q: %w", target, err)
		}
	case linkDir:
		empty, err := m.host.isEmptyDir(target)
		if err != nil {
			return err
		}
		if !empty {
			return fmt.Errorf("target %q: %w", target, ErrNotEmpty)
		}
		if err := m.remove(target); err != nil {
			return err
		}
	default:
		return &fs.PathError{Op: "mount", Path: target, Err: errors.New("exists and is not a directory")}
	}
	if err := m.host.link(source, target); err != nil {
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

// Unmount removes the link at target, dangling or not, never what it points
// to. A missing target, or one that is not a link (a plain directory), is left
// alone and is not an error.
func (m *linkMounter) Unmount(root, target string) error {
	target = m.clean(target)
	if err := m.checkBeneath(m.clean(root), target); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	st, err := m.host.state(target)
	if err != nil || (st != linkLive && st != linkDangling) {
		return err
	}
	if err := m.remove(target); err != nil {
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
	target = m.clean(target)
	if err := m.checkBeneath(m.clean(root), target); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return false, nil
		}
		return false, err
	}
	st, err := m.host.state(target)
	return st == linkLive, err
}

// Inspect describes the link at target whose destination exists (see
// IsMountPoint): Source is the link's destination.
func (m *linkMounter) Inspect(root, target string) (*Mounted, error) {
	ok, err := m.IsMountPoint(root, target)
	if err != nil || !ok {
		return nil, err
	}
	dest, err := m.host.readlink(m.clean(target))
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
// no component between root and target is a link. Through csi-proxy it is
// opened in the driver's container.
func (m *linkMounter) OpenTarget(root, target string) (*os.Root, error) {
	target = m.clean(target)
	if err := m.checkBeneath(m.clean(root), target); err != nil {
		return nil, err
	}
	return os.OpenRoot(target)
}

// Published walks root/pods/*/volumes/kubernetes.io~csi/*/mount for links
// whose destination exists. An entry behind a link is skipped (the seam never
// follows one); any other failure to tell fails the listing, so that a host
// that cannot answer (csi-proxy down) never makes a published volume look
// orphaned.
func (m *linkMounter) Published(root string) ([]string, error) {
	root = m.clean(root)
	pods := filepath.Join(root, volume.PodsDir)
	uids, err := m.host.readDir(pods)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, u := range uids {
		if !u.IsDir() {
			continue
		}
		csiDir := filepath.Join(pods, u.Name(), "volumes", "kubernetes.io~csi")
		vols, err := m.host.readDir(csiDir)
		if err != nil {
			continue
		}
		for _, v := range vols {
			if !v.IsDir() {
				continue
			}
			t := filepath.Join(csiDir, v.Name(), volume.MountDir)
			ok, err := m.IsMountPoint(root, t)
			if errors.Is(err, ErrSymlink) {
				continue
			}
			if err != nil {
				return nil, err
			}
			if ok {
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
	if err := m.checkBeneath(root, target); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	st, err := m.host.state(target)
	if err != nil || st == linkMissing {
		return err
	}
	if st == linkDir {
		if empty, err := m.host.isEmptyDir(target); err == nil && !empty {
			return nil
		}
	}
	return m.remove(target)
}
