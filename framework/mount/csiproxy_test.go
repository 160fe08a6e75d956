package mount_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/mount"
	fake "github.com/ephemera-csi/ephemera/framework/mount/fakecsiproxy"
)

// The csi-proxy v1 seam against a fake csi-proxy on a unix socket: the
// requests it sends (paths, order), what they do on the filesystem, and its
// errors when csi-proxy refuses a call or is down.

type proxyEnv struct {
	root, target, source string
	srv                  *fake.Server
	m                    *mount.CSIProxy
}

// newProxyEnv makes a kubelet root with a pod's volume directory (the
// kubelet's empty target) and a backing directory below the root's plugins
// directory, as the csi-proxy mode places it.
func newProxyEnv(t *testing.T) *proxyEnv {
	t.Helper()
	probe := t.TempDir()
	if err := os.Symlink(probe, filepath.Join(probe, "link")); err != nil {
		t.Skipf("cannot create symlinks here: %v", err)
	}
	root := filepath.Join(t.TempDir(), "kubelet")
	e := &proxyEnv{
		root:   root,
		target: filepath.Join(root, "pods", "uid1", "volumes", "kubernetes.io~csi", "v", "mount"),
		source: filepath.Join(root, "plugins", "drv", "volumes", "csi-1"),
	}
	for _, d := range []string{e.target, e.source} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	e.srv = fake.Start(t, root)
	m, err := mount.NewCSIProxy(mount.CSIProxyOptions{Dial: e.srv.Dial})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	e.m = m
	return e
}

// beneathCalls are the calls checking each component between root and
// target's parent.
func beneathCalls(root, target string) []string {
	var out []string
	rel, _ := filepath.Rel(root, filepath.Dir(target))
	p := root
	for _, c := range strings.Split(rel, string(filepath.Separator)) {
		p = filepath.Join(p, c)
		out = append(out, "PathExists "+p, "IsSymlink "+p)
	}
	return out
}

func callStrings(s *fake.Server) []string {
	var out []string
	for _, c := range s.Calls() {
		out = append(out, c.String())
	}
	s.Reset()
	return out
}

func wantCalls(t *testing.T, what string, got []string, want ...[]string) {
	t.Helper()
	w := slices.Concat(want...)
	if !slices.Equal(got, w) {
		t.Errorf("%s sent\n  %s\nwant\n  %s", what, strings.Join(got, "\n  "), strings.Join(w, "\n  "))
	}
}

func dirSource(p string) api.Source { return api.Source{Path: p} }

