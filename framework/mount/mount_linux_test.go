//go:build linux

package mount

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ephemera-csi/ephemera/api"
)

var requireRootTests = flag.Bool("test.root", false, "fail, instead of skip, the tests that need root and CAP_SYS_ADMIN")

var (
	canMountOnce sync.Once
	canMountErr  error
)

// requireRoot skips the test unless it runs as root with the right to mount.
func requireRoot(t testing.TB) {
	t.Helper()
	canMountOnce.Do(func() {
		if os.Geteuid() != 0 {
			canMountErr = errors.New("not root")
			return
		}
		dir, err := os.MkdirTemp("", "mountprobe")
		if err != nil {
			canMountErr = err
			return
		}
		defer os.Remove(dir)
		if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=4k"); err != nil {
			canMountErr = fmt.Errorf("mount tmpfs: %w", err)
			return
		}
		canMountErr = unix.Unmount(dir, 0)
	})
	if canMountErr != nil {
		msg := fmt.Sprintf("this test mounts filesystems and needs root with CAP_SYS_ADMIN (%v); run it as root, for example: sudo go test ./framework/mount/", canMountErr)
		if *requireRootTests {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
}

// newRoot returns a fresh directory (a stand-in for the kubelet root) and makes
// sure that everything mounted below it is unmounted when the test ends, even if
// it fails.
func newRoot(t testing.TB) string {
	t.Helper()
	requireRoot(t)
	dir := t.TempDir()
	t.Cleanup(func() { unmountAllUnder(t, dir) }) // runs before TempDir's removal
	return dir
}

// unmountAllUnder unmounts every mount at or below dir, deepest (and, for stacked
// mounts, newest) first.
func unmountAllUnder(t testing.TB, dir string) {
	t.Helper()
	for range 3 {
		infos, err := ReadMountInfo()
		if err != nil {
			t.Errorf("cleanup: %v", err)
			return
		}
		under := MountsUnder(infos, dir)
		if len(under) == 0 {
			return
		}
		slices.SortFunc(under, func(a, b MountInfo) int {
			if c := cmp.Compare(strings.Count(b.MountPoint, "/"), strings.Count(a.MountPoint, "/")); c != 0 {
				return c
			}
			return cmp.Compare(b.ID, a.ID)
		})
		for _, mi := range under {
			if err := unix.Unmount(mi.MountPoint, unix.UMOUNT_NOFOLLOW); err != nil && !errors.Is(err, unix.EINVAL) {
				t.Logf("cleanup: unmount %s: %v; detaching", mi.MountPoint, err)
				_ = unix.Unmount(mi.MountPoint, unix.UMOUNT_NOFOLLOW|unix.MNT_DETACH)
			}
		}
	}
	t.Errorf("cleanup: mounts left under %s", dir)
}

func mountsAt(t testing.TB, path string) int {
	t.Helper()
	infos, err := ReadMountInfo()
	if err != nil {
		t.Fatal(err)
	}
	return MountsAt(infos, path)
}

func mountInfoAt(t testing.TB, path string) MountInfo {
	t.Helper()
	infos, err := ReadMountInfo()
	if err != nil {
		t.Fatal(err)
	}
	for i := len(infos) - 1; i >= 0; i-- {
		if infos[i].MountPoint == path {
			return infos[i]
		}
	}
	t.Fatalf("%s is not in /proc/self/mountinfo", path)
	return MountInfo{}
}

func hasOption(opts, o string) bool { return slices.Contains(strings.Split(opts, ","), o) }

func tmpfsSource(size string) api.Source {
	return api.Source{Path: "tmpfs", FSType: "tmpfs", Options: []string{"size=" + size, "mode=0755"}}
}

// makeMounted creates target below root and mounts src there.
func makeMounted(t *testing.T, m Interface, root, name string, src api.Source) string {
	t.Helper()
	target := filepath.Join(root, name)
	if err := m.MakeTarget(root, target); err != nil {
		t.Fatalf("MakeTarget: %v", err)
	}
	if err := m.Mount(root, src, target); err != nil {
		t.Fatalf("Mount: %v", err)
	}
	return target
}

func mustMountPoint(t *testing.T, m Interface, root, path string, want bool) {
	t.Helper()
	got, err := m.IsMountPoint(root, path)
	if err != nil || got != want {
		t.Fatalf("IsMountPoint(%s) = %v, %v; want %v, nil", path, got, err, want)
	}
	if u, ok := m.(UnsettledChecker); ok {
		if got, err := u.IsMountPointUnsettled(root, path); err != nil || got != want {
			t.Fatalf("IsMountPointUnsettled(%s) = %v, %v; want %v, nil", path, got, err, want)
		}
	}
}

func TestTmpfs(t *testing.T) {
	root := newRoot(t)
	m := New()
	target := makeMounted(t, m, root, "vol", tmpfsSource("1m"))

	mustMountPoint(t, m, root, target, true)
	if n := mountsAt(t, target); n != 1 {
		t.Fatalf("%s is in mountinfo %d times, want once", target, n)
	}
	mi := mountInfoAt(t, target)
	if mi.FSType != "tmpfs" || !hasOption(mi.Options, "nosuid") || !hasOption(mi.Options, "nodev") {
		t.Errorf("mountinfo = %+v, want tmpfs with nosuid,nodev", mi)
	}
	if !hasOption(mi.SuperOptions, "size=1024k") {
		t.Errorf("super options %q, want size=1024k", mi.SuperOptions)
	}

	err := os.WriteFile(filepath.Join(target, "big"), make([]byte, 2<<20), 0o644)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("writing 2 MiB to a 1 MiB tmpfs: %v, want ENOSPC", err)
	}

	if err := m.Unmount(root, target); err != nil {
		t.Fatalf("Unmount: %v", err)
	}
	mustMountPoint(t, m, root, target, false)
	if n := mountsAt(t, target); n != 0 {
		t.Fatalf("%s still in mountinfo %d times", target, n)
	}
	if err := m.RemoveTarget(root, target); err != nil {
		t.Fatalf("RemoveTarget: %v", err)
	}
	if _, err := os.Lstat(target); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("target still there: %v", err)
	}
}

