package mount

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"path/filepath"
	"sync"
	"time"

	fsv1 "github.com/kubernetes-csi/csi-proxy/client/api/filesystem/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/api"
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
	// linkMounter holds the Windows link rules, the HostProcess seam's own
	// (link.go), which ask p.
	linkMounter
	p *proxyHost

	closeOnce sync.Once
}

// proxyHost answers the Windows link rules (linkHost) with csi-proxy v1's
// calls, and reads from the driver's container what csi-proxy has no call
// for (see CSIProxyOptions.local).
type proxyHost struct {
	fs      fsv1.FilesystemClient
	conn    *grpc.ClientConn
	pipe    string
	timeout time.Duration
	local   linkFS
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
	clean := filepath.Clean
	if filepath.Separator == '\\' {
		clean = func(p string) string { return filepath.Clean(NormalizeWindowsPath(p)) }
	}
	p := &proxyHost{fs: fsv1.NewFilesystemClient(conn), conn: conn, pipe: pipe, timeout: opts.CallTimeout, local: opts.local}
	return &CSIProxy{
		linkMounter: linkMounter{host: p, clean: clean, windows: filepath.Separator == '\\'},
		p:           p,
	}, nil
}

// Close closes the connection to csi-proxy.
func (m *CSIProxy) Close() error {
	var err error
	m.closeOnce.Do(func() { err = m.p.conn.Close() })
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

func (p *proxyHost) fail(method, path string, err error) error {
	st, _ := status.FromError(err)
	return &ProxyError{Method: method, Pipe: p.pipe, Path: path, Code: st.Code(), Message: st.Message()}
}

func (p *proxyHost) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), p.timeout)
}

// exists asks csi-proxy whether path exists (as a link too, dangling or not).
func (p *proxyHost) exists(path string) (bool, error) {
	ctx, cancel := p.ctx()
	defer cancel()
	r, err := p.fs.PathExists(ctx, &fsv1.PathExistsRequest{Path: path})
	if err != nil {
		return false, p.fail("PathExists", path, err)
	}
	return r.GetExists(), nil
}

// isLink asks csi-proxy whether path, which exists, is a link (symbolic, or
// a mount point) whose destination exists: csi-proxy v1 answers false for a
// dangling one.
func (p *proxyHost) isLink(path string) (bool, error) {
	ctx, cancel := p.ctx()
	defer cancel()
	r, err := p.fs.IsSymlink(ctx, &fsv1.IsSymlinkRequest{Path: path})
	if err != nil {
		return false, p.fail("IsSymlink", path, err)
	}
	return r.GetIsSymlink(), nil
}

// rmdir asks csi-proxy to remove path: an empty directory or a link (never
// what it points to); with force, a directory and everything in it.
func (p *proxyHost) rmdir(path string, force bool) error {
	ctx, cancel := p.ctx()
	defer cancel()
	if _, err := p.fs.Rmdir(ctx, &fsv1.RmdirRequest{Path: path, Force: force}); err != nil {
		return p.fail("Rmdir", path, err)
	}
	return nil
}

// Mkdir creates the directory path and its missing parents through
// csi-proxy (whose account, normally LocalSystem, owns them). An existing
// directory is not an error. Backends of this mode create their directories
// with it (dir.Options.Host).
func (m *CSIProxy) Mkdir(ctx context.Context, path string) error {
	path = m.clean(path)
	ctx, cancel := context.WithTimeout(ctx, m.p.timeout)
	defer cancel()
	if _, err := m.p.fs.Mkdir(ctx, &fsv1.MkdirRequest{Path: path}); err != nil {
		return m.p.fail("Mkdir", path, err)
	}
	return nil
}

// RemoveAll removes the directory path and everything in it through
// csi-proxy (Rmdir with force: csi-proxy's os.RemoveAll, which does not
// follow links). A missing path is not an error. csi-proxy cannot be stopped
// half-way: ctx bounds the wait, not the removal.
func (m *CSIProxy) RemoveAll(ctx context.Context, path string) error {
	path = m.clean(path)
	ctx, cancel := context.WithTimeout(ctx, m.p.timeout)
	defer cancel()
	r, err := m.p.fs.PathExists(ctx, &fsv1.PathExistsRequest{Path: path})
	if err != nil {
		return m.p.fail("PathExists", path, err)
	}
	if !r.GetExists() {
		return nil
	}
	if _, err := m.p.fs.Rmdir(ctx, &fsv1.RmdirRequest{Path: path, Force: true}); err != nil {
		return m.p.fail("Rmdir", path, err)
	}
	return nil
}

// state asks csi-proxy whether path exists and is a live link, and looks at
// anything else (a dangling link, a directory) from the driver's container:
// csi-proxy v1 has no call that tells them apart.
func (p *proxyHost) state(path string) (linkState, error) {
	ok, err := p.exists(path)
	if err != nil || !ok {
		return linkMissing, err
	}
	live, err := p.isLink(path)
	if err != nil {
		return 0, err
	}
	if live {
		return linkLive, nil
	}
	fi, err := p.local.Lstat(path)
	switch {
	case err != nil:
		return 0, p.unseen(path, err)
	case isLink(fi.Mode()):
		return linkDangling, nil
	case fi.IsDir():
		return linkDir, nil
	}
	return linkOther, nil
}

// isDir asks csi-proxy whether path exists (which also tells that csi-proxy
// accepts it), and whether it is a directory from the driver's container.
func (p *proxyHost) isDir(path string) (bool, error) {
	ok, err := p.exists(path)
	if err != nil {
		return false, err
	}
	if !ok {
		return false, &fs.PathError{Op: "PathExists", Path: path, Err: fs.ErrNotExist}
	}
	fi, err := p.local.Stat(path)
	if err != nil {
		return false, p.unseen(path, err)
	}
	return fi.IsDir(), nil
}

func (p *proxyHost) readlink(path string) (string, error) {
	dest, err := p.local.Readlink(path)
	if err != nil {
		return "", p.unseen(path, err)
	}
	return dest, nil
}

func (p *proxyHost) isEmptyDir(path string) (bool, error) {
	empty, err := p.local.IsEmptyDir(path)
	if err != nil {
		return false, p.unseen(path, err)
	}
	return empty, nil
}

// link asks csi-proxy v1 for the link: source_path is the existing
// directory, target_path the link it creates (os.Symlink(source_path,
// target_path)).
func (p *proxyHost) link(source, target string) error {
	ctx, cancel := p.ctx()
	defer cancel()
	if _, err := p.fs.CreateSymlink(ctx, &fsv1.CreateSymlinkRequest{SourcePath: source, TargetPath: target}); err != nil {
		return p.fail("CreateSymlink", target, err)
	}
	return nil
}

func (p *proxyHost) remove(path string) error { return p.rmdir(path, false) }

func (p *proxyHost) readDir(path string) ([]fs.DirEntry, error) { return p.local.ReadDir(path) }

// unseen explains a failure to see, from the driver's container, what
// csi-proxy reported on the host.
func (p *proxyHost) unseen(path string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("csi-proxy reports %q, which the driver's container does not see: mount the kubelet root into the container at the same path: %w", path, err)
	}
	return err
}