func TestCSIProxyPublishUnpublishRequests(t *testing.T) {
	e := newProxyEnv(t)
	check := beneathCalls(e.root, e.target)

	if err := e.m.MakeTarget(e.root, e.target); err != nil {
		t.Fatalf("MakeTarget: %v", err)
	}
	wantCalls(t, "MakeTarget", callStrings(e.srv), check)

	// The kubelet's empty target directory is removed, then the link made.
	if err := e.m.Mount(e.root, dirSource(e.source), e.target); err != nil {
		t.Fatalf("Mount: %v", err)
	}
	wantCalls(t, "Mount", callStrings(e.srv), check, []string{
		"PathExists " + e.source,
		"PathExists " + e.target,
		"IsSymlink " + e.target,
		"Rmdir " + e.target,
		"CreateSymlink " + e.target + " -> " + e.source,
	})
	if dest, err := os.Readlink(e.target); err != nil || dest != e.source {
		t.Fatalf("target after Mount: link to %q (%v), want %q", dest, err, e.source)
	}

	// Mount again: the link is there, nothing is changed.
	if err := e.m.Mount(e.root, dirSource(e.source), e.target); err != nil {
		t.Fatalf("second Mount: %v", err)
	}
	wantCalls(t, "second Mount", callStrings(e.srv), check, []string{
		"PathExists " + e.source, "PathExists " + e.target, "IsSymlink " + e.target,
	})

	ok, err := e.m.IsMountPoint(e.root, e.target)
	if err != nil || !ok {
		t.Fatalf("IsMountPoint: %v, %v; want true", ok, err)
	}
	wantCalls(t, "IsMountPoint", callStrings(e.srv), check, []string{"PathExists " + e.target, "IsSymlink " + e.target})
	mt, err := e.m.Inspect(e.root, e.target)
	if err != nil || mt == nil || mt.Source != e.source {
		t.Fatalf("Inspect: %+v, %v; want source %s", mt, err, e.source)
	}
	if shows, _ := e.m.Shows(mt, dirSource(e.source)); !shows {
		t.Errorf("Shows(%+v, %s) = false", mt, e.source)
	}
	if pub, err := e.m.Published(e.root); err != nil || !slices.Equal(pub, []string{e.target}) {
		t.Errorf("Published: %v, %v; want [%s]", pub, err, e.target)
	}
	if err := os.WriteFile(filepath.Join(e.source, "data"), []byte("kept"), 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := e.m.OpenTarget(e.root, e.target)
	if err != nil {
		t.Fatalf("OpenTarget: %v", err)
	}
	if b, err := r.ReadFile("data"); err != nil || string(b) != "kept" {
		t.Errorf("OpenTarget shows %q, %v", b, err)
	}
	r.Close()
	e.srv.Reset()

	// Unmount removes the link (Rmdir without force), never the data.
	if err := e.m.Unmount(e.root, e.target); err != nil {
		t.Fatalf("Unmount: %v", err)
	}
	wantCalls(t, "Unmount", callStrings(e.srv), check, []string{
		"PathExists " + e.target, "IsSymlink " + e.target, "Rmdir " + e.target,
	})
	if _, err := os.Lstat(e.target); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("target after Unmount: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(e.source, "data")); err != nil || string(b) != "kept" {
		t.Errorf("data behind the link after Unmount: %q, %v", b, err)
	}
	// Unmount and RemoveTarget of what is gone: asked, nothing removed.
	if err := e.m.Unmount(e.root, e.target); err != nil {
		t.Fatalf("second Unmount: %v", err)
	}
	if err := e.m.RemoveTarget(e.root, e.target); err != nil {
		t.Fatalf("RemoveTarget: %v", err)
	}
	wantCalls(t, "Unmount and RemoveTarget of a missing target", callStrings(e.srv),
		check, []string{"PathExists " + e.target}, check, []string{"PathExists " + e.target})
}

func TestCSIProxyRefusals(t *testing.T) {
	t.Run("target not empty", func(t *testing.T) {
		e := newProxyEnv(t)
		if err := os.WriteFile(filepath.Join(e.target, "f"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		err := e.m.Mount(e.root, dirSource(e.source), e.target)
		if !errors.Is(err, mount.ErrNotEmpty) {
			t.Fatalf("Mount over a non-empty target: %v, want ErrNotEmpty", err)
		}
		for _, c := range e.srv.Calls() {
			if c.Method == fake.Rmdir || c.Method == fake.CreateSymlink {
				t.Errorf("sent %s for a target it refused", c)
			}
		}
		// RemoveTarget leaves the pod's files alone.
		if err := e.m.RemoveTarget(e.root, e.target); err != nil {
			t.Fatalf("RemoveTarget: %v", err)
		}
		if _, err := os.Stat(filepath.Join(e.target, "f")); err != nil {
			t.Errorf("RemoveTarget removed a non-empty target: %v", err)
		}
	})
	t.Run("link below the root", func(t *testing.T) {
		e := newProxyEnv(t)
		csiDir := filepath.Dir(filepath.Dir(e.target))
		moved := csiDir + ".real"
		if err := os.Rename(csiDir, moved); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(moved, csiDir); err != nil {
			t.Fatal(err)
		}
		for name, err := range map[string]error{
			"MakeTarget": e.m.MakeTarget(e.root, e.target),
			"Mount":      e.m.Mount(e.root, dirSource(e.source), e.target),
			"Unmount":    e.m.Unmount(e.root, e.target),
		} {
			if !errors.Is(err, mount.ErrSymlink) {
				t.Errorf("%s through a link: %v, want ErrSymlink", name, err)
			}
		}
		for _, c := range e.srv.Calls() {
			if c.Method != fake.PathExists && c.Method != fake.IsSymlink {
				t.Errorf("sent %s through a link", c)
			}
		}
	})
	t.Run("target outside the root", func(t *testing.T) {
		e := newProxyEnv(t)
		err := e.m.Mount(e.root, dirSource(e.source), filepath.Join(e.root+"X", "pods", "t"))
		if err == nil || !strings.Contains(err.Error(), "not below root") {
			t.Fatalf("Mount outside the root: %v", err)
		}
		if c := e.srv.Calls(); len(c) != 0 {
			t.Errorf("sent %v for a target outside the root; the seam checks before csi-proxy's prefix check", c)
		}
	})
	t.Run("source outside csi-proxy's working directories", func(t *testing.T) {
		e := newProxyEnv(t)
		outside := t.TempDir()
		err := e.m.Mount(e.root, dirSource(outside), e.target)
		var pe *mount.ProxyError
		if !errors.As(err, &pe) || pe.Method != fake.PathExists || pe.Code != codes.Unknown ||
			!strings.Contains(pe.Message, "not within the working directories") {
			t.Fatalf("Mount of a source csi-proxy refuses: %v, want its refusal", err)
		}
		if errors.Is(err, api.ErrUnavailable) {
			t.Errorf("csi-proxy's refusal %v matches ErrUnavailable: the kubelet would retry it forever", err)
		}
		// The status is not in the chain: csi-proxy's Unknown never reaches
		// the kubelet as is.
		if _, ok := status.FromError(err); ok {
			t.Errorf("error %v carries csi-proxy's gRPC status", err)
		}
	})
	t.Run("read-only", func(t *testing.T) {
		e := newProxyEnv(t)
		if err := e.m.SetReadOnly(e.root, e.target, true); !errors.Is(err, mount.ErrNotSupported) {
			t.Errorf("SetReadOnly: %v, want ErrNotSupported", err)
		}
		if err := e.m.Mount(e.root, api.Source{Path: "/dev/x", FSType: "ext4"}, e.target); !errors.Is(err, mount.ErrNotSupported) {
			t.Errorf("Mount of a filesystem: %v, want ErrNotSupported", err)
		}
	})
}

func TestCSIProxyDanglingLink(t *testing.T) {
	e := newProxyEnv(t)
	gone := filepath.Join(e.root, "plugins", "drv", "volumes", "gone")
	if err := os.Remove(e.target); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(gone, e.target); err != nil {
		t.Fatal(err)
	}
	if ok, err := e.m.IsMountPoint(e.root, e.target); ok || err != nil {
		t.Fatalf("IsMountPoint of a dangling link: %v, %v; want false", ok, err)
	}
	e.srv.Reset()
	// A republish after a reboot: the dangling link is replaced.
	if err := e.m.Mount(e.root, dirSource(e.source), e.target); err != nil {
		t.Fatalf("Mount over a dangling link: %v", err)
	}
	got := callStrings(e.srv)
	wantCalls(t, "Mount over a dangling link", got[len(got)-3:], []string{
		"IsSymlink " + e.target, "Rmdir " + e.target, "CreateSymlink " + e.target + " -> " + e.source,
	})
	if dest, _ := os.Readlink(e.target); dest != e.source {
		t.Errorf("target links to %q, want %q", dest, e.source)
	}
	// Unmount removes a dangling link too.
	if err := os.Remove(e.target); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(gone, e.target); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Unmount(e.root, e.target); err != nil {
		t.Fatalf("Unmount of a dangling link: %v", err)
	}
	if _, err := os.Lstat(e.target); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("dangling link after Unmount: %v", err)
	}
}

func TestCSIProxyDown(t *testing.T) {
	e := newProxyEnv(t)
	e.srv.Stop()
	err := e.m.Mount(e.root, dirSource(e.source), e.target)
	if !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("Mount with csi-proxy down: %v, want ErrUnavailable", err)
	}
	if !strings.Contains(err.Error(), mount.FilesystemPipe) {
		t.Errorf("error %q does not name the pipe %s", err, mount.FilesystemPipe)
	}
	if _, err := os.Lstat(e.target); err != nil {
		t.Errorf("target touched with csi-proxy down: %v", err)
	}
}

func TestCSIProxyHostDirs(t *testing.T) {
	e := newProxyEnv(t)
	d := filepath.Join(e.root, "plugins", "drv", "volumes", "csi-2", "sub")
	if err := e.m.Mkdir(t.Context(), d); err != nil {
		t.Fatalf("Mkdir: %v", err)
	}
	if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
		t.Fatalf("Mkdir made %v, %v", fi, err)
	}
	top := filepath.Dir(d)
	if err := e.m.RemoveAll(t.Context(), top); err != nil {
		t.Fatalf("RemoveAll: %v", err)
	}
	if err := e.m.RemoveAll(t.Context(), top); err != nil {
		t.Fatalf("RemoveAll of a missing directory: %v", err)
	}
	wantCalls(t, "Mkdir, RemoveAll twice", callStrings(e.srv), []string{
		"Mkdir " + d, "PathExists " + top, "Rmdir " + top + " force", "PathExists " + top,
	})
	if _, err := os.Lstat(top); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("after RemoveAll: %v", err)
	}
	// Failures of csi-proxy are its refusal, with its message.
	e.srv.Fail(func(c fake.Call) error { return errors.New("access is denied") })
	err := e.m.Mkdir(context.Background(), d)
	var pe *mount.ProxyError
	if !errors.As(err, &pe) || pe.Method != fake.Mkdir || pe.Message != "access is denied" || pe.Path != d {
		t.Errorf("Mkdir refused: %v", err)
	}
}