func TestBindMount(t *testing.T) {
	root := newRoot(t)
	m := New()
	src := filepath.Join(root, "backing")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "hello"), []byte("world"), 0o644); err != nil {
		t.Fatal(err)
	}
	target := makeMounted(t, m, root, "vol", api.Source{Path: src})

	got, err := os.ReadFile(filepath.Join(target, "hello"))
	if err != nil || string(got) != "world" {
		t.Fatalf("reading through the bind mount: %q, %v", got, err)
	}
	mi := mountInfoAt(t, target)
	if !hasOption(mi.Options, "nosuid") || !hasOption(mi.Options, "nodev") {
		t.Errorf("bind mount options %q, want nosuid,nodev", mi.Options)
	}
	if mi.Root != src && !strings.HasSuffix(mi.Root, "/backing") {
		t.Errorf("bind mount root %q, want the backing directory", mi.Root)
	}
	if err := m.Unmount(root, target); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(src, "hello")); err != nil {
		t.Fatalf("backing data gone after Unmount: %v", err)
	}
}

// A bind mount within one filesystem has the parent's st_dev; only the mount
// root attribute (or the mount ID) sees it.
func TestIsMountPointSameFilesystemBind(t *testing.T) {
	root := newRoot(t)
	m := New()
	src := filepath.Join(root, "backing")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	target := makeMounted(t, m, root, "vol", api.Source{Path: src})

	var st, parent unix.Stat_t
	if err := unix.Stat(target, &st); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(root, &parent); err != nil {
		t.Fatal(err)
	}
	if st.Dev != parent.Dev {
		t.Fatalf("test setup: st_dev differs (%d, %d); the trap is not armed", st.Dev, parent.Dev)
	}
	mustMountPoint(t, m, root, target, true)
	mustMountPoint(t, m, root, src, false)
}

