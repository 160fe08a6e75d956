//go:build linux

package mount

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ephemera-csi/ephemera/api"
)

// volumeTree makes <base>/pods/u/volumes/kubernetes.io~csi/v/mount and returns
// the target.
func volumeTree(t *testing.T, base string) string {
	t.Helper()
	target := filepath.Join(base, "pods", "u", "volumes", "kubernetes.io~csi", "v", "mount")
	if err := os.MkdirAll(target, 0o750); err != nil {
		t.Fatal(err)
	}
	return target
}

// A symbolic link in any component between the kubelet root and the target
// (the target included) is never followed by any method: each fails with
// ErrSymlink, and the mount the link leads to (outside the root) is neither
// unmounted, remounted nor stacked on.
func TestSymlinkInAnyComponentIsRefused(t *testing.T) {
	base := newRoot(t)
	root := filepath.Join(base, "kubelet")
	outside := filepath.Join(base, "outside")
	m := New()
	comps := []string{"pods", "u", "volumes", "kubernetes.io~csi", "v", "mount"}
	for i := range comps {
		t.Run(comps[i], func(t *testing.T) {
			os.RemoveAll(root)
			target := volumeTree(t, root)
			outTarget := volumeTree(t, outside)
			if err := unix.Mount("sentinel", outTarget, "tmpfs", 0, "size=64k"); err != nil {
				t.Fatal(err)
			}
			defer unix.Unmount(outTarget, unix.MNT_DETACH)
			if err := os.WriteFile(filepath.Join(outTarget, "data"), []byte("precious"), 0o644); err != nil {
				t.Fatal(err)
			}
			// Replace component i below root by a link to its twin outside.
			in := filepath.Join(append([]string{root}, comps[:i+1]...)...)
			out := filepath.Join(append([]string{outside}, comps[:i+1]...)...)
			if err := os.RemoveAll(in); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(out, in); err != nil {
				t.Fatal(err)
			}
			before := mountsAt(t, outTarget)

			src := tmpfsSource("64k")
			for name, call := range map[string]func() error{
				"MakeTarget":   func() error { return m.MakeTarget(root, target) },
				"Mount":        func() error { return m.Mount(root, src, target) },
				"SetReadOnly":  func() error { return m.SetReadOnly(root, target, true) },
				"Unmount":      func() error { return m.Unmount(root, target) },
				"IsMountPoint": func() error { _, err := m.IsMountPoint(root, target); return err },
				"IsMountPointUnsettled": func() error {
					_, err := m.(UnsettledChecker).IsMountPointUnsettled(root, target)
					return err
				},
				"Inspect": func() error { _, err := m.Inspect(root, target); return err },
				"OpenTarget": func() error {
					r, err := m.OpenTarget(root, target)
					if err == nil {
						r.Close()
					}
					return err
				},
			} {
				if i == len(comps)-1 && name == "MakeTarget" {
					continue // MakeTarget's own case: covered by TestMakeTarget
				}
				if err := call(); !errors.Is(err, ErrSymlink) {
					t.Errorf("%s through a link at %s: %v, want ErrSymlink", name, comps[i], err)
				}
			}
			if n := mountsAt(t, outTarget); n != before {
				t.Errorf("mounts at %s outside the root: %d, want %d", outTarget, n, before)
			}
			if b, err := os.ReadFile(filepath.Join(outTarget, "data")); err != nil || string(b) != "precious" {
				t.Errorf("data behind the link: %q, %v", b, err)
			}
			if err := os.WriteFile(filepath.Join(outTarget, "still-writable"), nil, 0o644); err != nil {
				t.Errorf("the mount outside was made read-only: %v", err)
			}
		})
	}
}

// Without mount_setattr(2) (Linux < 5.12) bind mounts still get nosuid,nodev
// and read-only toggles still work, through remounts of the resolved mount.
func TestMountWithoutSetattr(t *testing.T) {
	root := newRoot(t)
	m := &linuxMounter{}
	m.noSetattr.Store(true)
	backing := filepath.Join(root, "backing")
	if err := os.Mkdir(backing, 0o755); err != nil {
		t.Fatal(err)
	}
	target := makeMounted(t, m, root, "vol", api.Source{Path: backing})
	mi := mountInfoAt(t, target)
	for _, o := range []string{"nosuid", "nodev", "rw"} {
		if !hasOption(mi.Options, o) {
			t.Errorf("bind options %q lack %s", mi.Options, o)
		}
	}
	if err := m.SetReadOnly(root, target, true); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(target, "x"), nil, 0o644); !errors.Is(err, syscall.EROFS) {
		t.Errorf("write after SetReadOnly(true): %v, want EROFS", err)
	}
	if mi := mountInfoAt(t, target); !hasOption(mi.Options, "nosuid") || !hasOption(mi.Options, "nodev") {
		t.Errorf("read-only remount dropped nosuid,nodev: %q", mi.Options)
	}
	if err := m.SetReadOnly(root, target, false); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(target, "x"), nil, 0o644); err != nil {
		t.Errorf("write after SetReadOnly(false): %v", err)
	}
}

