package mount

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	fsv1 "github.com/kubernetes-csi/csi-proxy/client/api/filesystem/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/volume"
)

// This file holds the csi-proxy v1 implementation of the seam, without a build
// tag: only the named-pipe dialer (csiproxy_windows.go) is Windows-only, so the
// requests it sends are tested on Linux against a fake csi-proxy on a unix
// socket (package framework/mount/fakecsiproxy).

// FilesystemPipe is the named pipe of csi-proxy's filesystem API, version v1
// (csi-proxy v1.0.0 and later): the one a driver in an ordinary Windows
// container mounts as a hostPath volume.
const FilesystemPipe = `\\.\pipe\csi-proxy-filesystem-v1`

// DefaultCSIProxyCallTimeout is CSIProxyOptions.CallTimeout's default.
const DefaultCSIProxyCallTimeout = 30 * time.Second

// CSIProxyOptions configure [NewCSIProxy].
type CSIProxyOptions struct {
	// Pipe is the named pipe of csi-proxy's filesystem API v1. Defaults to
	// [FilesystemPipe].
	Pipe string
	// Dial connects to pipe. Defaults to the Windows named-pipe dialer
	// (go-winio); on other systems it is required (the tests dial a unix
	// socket that serves the same gRPC API).
	Dial func(ctx context.Context, pipe string) (net.Conn, error)
	// CallTimeout bounds each call to csi-proxy (the seam's methods take no
	// context). Defaults to DefaultCSIProxyCallTimeout.
	CallTimeout time.Duration
	// Local is how the driver's own container sees the host's files below
	// the kubelet root (a hostPath mount at the same path): it reads what
	// csi-proxy v1 has no call for (a link's destination, whether an entry is
	// a dangling link or a directory and whether that is empty, the pods
	// directory's listing) and opens published volumes for the framework's
	// file work. Nothing is ever created or removed through it. Defaults to
	// the os package; unexported because only the tests replace it.
	local linkFS
}

// CSIProxy is the seam of a node plugin in an ordinary (not HostProcess)
// Windows container: every change on the host (a directory, a link, their
// removal) is a call to csi-proxy v1's filesystem API, which runs on the node
// as a service and does what the container may not (a directory symbolic link
// needs SeCreateSymbolicLinkPrivilege). It publishes as the HostProcess seam
// does (a directory symlink at the target to the backing directory, see
// [New]) with these differences:
//
//   - csi-proxy v1 accepts only paths below its working directories (the
//     kubelet's root, C:\var\lib\kubelet, unless its --kubelet-path or
//     --working-dir say otherwise): the backing directory of a volume must be
//     there too, not in the driver's state dir;
//   - csi-proxy takes path strings and checks their prefix and "..": the
//     checks that no component between the kubelet root and the target is a
//     link are made by the seam, call by call, so a link raced into the path
//     between a check and the change it guards is followed (docs/security.md
//     says what holds in this mode instead of the descriptor-based guarantee);
//   - csi-proxy v1 cannot make a link read-only, create a VHDX or mount a
//     filesystem, as the HostProcess seam cannot either.
//
// The paths it sends are normalized with NormalizeWindowsPath on Windows.
// A CSIProxy is safe for concurrent use; Close it when done.
type CSIProxy struct {
	fs      fsv1.FilesystemClient
	conn    *grpc.ClientConn
	pipe    string
	timeout time.Duration
	local   linkFS
	clean   func(string) string
	windows bool

	closeOnce sync.Once
}

var _ Interface = (*CSIProxy)(nil)

// NewCSIProxy returns the csi-proxy v1 seam. It does not connect: the first
// call does, and a csi-proxy that is not running fails that call with an
// error naming the pipe that matches api.ErrUnavailable (gRPC Unavailable for
// the kubelet, which retries).
func NewCSIProxy(opts CSIProxyOptions) (*CSIProxy, error) {
	if opts.Pipe == "" {
		opts.Pipe = FilesystemPipe
	}
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = DefaultCSIProxyCallTimeout
	}
	if opts.Dial == nil {
		opts.Dial = dialPipe
	}
	if opts.Dial == nil {
		return nil, fmt.Errorf("csi-proxy: named pipes exist only on Windows; CSIProxyOptions.Dial is required here: %w", ErrNotSupported)
	}
	if opts.local == nil {
		opts.local = osFS{}
	}
	pipe, dial := opts.Pipe, opts.Dial
	// The target is only a name: the dialer connects to the pipe, which a
	// URL could not carry (backslashes).
	conn, err := grpc.NewClient("passthrough:///csi-proxy-filesystem-v1",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return dial(ctx, pipe) }))
	if err != nil {
		return nil, fmt.Errorf("csi-proxy client for %s: %w", pipe, err)
	}
	windows := filepath.Separator == '\\'
	clean := filepath.Clean
	if windows {
		clean = func(p string) string { return filepath.Clean(NormalizeWindowsPath(p)) }
	}
	return &CSIProxy{
		fs: fsv1.NewFilesystemClient(conn), conn: conn, pipe: pipe, timeout: opts.CallTimeout,
		local: opts.local, clean: clean, windows: windows,
	}, nil
}

