package unixsock_test

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ephemera-csi/ephemera/framework/internal/unixsock"
)

// sockPath returns a path in a fresh directory with a short name: sun_path
// holds at most 107 bytes, and t.TempDir() embeds the test name.
func sockPath(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "us")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	p := filepath.Join(dir, "s.sock")
	if len(p) > 107 {
		t.Skipf("temp dir too long for a socket path: %s", p)
	}
	return p
}

func listen(t *testing.T, path string) *unixsock.Listener {
	t.Helper()
	l, err := unixsock.Listen(path, 0o600)
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// serves checks that l accepts a connection made to path.
func serves(t *testing.T, path string, l net.Listener) {
	t.Helper()
	accepted := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			c.Close()
		}
		accepted <- err
	}()
	c, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", path, err)
	}
	c.Close()
	select {
	case err := <-accepted:
		if err != nil {
			t.Fatalf("Accept: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the listener did not accept the connection")
	}
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

func TestListenAndClose(t *testing.T) {
	p := sockPath(t)
	l := listen(t, p)
	serves(t, p, l)
	if runtime.GOOS != "windows" {
		fi, err := os.Lstat(p)
		if err != nil || fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != 0o600 {
			t.Fatalf("socket file %v, %v; want a socket with mode 0600", fi, err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if exists(p) {
		t.Error("Close left its own socket file")
	}
	if err := l.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// A second Listen on a live socket fails, saying another process serves it,
// and leaves the first one's socket working.
func TestLiveSocketNotTakenOver(t *testing.T) {
	p := sockPath(t)
	first := listen(t, p)
	second, err := unixsock.Listen(p, 0o600)
	if err == nil {
		second.Close()
		t.Fatal("a second Listen on a live socket succeeded")
	}
	if !errors.Is(err, unixsock.ErrInUse) || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "another process serves") {
		t.Errorf("error %q, want ErrInUse naming %s and saying another process serves it", err, p)
	}
	if err := unixsock.CheckNotServed(p); !errors.Is(err, unixsock.ErrInUse) {
		t.Errorf("CheckNotServed of a live socket = %v, want ErrInUse", err)
	}
	serves(t, p, first)
}

// A socket file nobody listens on (its process was killed) is removed and
// replaced.
func TestStaleSocketReplaced(t *testing.T) {
	p := sockPath(t)
	old, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	old.SetUnlinkOnClose(false)
	old.Close()
	if !exists(p) {
		t.Fatal("setup: the stale socket file is gone")
	}
	if err := unixsock.CheckNotServed(p); err != nil {
		t.Errorf("CheckNotServed of a stale socket = %v, want nil", err)
	}
	l := listen(t, p)
	serves(t, p, l)
}

func TestNonSocketRefused(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("on Windows the file type is not checked (see isWindows)")
	}
	for name, create := range map[string]func(p string) error{
		"regular file": func(p string) error { return os.WriteFile(p, []byte("keep"), 0o600) },
		"directory":    func(p string) error { return os.Mkdir(p, 0o700) },
		"symlink":      func(p string) error { return os.Symlink("elsewhere", p) },
	} {
		t.Run(name, func(t *testing.T) {
			p := sockPath(t)
			if err := create(p); err != nil {
				t.Fatal(err)
			}
			before, _ := os.Lstat(p)
			l, err := unixsock.Listen(p, 0o600)
			if err == nil {
				l.Close()
				t.Fatal("Listen over a non-socket succeeded")
			}
			if !strings.Contains(err.Error(), "not a socket") || !strings.Contains(err.Error(), p) {
				t.Errorf("error %q, want \"not a socket\" naming the path", err)
			}
			if after, err := os.Lstat(p); err != nil || !os.SameFile(before, after) {
				t.Errorf("the %s was removed or replaced: %v", name, err)
			}
		})
	}
}

// A process whose socket was replaced by another's (the other found it stale,
// or an operator removed it) must not remove the other's socket when it closes.
func TestCloseKeepsReplacedSocket(t *testing.T) {
	p := sockPath(t)
	first := listen(t, p)
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	second := listen(t, p)
	if removed, err := first.Unlink(); removed || err != nil {
		t.Errorf("first.Unlink() = %v, %v; want false, nil (the file is not its own)", removed, err)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	if !exists(p) {
		t.Fatal("closing the first listener removed the second one's socket")
	}
	serves(t, p, second)
	if err := second.Close(); err != nil {
		t.Fatal(err)
	}
	if exists(p) {
		t.Error("the second listener left its own socket")
	}
}

// The socket survives Close when Unlink was not first (net's default unlinks
// whatever is at the path): Close of a listener whose file was replaced after
// Listen, as above, but through Close alone.
func TestCloseAloneKeepsReplacedSocket(t *testing.T) {
	p := sockPath(t)
	first := listen(t, p)
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	second := listen(t, p)
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	serves(t, p, second)
}
