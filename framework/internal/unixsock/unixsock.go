package unixsock

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"runtime"
	"sync"
	"time"
)

// ErrInUse is wrapped by the error Listen returns when a process accepts
// connections on the socket.
var ErrInUse = errors.New("another process serves this socket")

// dialTimeout bounds the liveness check of an existing socket. A live server
// answers a local connect at once (the kernel completes it from the backlog);
// only a server whose backlog is full makes the dial wait, and that server is
// alive too.
const dialTimeout = time.Second

// isWindows: AF_UNIX exists on Windows (10 1803 and later), but how os.Lstat
// reports a socket file there has varied with the Windows build and the Go
// version (a reparse point reported as ModeSocket, ModeIrregular, or a plain
// file). The file-type check is therefore skipped on Windows, as the driver
// always did: whatever is at the path is checked only by dialing it, and
// removed when the dial is refused. Socket file modes do not apply either.
var isWindows = runtime.GOOS == "windows"

// A Listener is a net.Listener on a UNIX socket file created by Listen. Its
// Close removes the file only if it is still the one Listen created.
type Listener struct {
	ln   *net.UnixListener
	path string
	own  fs.FileInfo // the socket file, right after it was bound

	unlinkOnce sync.Once
	removed    bool
	unlinkErr  error

	closeOnce sync.Once
	closeErr  error
}

// Listen listens on the UNIX socket path with the given file mode (ignored on
// Windows). The directory must exist.
//
// If something is already at path:
//   - anything but a socket (on Windows, see isWindows) is refused, never
//     removed;
//   - a socket that accepts a connection is refused with an error wrapping
//     ErrInUse: another process serves it;
//   - a socket whose connect is refused is stale (its process is gone) and is
//     removed;
//   - any other outcome of the check (a timeout, a permission error) is
//     refused: only a socket proven stale is removed.
//
// Two processes that find the same stale socket at the same moment can still
// both remove it and listen in turn; the later one then owns the path and the
// earlier one's Close leaves it in place.
func Listen(path string, mode os.FileMode) (*Listener, error) {
	if err := removeStale(path); err != nil {
		return nil, err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", path, err)
	}
	// Close removes the file itself, and only if it is still ours; net would
	// unlink whatever is at the path.
	ln.SetUnlinkOnClose(false)
	own, err := os.Lstat(path)
	if err != nil {
		// Without its identity the file cannot be told from a newer process's
		// later on, so it is left for the next Listen to find stale.
		_ = ln.Close()
		return nil, fmt.Errorf("stat of socket %s after listening: %w", path, err)
	}
	l := &Listener{ln: ln, path: path, own: own}
	// The kubelet runs as root, so the short window before the chmod does not
	// stop it; the chmod keeps other local users out. Changing the umask
	// instead would affect every goroutine of the process.
	if !isWindows {
		if err := os.Chmod(path, mode); err != nil {
			_ = l.Close()
			return nil, fmt.Errorf("securing socket %s: %w", path, err)
		}
	}
	return l, nil
}

// removeStale removes the socket at path if no process serves it.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("stat of %s: %w", path, err)
	}
	if fi.Mode().Type() != fs.ModeSocket && !isWindows {
		return fmt.Errorf("%s exists and is not a socket (mode %s); refusing to remove it", path, fi.Mode())
	}
	conn, err := net.DialTimeout("unix", path, dialTimeout)
	switch {
	case err == nil:
		_ = conn.Close()
		return inUse(path)
	case errors.Is(err, fs.ErrNotExist):
		return nil // removed since the Lstat
	case !refused(err):
		return fmt.Errorf("cannot tell whether another process serves %s (connecting to it: %v); refusing to remove it", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing stale socket %s: %w", path, err)
	}
	return nil
}

// CheckNotServed returns an error wrapping ErrInUse when a process accepts
// connections on the socket at path, and nil otherwise: nothing there, a stale
// socket, or something Listen refuses or removes. It changes nothing; it lets a
// process fail before doing work that a failing Listen would make pointless.
func CheckNotServed(path string) error {
	conn, err := net.DialTimeout("unix", path, dialTimeout)
	if err != nil {
		return nil
	}
	_ = conn.Close()
	return inUse(path)
}

func inUse(path string) error {
	return fmt.Errorf("%w: %s accepts connections", ErrInUse, path)
}

// Accept waits for and returns the next connection.
func (l *Listener) Accept() (net.Conn, error) { return l.ln.Accept() }

// Addr returns the listener's address.
func (l *Listener) Addr() net.Addr { return l.ln.Addr() }

// Unlink removes the socket file if it is still the one Listen created (same
// device and inode), so that no new connection reaches this process; a file
// another process put there since is left in place. It reports whether it
// removed the file. Only the first call acts; later ones return its result.
// Close calls it.
//
// While the listener is open its socket pins the inode, so the inode number
// cannot have been reused by a newer file: a match is really ours.
func (l *Listener) Unlink() (removed bool, err error) {
	l.unlinkOnce.Do(func() {
		cur, err := os.Lstat(l.path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return
		case err != nil:
			l.unlinkErr = fmt.Errorf("stat of socket %s before removing it: %w", l.path, err)
			return
		case !os.SameFile(l.own, cur):
			return
		}
		if err := os.Remove(l.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			l.unlinkErr = fmt.Errorf("removing socket %s: %w", l.path, err)
			return
		}
		l.removed = true
	})
	return l.removed, l.unlinkErr
}

// Close removes the socket file if it is still ours (see Unlink), then stops
// listening. It may be called more than once, also concurrently (a gRPC server
// closes its listener on Stop); later calls return the first one's error.
func (l *Listener) Close() error {
	l.closeOnce.Do(func() {
		_, uerr := l.Unlink()
		l.closeErr = errors.Join(uerr, l.ln.Close())
	})
	return l.closeErr
}