func TestIsMountPoint(t *testing.T) {
	root := newRoot(t)
	m := New()
	mustMountPoint(t, m, root, filepath.Join(root, "missing"), false)
	mustMountPoint(t, m, root, filepath.Join(root, "missing", "deeper"), false)

	target := makeMounted(t, m, root, "vol", tmpfsSource("64k"))
	mustMountPoint(t, m, root, target, true)
	mustMountPoint(t, m, root, target+"/", true)

	// A symlink to a mount point is never followed: asking about it is an
	// error, not an answer about what it points to.
	link := filepath.Join(root, "link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if got, err := m.IsMountPoint(root, link); got || !errors.Is(err, ErrSymlink) {
		t.Errorf("IsMountPoint(link) = %v, %v; want false, ErrSymlink", got, err)
	}
	if got, err := m.(UnsettledChecker).IsMountPointUnsettled(root, link); got || !errors.Is(err, ErrSymlink) {
		t.Errorf("IsMountPointUnsettled(link) = %v, %v; want false, ErrSymlink", got, err)
	}

	if err := os.Mkdir(filepath.Join(target, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	mustMountPoint(t, m, root, filepath.Join(target, "sub"), false)
}

func TestSetReadOnly(t *testing.T) {
	for _, tc := range []struct {
		name string
		src  func(t *testing.T, root string) api.Source
	}{
		{"tmpfs", func(t *testing.T, root string) api.Source { return tmpfsSource("1m") }},
		{"bind", func(t *testing.T, root string) api.Source {
			src := filepath.Join(root, "backing")
			if err := os.Mkdir(src, 0o755); err != nil {
				t.Fatal(err)
			}
			return api.Source{Path: src}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := newRoot(t)
			m := New()
			src := tc.src(t, root)
			target := makeMounted(t, m, root, "vol", src)
			if err := os.WriteFile(filepath.Join(target, "before"), []byte("x"), 0o644); err != nil {
				t.Fatalf("write before SetReadOnly: %v", err)
			}
			if err := m.SetReadOnly(root, target, true); err != nil {
				t.Fatalf("SetReadOnly: %v", err)
			}
			err := os.WriteFile(filepath.Join(target, "after"), []byte("x"), 0o644)
			if !errors.Is(err, syscall.EROFS) {
				t.Fatalf("write after SetReadOnly: %v, want EROFS", err)
			}
			if got, err := os.ReadFile(filepath.Join(target, "before")); err != nil || string(got) != "x" {
				t.Fatalf("read after SetReadOnly: %q, %v", got, err)
			}
			mi := mountInfoAt(t, target)
			for _, o := range []string{"ro", "nosuid", "nodev"} {
				if !hasOption(mi.Options, o) {
					t.Errorf("options %q lack %s", mi.Options, o)
				}
			}
			if tc.name == "tmpfs" && !hasOption(mi.SuperOptions, "size=1024k") {
				t.Errorf("super options %q lost size=1024k", mi.SuperOptions)
			}
			if src.IsDir() {
				// Only the published mount is read-only, not the backing directory.
				if err := os.WriteFile(filepath.Join(src.Path, "backing-write"), []byte("x"), 0o644); err != nil {
					t.Errorf("backing directory became read-only: %v", err)
				}
			}
			if err := m.SetReadOnly(root, target, true); err != nil {
				t.Errorf("second SetReadOnly: %v", err)
			}
			// A new implementation (a restarted driver) has no memory of the mount.
			if err := New().SetReadOnly(root, target, true); err != nil {
				t.Errorf("SetReadOnly after restart: %v", err)
			}
		})
	}
}

// Flags the source mount carries (here noexec) survive Mount and SetReadOnly; in
// a user namespace they are locked and dropping them would fail with EPERM.
func TestSetReadOnlyKeepsFlags(t *testing.T) {
	root := newRoot(t)
	m := New()
	src := filepath.Join(root, "backing")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", src, "tmpfs", unix.MS_NOEXEC|unix.MS_NOATIME, "size=64k"); err != nil {
		t.Fatal(err)
	}
	target := makeMounted(t, m, root, "vol", api.Source{Path: src})
	if err := m.SetReadOnly(root, target, true); err != nil {
		t.Fatal(err)
	}
	mi := mountInfoAt(t, target)
	for _, o := range []string{"ro", "nosuid", "nodev", "noexec", "noatime"} {
		if !hasOption(mi.Options, o) {
			t.Errorf("options %q lack %s", mi.Options, o)
		}
	}
}

func TestUnmountStacked(t *testing.T) {
	root := newRoot(t)
	m := New()
	target := makeMounted(t, m, root, "vol", tmpfsSource("64k"))
	// Mount never stacks (ErrMounted); older drivers did.
	if err := m.Mount(root, tmpfsSource("64k"), target); !errors.Is(err, ErrMounted) {
		t.Fatalf("Mount over a mount point: %v, want ErrMounted", err)
	}
	for range 2 {
		if err := unix.Mount("tmpfs", target, "tmpfs", 0, "size=64k"); err != nil {
			t.Fatal(err)
		}
	}
	if n := mountsAt(t, target); n != 3 {
		t.Fatalf("%d mounts at %s, want 3", n, target)
	}
	if err := m.Unmount(root, target); err != nil {
		t.Fatalf("Unmount: %v", err)
	}
	if n := mountsAt(t, target); n != 0 {
		t.Fatalf("%d mounts left at %s", n, target)
	}
	mustMountPoint(t, m, root, target, false)
	if err := m.Unmount(root, target); err != nil {
		t.Fatalf("second Unmount: %v", err)
	}
}

func TestUnmountBusy(t *testing.T) {
	root := newRoot(t)
	m := New()
	target := makeMounted(t, m, root, "vol", tmpfsSource("64k"))
	f, err := os.Create(filepath.Join(target, "open"))
	if err != nil {
		t.Fatal(err)
	}
	err = m.Unmount(root, target)
	if !errors.Is(err, unix.EBUSY) || !errors.Is(err, syscall.EBUSY) {
		t.Errorf("Unmount with an open file: %v, want EBUSY", err)
	}
	mustMountPoint(t, m, root, target, true) // not lazily detached
	if err := m.RemoveTarget(root, target); !errors.Is(err, syscall.EBUSY) {
		t.Errorf("RemoveTarget of a mount point: %v, want EBUSY", err)
	}
	f.Close()
	if err := m.Unmount(root, target); err != nil {
		t.Fatalf("Unmount after close: %v", err)
	}
}

func TestMissingIsNil(t *testing.T) {
	root := newRoot(t)
	m := New()
	for _, p := range []string{filepath.Join(root, "missing"), filepath.Join(root, "no", "such", "dir")} {
		if err := m.Unmount(root, p); err != nil {
			t.Errorf("Unmount(%s): %v", p, err)
		}
		if err := m.RemoveTarget(root, p); err != nil {
			t.Errorf("RemoveTarget(%s): %v", p, err)
		}
	}
	// A directory that is not a mount point.
	dir := filepath.Join(root, "plain")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := m.Unmount(root, dir); err != nil {
		t.Errorf("Unmount(plain dir): %v", err)
	}
}

func TestMountErrors(t *testing.T) {
	root := newRoot(t)
	m := New()
	missing := filepath.Join(root, "missing")
	if err := m.Mount(root, tmpfsSource("64k"), missing); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), missing) {
		t.Errorf("Mount on a missing target: %v, want ENOENT naming the target", err)
	}
	target := filepath.Join(root, "vol")
	if err := m.MakeTarget(root, target); err != nil {
		t.Fatal(err)
	}
	if err := m.Mount(root, api.Source{Path: filepath.Join(root, "no-backing")}, target); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("bind of a missing source: %v, want ENOENT", err)
	}
	if err := m.Mount(root, api.Source{Path: "/dev/null", FSType: "no-such-fs"}, target); !errors.Is(err, unix.ENODEV) {
		t.Errorf("unknown filesystem type: %v, want ENODEV", err)
	}
	mustMountPoint(t, m, root, target, false)
	if err := m.SetReadOnly(root, target, true); err == nil {
		t.Errorf("SetReadOnly on a plain directory succeeded")
	}
}