// Close closes the connection to csi-proxy.
func (m *CSIProxy) Close() error {
	var err error
	m.closeOnce.Do(func() { err = m.conn.Close() })
	return err
}

// ProxyError is a call to csi-proxy that failed: csi-proxy refused it or
// failed doing it, or was not reachable. It matches api.ErrUnavailable when
// csi-proxy was not reachable (gRPC Unavailable), and context.DeadlineExceeded
// or context.Canceled when the call ran out of time; any other failure is
// final. It carries csi-proxy's code and message, never its status error, so
// that csi-proxy's codes (Unknown for any failure on the host) never reach the
// kubelet as they are.
type ProxyError struct {
	// Method is the csi-proxy call ("CreateSymlink"), Pipe where it was sent.
	Method, Pipe string
	// Path is the path the call was about.
	Path string
	// Code and Message are what csi-proxy (or the gRPC client) answered.
	Code    codes.Code
	Message string
}

func (e *ProxyError) Error() string {
	if e.Code == codes.Unavailable {
		return fmt.Sprintf("csi-proxy is not reachable at %s (is csi-proxy v1 running on the node, and its pipe mounted into the driver's pod?): %s %q: %s",
			e.Pipe, e.Method, e.Path, e.Message)
	}
	return fmt.Sprintf("csi-proxy at %s: %s %q: %s", e.Pipe, e.Method, e.Path, e.Message)
}

// Is matches api.ErrUnavailable, context.DeadlineExceeded and
// context.Canceled by Code.
func (e *ProxyError) Is(target error) bool {
	switch e.Code {
	case codes.Unavailable:
		return target == api.ErrUnavailable
	case codes.DeadlineExceeded:
		return target == context.DeadlineExceeded
	case codes.Canceled:
		return target == context.Canceled
	}
	return false
}

func (m *CSIProxy) fail(method, path string, err error) error {
	st, _ := status.FromError(err)
	return &ProxyError{Method: method, Pipe: m.pipe, Path: path, Code: st.Code(), Message: st.Message()}
}

func (m *CSIProxy) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), m.timeout)
}

// exists asks csi-proxy whether path exists (as a link too, dangling or not).
func (m *CSIProxy) exists(path string) (bool, error) {
	ctx, cancel := m.ctx()
	defer cancel()
	r, err := m.fs.PathExists(ctx, &fsv1.PathExistsRequest{Path: path})
	if err != nil {
		return false, m.fail("PathExists", path, err)
	}
	return r.GetExists(), nil
}

// isLink asks csi-proxy whether path, which exists, is a link (symbolic, or
// a mount point) whose destination exists: csi-proxy v1 answers false for a
// dangling one.
func (m *CSIProxy) isLink(path string) (bool, error) {
	ctx, cancel := m.ctx()
	defer cancel()
	r, err := m.fs.IsSymlink(ctx, &fsv1.IsSymlinkRequest{Path: path})
	if err != nil {
		return false, m.fail("IsSymlink", path, err)
	}
	return r.GetIsSymlink(), nil
}

// rmdir asks csi-proxy to remove path: an empty directory or a link (never
// what it points to); with force, a directory and everything in it.
func (m *CSIProxy) rmdir(path string, force bool) error {
	ctx, cancel := m.ctx()
	defer cancel()
	if _, err := m.fs.Rmdir(ctx, &fsv1.RmdirRequest{Path: path, Force: force}); err != nil {
		return m.fail("Rmdir", path, err)
	}
	return nil
}

// Mkdir creates the directory path and its missing parents through
// csi-proxy (whose account, normally LocalSystem, owns them). An existing
// directory is not an error. Backends of this mode create their directories
// with it (dir.Options.Host).
func (m *CSIProxy) Mkdir(ctx context.Context, path string) error {
	path = m.clean(path)
	ctx, cancel := context.WithTimeout(ctx, m.timeout)
	defer cancel()
	if _, err := m.fs.Mkdir(ctx, &fsv1.MkdirRequest{Path: path}); err != nil {
		return m.fail("Mkdir", path, err)
	}
	return nil
}