func TestInspectShowsAndMountedAt(t *testing.T) {
	base := newRoot(t)
	root := filepath.Join(base, "kubelet")
	m := New()
	tmpfsTarget := volumeTree(t, root)
	src := api.Source{Path: "ephemera-test", FSType: "tmpfs", Options: []string{"size=64k"}}
	if err := m.Mount(root, src, tmpfsTarget); err != nil {
		t.Fatal(err)
	}
	mt, err := m.Inspect(root, tmpfsTarget)
	if err != nil || mt == nil || mt.FSType != "tmpfs" || mt.Source != "ephemera-test" || mt.ReadOnly {
		t.Fatalf("Inspect(tmpfs) = %+v, %v", mt, err)
	}
	for _, tc := range []struct {
		src  api.Source
		want bool
	}{
		{api.Source{Path: "ephemera-test", FSType: "tmpfs"}, true},
		{api.Source{Path: "other", FSType: "tmpfs"}, false},
		{api.Source{Path: base}, false},
	} {
		if got, err := m.Shows(mt, tc.src); err != nil || got != tc.want {
			t.Errorf("Shows(tmpfs mount, %+v) = %v, %v; want %v", tc.src, got, err, tc.want)
		}
	}

	backing := filepath.Join(base, "state", "csi-x")
	if err := os.MkdirAll(filepath.Join(backing, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	bindTarget := filepath.Join(root, "pods", "u", "volumes", "kubernetes.io~csi", "w", "mount")
	if err := os.MkdirAll(bindTarget, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := m.Mount(root, api.Source{Path: backing}, bindTarget); err != nil {
		t.Fatal(err)
	}
	mt, err = m.Inspect(root, bindTarget)
	if err != nil || mt == nil {
		t.Fatalf("Inspect(bind) = %+v, %v", mt, err)
	}
	if ok, err := m.Shows(mt, api.Source{Path: backing}); !ok || err != nil {
		t.Errorf("Shows(bind, its directory) = %v, %v", ok, err)
	}
	if ok, err := m.Shows(mt, api.Source{Path: filepath.Join(backing, "sub")}); ok || err != nil {
		t.Errorf("Shows(bind, another directory) = %v, %v", ok, err)
	}
	if mt, err := m.Inspect(root, filepath.Join(root, "pods")); mt != nil || err != nil {
		t.Errorf("Inspect(plain directory) = %+v, %v; want nil", mt, err)
	}

	// A bind of a subdirectory made elsewhere (a subPath mount) counts too.
	elsewhere := filepath.Join(base, "subpath")
	if err := os.Mkdir(elsewhere, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(filepath.Join(backing, "sub"), elsewhere, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	got, err := m.MountedAt(api.Source{Path: backing})
	slices.Sort(got)
	if want := []string{bindTarget, elsewhere}; err != nil || !slices.Equal(got, want) {
		t.Errorf("MountedAt(backing) = %q, %v; want %q", got, err, want)
	}
	other := filepath.Join(base, "state", "csi-y")
	if err := os.Mkdir(other, 0o755); err != nil {
		t.Fatal(err)
	}
	if got, err := m.MountedAt(api.Source{Path: other}); len(got) != 0 || err != nil {
		t.Errorf("MountedAt(unmounted directory) = %q, %v", got, err)
	}
	if got, err := m.MountedAt(src); got != nil || err != nil {
		t.Errorf("MountedAt(tmpfs) = %q, %v; want nil", got, err)
	}

	// Published lists targets of the inline-volume shape only, under the
	// configured root even when it is a link.
	if err := os.MkdirAll(filepath.Join(root, "pods", "u", "volumes", "kubernetes.io~empty-dir", "e"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("x", filepath.Join(root, "pods", "u", "volumes", "kubernetes.io~empty-dir", "e"), "tmpfs", 0, "size=4k"); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "kubelet-link")
	if err := os.Symlink(root, link); err != nil {
		t.Fatal(err)
	}
	pub, err := m.Published(link)
	slices.Sort(pub)
	want := []string{
		filepath.Join(link, "pods", "u", "volumes", "kubernetes.io~csi", "v", "mount"),
		filepath.Join(link, "pods", "u", "volumes", "kubernetes.io~csi", "w", "mount"),
	}
	if err != nil || !slices.Equal(pub, want) {
		t.Errorf("Published = %q, %v; want %q", pub, err, want)
	}
}