func TestMakeTarget(t *testing.T) {
	root := newRoot(t)
	m := New()
	parent := filepath.Join(root, "pods", "uid", "volumes")
	if err := os.MkdirAll(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(parent, "mount")
	if err := m.MakeTarget(root, target); err != nil {
		t.Fatalf("MakeTarget: %v", err)
	}
	if fi, err := os.Lstat(target); err != nil || !fi.IsDir() || fi.Mode().Perm()&^0o750 != 0 {
		t.Fatalf("target: %v, %v; want a directory, mode at most 0750", fi, err)
	}
	if err := m.MakeTarget(root, target); err != nil {
		t.Fatalf("MakeTarget of an existing directory: %v", err)
	}
	if err := m.MakeTarget(root, filepath.Join(root, "pods", "other", "mount")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing parent: %v, want ErrNotExist", err)
	}

	// Not below root: refused before touching anything.
	for _, bad := range []string{root, filepath.Dir(root), root + "x/mount", filepath.Join(root, "..", "escape"), "relative/mount"} {
		if err := m.MakeTarget(root, bad); err == nil || errors.Is(err, ErrSymlink) {
			t.Errorf("MakeTarget(%q): %v, want a not-below-root error", bad, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(filepath.Dir(root), "escape")); err == nil {
		t.Errorf("MakeTarget created a directory outside root")
	}

	// A symlink below root, relative or absolute, inside or outside root.
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(root, "pods", "evil")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("uid", filepath.Join(root, "pods", "rel")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(root, "pods", "uid"), filepath.Join(root, "pods", "abs")); err != nil {
		t.Fatal(err)
	}
	for _, via := range []string{"evil", "rel", "abs"} {
		bad := filepath.Join(root, "pods", via, "volumes", "mount2")
		if err := m.MakeTarget(root, bad); !errors.Is(err, ErrSymlink) {
			t.Errorf("MakeTarget through symlink %s: %v, want ErrSymlink", via, err)
		}
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Errorf("MakeTarget wrote outside root: %v", entries)
	}
	// A symlink or a file at the target itself.
	if err := m.MakeTarget(root, filepath.Join(root, "pods", "evil")); !errors.Is(err, ErrSymlink) {
		t.Errorf("MakeTarget on a symlink: %v, want ErrSymlink", err)
	}
	file := filepath.Join(parent, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := m.MakeTarget(root, file); err == nil {
		t.Errorf("MakeTarget on a file succeeded")
	}

	// The root itself may be a symlink (operator configuration).
	rootLink := filepath.Join(t.TempDir(), "kubelet")
	if err := os.Symlink(root, rootLink); err != nil {
		t.Fatal(err)
	}
	if err := m.MakeTarget(rootLink, filepath.Join(rootLink, "pods", "uid", "volumes", "via-root-link")); err != nil {
		t.Errorf("MakeTarget below a symlinked root: %v", err)
	}
	if _, err := os.Stat(filepath.Join(parent, "via-root-link")); err != nil {
		t.Errorf("not created: %v", err)
	}
}

func TestRemoveTarget(t *testing.T) {
	root := newRoot(t)
	m := New()
	outside := t.TempDir()
	precious := filepath.Join(outside, "precious")
	if err := os.WriteFile(precious, []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}

	// A symlink at the target: refused (the framework never makes one on
	// Linux), the link and what it points to stay.
	link := filepath.Join(root, "link")
	if err := os.Symlink(outside, link); err != nil {
		t.Fatal(err)
	}
	if err := m.RemoveTarget(root, link); !errors.Is(err, ErrSymlink) {
		t.Fatalf("RemoveTarget(symlink): %v, want ErrSymlink", err)
	}
	if _, err := os.Lstat(link); err != nil {
		t.Errorf("link removed: %v", err)
	}
	if _, err := os.Stat(precious); err != nil {
		t.Fatalf("data behind the link is gone: %v", err)
	}
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(outside, "empty")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}

	// A symlink in the parent path: refused, nothing removed.
	if err := os.Symlink(outside, link); err != nil {
		t.Fatal(err)
	}
	if err := m.RemoveTarget(root, filepath.Join(link, "empty")); !errors.Is(err, ErrSymlink) {
		t.Errorf("RemoveTarget through a symlink: %v, want ErrSymlink", err)
	}
	if _, err := os.Stat(empty); err != nil {
		t.Errorf("directory behind the symlink removed: %v", err)
	}

	// Not empty, or a file: an error, nothing removed.
	full := filepath.Join(root, "full")
	if err := os.MkdirAll(filepath.Join(full, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := m.RemoveTarget(root, full); !errors.Is(err, unix.ENOTEMPTY) {
		t.Errorf("RemoveTarget(non-empty): %v, want ENOTEMPTY", err)
	}
	file := filepath.Join(root, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := m.RemoveTarget(root, file); err == nil {
		t.Errorf("RemoveTarget(file) succeeded")
	}
	if _, err := os.Stat(file); err != nil {
		t.Errorf("file removed: %v", err)
	}
	if err := m.RemoveTarget(root, outside); err == nil {
		t.Errorf("RemoveTarget outside root succeeded")
	}
}

// benchMounts mounts n small tmpfs below a fresh root, to give the mount table
// the size of a busy node, and returns one of the targets.
func benchMounts(b *testing.B, n int) string {
	root := newRoot(b)
	m := New()
	var target string
	for i := range n {
		target = filepath.Join(root, fmt.Sprintf("vol%03d", i))
		if err := m.MakeTarget(root, target); err != nil {
			b.Fatal(err)
		}
		if err := m.Mount(root, tmpfsSource("4k"), target); err != nil {
			b.Fatal(err)
		}
	}
	return target
}

func BenchmarkIsMountPoint(b *testing.B) {
	target := benchMounts(b, 100)
	m := New()
	b.ReportAllocs()
	for b.Loop() {
		if ok, err := m.IsMountPoint(filepath.Dir(target), target); !ok || err != nil {
			b.Fatal(ok, err)
		}
	}
}

func BenchmarkIsMountPointUnsettled(b *testing.B) {
	target := benchMounts(b, 100)
	m := New().(UnsettledChecker)
	b.ReportAllocs()
	for b.Loop() {
		if ok, err := m.IsMountPointUnsettled(filepath.Dir(target), target); !ok || err != nil {
			b.Fatal(ok, err)
		}
	}
}

func BenchmarkReadMountInfo(b *testing.B) {
	target := benchMounts(b, 100)
	b.ReportAllocs()
	for b.Loop() {
		infos, err := ReadMountInfo()
		if err != nil || MountsAt(infos, target) != 1 {
			b.Fatal(err)
		}
	}
	infos, _ := ReadMountInfo()
	b.ReportMetric(float64(len(infos)), "mounts")
}

// The pre-5.8 fallback: with the mount ID it sees everything; with st_dev alone
// it misses a bind mount within one filesystem (why statx is the main path).
func TestMountPointByParent(t *testing.T) {
	root := newRoot(t)
	m := New()
	tmpfs := makeMounted(t, m, root, "tmpfs", tmpfsSource("64k"))
	backing := filepath.Join(root, "backing")
	if err := os.Mkdir(backing, 0o755); err != nil {
		t.Fatal(err)
	}
	bind := makeMounted(t, m, root, "bind", api.Source{Path: backing})
	link := filepath.Join(root, "link")
	if err := os.Symlink(tmpfs, link); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path             string
		byMntID, byStDev bool
	}{
		{tmpfs, true, true},
		{bind, true, false},
		{backing, false, false},
		{link, false, false},
		{"/", true, true},
	} {
		fd, err := unix.Open(tc.path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		var stx unix.Statx_t
		if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW, unix.STATX_BASIC_STATS|unix.STATX_MNT_ID, &stx); err != nil {
			t.Fatal(err)
		}
		if got, err := byParent(fd, &stx); err != nil || got != tc.byMntID {
			t.Errorf("by mount ID %s: %v, %v; want %v", tc.path, got, err, tc.byMntID)
		}
		stx.Mask &^= unix.STATX_MNT_ID
		if got, err := byParent(fd, &stx); err != nil || got != tc.byStDev {
			t.Errorf("by st_dev %s: %v, %v; want %v", tc.path, got, err, tc.byStDev)
		}
	}
}

// A read-only volume can be made writable again (for a content refresh) and
// read-only after; only that mount changes, and a bind of it made meanwhile (as
// the kubelet makes for a container) keeps its read-only flag.
func TestSetReadOnlyReversible(t *testing.T) {
	root := newRoot(t)
	m := New()
	target := makeMounted(t, m, root, "vol", tmpfsSource("1m"))
	if err := m.SetReadOnly(root, target, true); err != nil {
		t.Fatal(err)
	}
	container := filepath.Join(root, "container")
	if err := os.Mkdir(container, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount(target, container, "", syscall.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(container, syscall.MNT_DETACH) })
	if err := m.SetReadOnly(root, target, false); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(target, "refresh"), []byte("x"), 0o644); err != nil {
		t.Fatalf("write after SetReadOnly(false): %v", err)
	}
	if err := os.WriteFile(filepath.Join(container, "x"), nil, 0o644); !errors.Is(err, syscall.EROFS) {
		t.Errorf("the container's bind became writable: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(container, "refresh")); err != nil || string(b) != "x" {
		t.Errorf("the container does not see the refreshed file: %q %v", b, err)
	}
	if err := m.SetReadOnly(root, target, true); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(target, "y"), nil, 0o644); !errors.Is(err, syscall.EROFS) {
		t.Errorf("write after SetReadOnly(true) again: %v", err)
	}
}

// BenchmarkPublishCycle is the mounter's share of a kubelet-shaped tmpfs
// publish and unpublish, as the framework calls it: IsMountPoint of the
// absent target, MakeTarget, Mount; Unmount, RemoveTarget. Its wall time is
// mostly the kernel's RCU grace period in umount; cpu-ns/op is the process's
// CPU time.
func BenchmarkPublishCycle(b *testing.B) {
	root := newRoot(b)
	parent := filepath.Join(root, "pods", "0b6e8a4c-3d1f-4e2a-9c7b-5a8d2f1e6c3b", "volumes", "kubernetes.io~csi", "data")
	if err := os.MkdirAll(parent, 0o750); err != nil {
		b.Fatal(err)
	}
	target := filepath.Join(parent, "mount")
	src := api.Source{Path: "ephemera-tmpfs", FSType: "tmpfs", Options: []string{"size=16777216", "mode=01777", "nr_inodes=4096"}}
	m := New()
	b.ReportAllocs()
	cpu := func() int64 {
		var ru unix.Rusage
		_ = unix.Getrusage(unix.RUSAGE_SELF, &ru)
		return ru.Utime.Nano() + ru.Stime.Nano()
	}
	cpu0 := cpu()
	defer func() { b.ReportMetric(float64(cpu()-cpu0)/float64(b.N), "cpu-ns/op") }()
	for b.Loop() {
		if ok, err := m.IsMountPoint(root, target); ok || err != nil {
			b.Fatal(ok, err)
		}
		if err := m.MakeTarget(root, target); err != nil {
			b.Fatal(err)
		}
		if err := m.Mount(root, src, target); err != nil {
			b.Fatal(err)
		}
		if err := m.Unmount(root, target); err != nil {
			b.Fatal(err)
		}
		if err := m.RemoveTarget(root, target); err != nil {
			b.Fatal(err)
		}
	}
}