// RemoveAll removes the directory path and everything in it through
// csi-proxy (Rmdir with force: csi-proxy's os.RemoveAll, which does not
// follow links). A missing path is not an error. csi-proxy cannot be stopped
// half-way: ctx bounds the wait, not the removal.
func (m *CSIProxy) RemoveAll(ctx context.Context, path string) error {
	path = m.clean(path)
	ctx, cancel := context.WithTimeout(ctx, m.timeout)
	defer cancel()
	r, err := m.fs.PathExists(ctx, &fsv1.PathExistsRequest{Path: path})
	if err != nil {
		return m.fail("PathExists", path, err)
	}
	if !r.GetExists() {
		return nil
	}
	if _, err := m.fs.Rmdir(ctx, &fsv1.RmdirRequest{Path: path, Force: true}); err != nil {
		return m.fail("Rmdir", path, err)
	}
	return nil
}

// checkBeneath checks that target lies below root and that every component
// between them (target's parent included, root and target excluded) exists
// and is no link, asking csi-proxy about each. Unlike the descriptor-based
// checks of the Linux seam, the answer holds only at the moment it is given.
func (m *CSIProxy) checkBeneath(root, target string) error {
	parent, _, err := splitBeneath(root, target)
	if err != nil {
		return err
	}
	if parent == "." {
		return nil
	}
	p := root
	for _, c := range strings.Split(parent, string(filepath.Separator)) {
		p = filepath.Join(p, c)
		ok, err := m.exists(p)
		if err != nil {
			return err
		}
		if !ok {
			return &fs.PathError{Op: "PathExists", Path: p, Err: fs.ErrNotExist}
		}
		link, err := m.isLink(p)
		if err != nil {
			return err
		}
		if link {
			return fmt.Errorf("%q below root %q: %w", p, root, ErrSymlink)
		}
	}
	return nil
}

// MakeTarget creates nothing, as on HostProcess: the link is made where
// nothing exists. It checks that target's parent exists below root and that
// no component between them is a link.
func (m *CSIProxy) MakeTarget(root, target string) error {
	return m.checkBeneath(m.clean(root), m.clean(target))
}

// Mount asks csi-proxy to link target to the directory src.Path
// (CreateSymlink), which must exist below csi-proxy's working directories.
// An empty directory or a dangling link at target is removed first (Rmdir);
// a directory that is not empty is ErrNotEmpty; a live link to src.Path is
// success, one to anything else an error wrapping fs.ErrExist.
func (m *CSIProxy) Mount(root string, src api.Source, target string) error {
	if !src.IsDir() {
		return fmt.Errorf("mount %s %q: csi-proxy v1 links directories only, publish a directory: %w",
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
	ok, err := m.exists(source)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("source of %q: %w", target, &fs.PathError{Op: "PathExists", Path: source, Err: fs.ErrNotExist})
	}
	if ok, err = m.exists(target); err != nil {
		return err
	}
	if ok {
		if err := m.clearTarget(target, source); err != nil {
			if errors.Is(err, errLinked) {
				return nil
			}
			return err
		}
	}
	ctx, cancel := m.ctx()
	defer cancel()
	// csi-proxy v1: source_path is the existing directory, target_path the
	// link it creates (os.Symlink(source_path, target_path)).
	if _, err := m.fs.CreateSymlink(ctx, &fsv1.CreateSymlinkRequest{SourcePath: source, TargetPath: target}); err != nil {
		return m.fail("CreateSymlink", target, err)
	}
	return nil
}

// errLinked: the target already is the link Mount would make.
var errLinked = errors.New("already linked")

// clearTarget makes room for the link at target, which exists: errLinked
// when it already is a live link to source.
func (m *CSIProxy) clearTarget(target, source string) error {
	link, err := m.isLink(target)
	if err != nil {
		return err
	}
	if link {
		dest, err := m.local.Readlink(target)
		if err != nil {
			return m.unseen(target, err)
		}
		if sameLinkTarget(dest, source, m.windows) {
			return errLinked
		}
		return fmt.Errorf("target %q is already a link to %q, not to %q: %w", target, dest, source, fs.ErrExist)
	}
	fi, err := m.local.Lstat(target)
	if err != nil {
		return m.unseen(target, err)
	}
	switch {
	case isLink(fi.Mode()):
		// Dangling: csi-proxy removes the link itself, never anything behind it.
	case fi.IsDir():
		empty, err := m.local.IsEmptyDir(target)
		if err != nil {
			return m.unseen(target, err)
		}
		if !empty {
			return fmt.Errorf("target %q: %w", target, ErrNotEmpty)
		}
	default:
		return &fs.PathError{Op: "mount", Path: target, Err: errors.New("exists and is not a directory")}
	}
	return m.rmdir(target, false)
}

// unseen explains a failure to see, from the driver's container, what
// csi-proxy reported on the host.
func (m *CSIProxy) unseen(path string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("csi-proxy reports %q, which the driver's container does not see: mount the kubelet root into the container at the same path: %w", path, err)
	}
	return err
}