// BenchmarkCSIProxyMountUnmount: one Mount and one Unmount of a pod's target
// through the fake csi-proxy on a unix socket (the request count and the gRPC
// round trips of the seam; the fake's work is a few syscalls per call).
func BenchmarkCSIProxyMountUnmount(b *testing.B) {
	root := filepath.Join(b.TempDir(), "kubelet")
	target := filepath.Join(root, "pods", "uid1", "volumes", "kubernetes.io~csi", "v", "mount")
	source := filepath.Join(root, "plugins", "drv", "volumes", "csi-1")
	for _, d := range []string{filepath.Dir(target), source} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			b.Fatal(err)
		}
	}
	srv := fake.Start(b, root)
	m, err := mount.NewCSIProxy(mount.CSIProxyOptions{Dial: srv.Dial})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	b.ResetTimer()
	for b.Loop() {
		if err := m.Mount(root, dirSource(source), target); err != nil {
			b.Fatal(err)
		}
		if err := m.Unmount(root, target); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	srv.Reset()
	if err := m.Mount(root, dirSource(source), target); err != nil {
		b.Fatal(err)
	}
	if err := m.Unmount(root, target); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(len(srv.Calls())), "calls/op")
}

// BenchmarkLinkMountUnmount is the same cycle through the HostProcess seam
// (the driver links itself), for the ratio.
func BenchmarkLinkMountUnmount(b *testing.B) {
	root := filepath.Join(b.TempDir(), "kubelet")
	target := filepath.Join(root, "pods", "uid1", "volumes", "kubernetes.io~csi", "v", "mount")
	source := filepath.Join(root, "plugins", "drv", "volumes", "csi-1")
	for _, d := range []string{filepath.Dir(target), source} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			b.Fatal(err)
		}
	}
	m := mount.NewLink()
	for b.Loop() {
		if err := m.Mount(root, dirSource(source), target); err != nil {
			b.Fatal(err)
		}
		if err := m.Unmount(root, target); err != nil {
			b.Fatal(err)
		}
	}
}