// SetReadOnly returns ErrNotSupported for readOnly: a directory link cannot
// be made read-only (see linkMounter.SetReadOnly).
func (m *CSIProxy) SetReadOnly(_, target string, readOnly bool) error {
	if !readOnly {
		return nil
	}
	return fmt.Errorf("read-only publish of %q: a Windows directory link cannot be made read-only: %w", target, ErrNotSupported)
}

// Unmount asks csi-proxy to remove the link at target (Rmdir), never what it
// points to; a dangling link is removed too. A missing target, or one that is
// not a link, is left alone and is not an error.
func (m *CSIProxy) Unmount(root, target string) error {
	root, target = m.clean(root), m.clean(target)
	if err := m.checkBeneath(root, target); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	ok, err := m.exists(target)
	if err != nil || !ok {
		return err
	}
	link, err := m.isLink(target)
	if err != nil {
		return err
	}
	if !link {
		fi, err := m.local.Lstat(target)
		if err != nil || !isLink(fi.Mode()) {
			return nil // a directory (or not visible here): not ours to remove
		}
	}
	return m.rmdir(target, false)
}

// IsMountPoint reports whether target is a link whose destination exists
// (csi-proxy's IsSymlink).
func (m *CSIProxy) IsMountPoint(root, target string) (bool, error) {
	root, target = m.clean(root), m.clean(target)
	if err := m.checkBeneath(root, target); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return false, nil
		}
		return false, err
	}
	ok, err := m.exists(target)
	if err != nil || !ok {
		return false, err
	}
	return m.isLink(target)
}

// Inspect describes the live link at target: Source is its destination, read
// from the driver's container (csi-proxy v1 has no call for it).
func (m *CSIProxy) Inspect(root, target string) (*Mounted, error) {
	ok, err := m.IsMountPoint(root, target)
	if err != nil || !ok {
		return nil, err
	}
	target = m.clean(target)
	dest, err := m.local.Readlink(target)
	if err != nil {
		return nil, m.unseen(target, err)
	}
	return &Mounted{Source: dest}, nil
}

// Shows reports whether the link mt describes points to the directory src.
func (m *CSIProxy) Shows(mt *Mounted, src api.Source) (bool, error) {
	if mt == nil || !src.IsDir() {
		return false, nil
	}
	return sameLinkTarget(mt.Source, m.clean(src.Path), m.windows), nil
}

// MountedAt returns nil, as on HostProcess: a link does not pin its
// destination.
func (m *CSIProxy) MountedAt(api.Source) ([]string, error) { return nil, nil }

// OpenTarget opens, in the driver's container, the directory the link at
// target shows, after asking csi-proxy that no component between root and
// target is a link.
func (m *CSIProxy) OpenTarget(root, target string) (*os.Root, error) {
	root, target = m.clean(root), m.clean(target)
	if err := m.checkBeneath(root, target); err != nil {
		return nil, err
	}
	return os.OpenRoot(target)
}

// Published lists root/pods/*/volumes/kubernetes.io~csi/*/mount in the
// driver's container and asks csi-proxy which of them are live links.
func (m *CSIProxy) Published(root string) ([]string, error) {
	root = m.clean(root)
	pods := filepath.Join(root, volume.PodsDir)
	uids, err := m.local.ReadDir(pods)
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
		vols, err := m.local.ReadDir(csiDir)
		if err != nil {
			continue
		}
		for _, v := range vols {
			if !v.IsDir() {
				continue
			}
			t := filepath.Join(csiDir, v.Name(), volume.MountDir)
			ok, err := m.IsMountPoint(root, t)
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

// RemoveTarget asks csi-proxy to remove target (an empty directory, or a
// link, never what it points to). A directory that is not empty is left in
// place and is not an error (see linkMounter.RemoveTarget).
func (m *CSIProxy) RemoveTarget(root, target string) error {
	root, target = m.clean(root), m.clean(target)
	if err := m.checkBeneath(root, target); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	ok, err := m.exists(target)
	if err != nil || !ok {
		return err
	}
	link, err := m.isLink(target)
	if err != nil {
		return err
	}
	if !link {
		if fi, err := m.local.Lstat(target); err == nil && fi.IsDir() && !isLink(fi.Mode()) {
			if empty, err := m.local.IsEmptyDir(target); err == nil && !empty {
				return nil
			}
		}
	}
	return m.rmdir(target, false)
}
