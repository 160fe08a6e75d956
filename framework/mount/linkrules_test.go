package mount_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/ephemera-csi/ephemera/framework/mount"
	fake "github.com/ephemera-csi/ephemera/framework/mount/fakecsiproxy"
)

// The Windows link rules are one rule set carried out by two hosts: the
// driver's own filesystem calls (HostProcess, mount.NewLink) and csi-proxy v1
// (mount.NewCSIProxy). TestLinkRulesBothSeams runs every case through both on
// the real filesystem and asserts the same outcome: the error, and what is at
// the target afterwards.

type linkEnv struct {
	root, target, source, elsewhere string
}

func newLinkEnv(t *testing.T) *linkEnv {
	t.Helper()
	root := filepath.Join(t.TempDir(), "kubelet")
	vols := filepath.Join(root, "plugins", "drv", "volumes")
	e := &linkEnv{
		root:      root,
		target:    filepath.Join(root, "pods", "uid1", "volumes", "kubernetes.io~csi", "v", "mount"),
		source:    filepath.Join(vols, "csi-1"),
		elsewhere: filepath.Join(vols, "other"),
	}
	for _, d := range []string{e.target, e.source, e.elsewhere} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{filepath.Join(e.source, "data"), filepath.Join(e.elsewhere, "data")} {
		if err := os.WriteFile(f, []byte("kept"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// at describes what is at path: "missing", "empty dir", "full dir", "file",
// or "link to <dest>" (the destination relative to the kubelet root).
func (e *linkEnv) at(t *testing.T, path string) string {
	t.Helper()
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
		return "missing"
	case err != nil:
		t.Fatal(err)
	case fi.Mode()&fs.ModeSymlink != 0:
		dest, err := os.Readlink(path)
		if err != nil {
			t.Fatal(err)
		}
		if rel, err := filepath.Rel(e.root, dest); err == nil {
			dest = filepath.ToSlash(rel)
		}
		return "link to " + dest
	case fi.IsDir():
		if ents, err := os.ReadDir(path); err != nil || len(ents) > 0 {
			return "full dir"
		}
		return "empty dir"
	}
	return "file"
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// replace puts a link to dest at path, instead of what is there.
func replace(t *testing.T, path, dest string) {
	t.Helper()
	must(t, os.RemoveAll(path))
	must(t, os.Symlink(dest, path))
}

// errSome stands for any error in a want.
var errSome = errors.New("some error")

// is reports whether err is what want asks for (errSome: any error).
func is(err, want error) bool {
	if want == nil || err == nil {
		return err == want
	}
	return want == errSome || errors.Is(err, want)
}

func checkErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !is(err, want) {
		t.Errorf("%s: %v, want %v", what, err, want)
	}
}

func TestLinkRulesBothSeams(t *testing.T) {
	const (
		missing   = "missing"
		emptyDir  = "empty dir"
		fullDir   = "full dir"
		file      = "file"
		toSource  = "link to plugins/drv/volumes/csi-1"
		toOther   = "link to plugins/drv/volumes/other"
		published = true
	)
	type want struct {
		err    error
		leaves string
	}
	for _, tc := range []struct {
		name      string
		setup     func(t *testing.T, e *linkEnv)
		mounted   bool // IsMountPoint, and Published lists the target
		make      error
		mount     want
		unmount   want
		remove    want // RemoveTarget
		sourceErr error
	}{
		{
			name:    "the kubelet's empty directory",
			make:    nil,
			mount:   want{nil, toSource},
			unmount: want{nil, emptyDir},
			remove:  want{nil, missing},
		},
		{
			name:    "nothing at the target",
			setup:   func(t *testing.T, e *linkEnv) { must(t, os.Remove(e.target)) },
			mount:   want{nil, toSource},
			unmount: want{nil, missing},
			remove:  want{nil, missing},
		},
		{
			name: "a directory that is not empty",
			setup: func(t *testing.T, e *linkEnv) {
				must(t, os.WriteFile(filepath.Join(e.target, "f"), nil, 0o600))
			},
			mount:   want{mount.ErrNotEmpty, fullDir},
			unmount: want{nil, fullDir},
			remove:  want{nil, fullDir},
		},
		{
			name: "a file",
			setup: func(t *testing.T, e *linkEnv) {
				must(t, os.Remove(e.target))
				must(t, os.WriteFile(e.target, nil, 0o600))
			},
			mount:   want{errSome, file},
			unmount: want{nil, file},
			remove:  want{nil, missing},
		},
		{
			name:    "the link Mount makes",
			setup:   func(t *testing.T, e *linkEnv) { replace(t, e.target, e.source) },
			mounted: published,
			mount:   want{nil, toSource},
			unmount: want{nil, missing},
			remove:  want{nil, missing},
		},
		{
			name:    "a live link elsewhere",
			setup:   func(t *testing.T, e *linkEnv) { replace(t, e.target, e.elsewhere) },
			mounted: published,
			mount:   want{fs.ErrExist, toOther},
			unmount: want{nil, missing},
			remove:  want{nil, missing},
		},
		{
			name: "a dangling link",
			setup: func(t *testing.T, e *linkEnv) {
				replace(t, e.target, filepath.Join(filepath.Dir(e.source), "gone"))
			},
			mount:   want{nil, toSource},
			unmount: want{nil, missing},
			remove:  want{nil, missing},
		},
		{
			name: "a live link in the path",
			setup: func(t *testing.T, e *linkEnv) {
				csiDir := filepath.Dir(filepath.Dir(e.target))
				must(t, os.Rename(csiDir, csiDir+".real"))
				must(t, os.Symlink(csiDir+".real", csiDir))
			},
			make:    mount.ErrSymlink,
			mount:   want{mount.ErrSymlink, emptyDir},
			unmount: want{mount.ErrSymlink, emptyDir},
			remove:  want{mount.ErrSymlink, emptyDir},
		},
		{
			name: "a dangling link in the path",
			setup: func(t *testing.T, e *linkEnv) {
				csiDir := filepath.Dir(filepath.Dir(e.target))
				replace(t, csiDir, csiDir+".gone")
			},
			make:    mount.ErrSymlink,
			mount:   want{mount.ErrSymlink, missing},
			unmount: want{mount.ErrSymlink, missing},
			remove:  want{mount.ErrSymlink, missing},
		},
		{
			name: "a file in the path",
			setup: func(t *testing.T, e *linkEnv) {
				vdir := filepath.Dir(e.target)
				must(t, os.RemoveAll(vdir))
				must(t, os.WriteFile(vdir, nil, 0o600))
			},
			make:    errSome,
			mount:   want{errSome, missing},
			unmount: want{errSome, missing},
			remove:  want{errSome, missing},
		},
		{
			name:    "a missing parent",
			setup:   func(t *testing.T, e *linkEnv) { must(t, os.RemoveAll(filepath.Dir(e.target))) },
			make:    fs.ErrNotExist,
			mount:   want{fs.ErrNotExist, missing},
			unmount: want{nil, missing},
			remove:  want{nil, missing},
		},
		{
			name:      "a missing source",
			setup:     func(t *testing.T, e *linkEnv) { must(t, os.RemoveAll(e.source)) },
			mount:     want{fs.ErrNotExist, emptyDir},
			unmount:   want{nil, emptyDir},
			remove:    want{nil, missing},
			sourceErr: fs.ErrNotExist,
		},
		{
			name: "a source that is a file",
			setup: func(t *testing.T, e *linkEnv) {
				must(t, os.RemoveAll(e.source))
				must(t, os.WriteFile(e.source, nil, 0o600))
			},
			mount:     want{errSome, emptyDir},
			unmount:   want{nil, emptyDir},
			remove:    want{nil, missing},
			sourceErr: errSome,
		},
	} {
		for _, seam := range []string{"HostProcess", "csi-proxy"} {
			// start gives a fresh environment in the case's state, and the seam.
			start := func(t *testing.T) (*linkEnv, mount.Interface) {
				e := newLinkEnv(t)
				if err := os.Symlink(e.source, filepath.Join(t.TempDir(), "probe")); err != nil {
					t.Skipf("cannot create symlinks here: %v", err)
				}
				if tc.setup != nil {
					tc.setup(t, e)
				}
				if seam == "HostProcess" {
					return e, mount.NewLink()
				}
				srv := fake.Start(t, e.root)
				m, err := mount.NewCSIProxy(mount.CSIProxyOptions{Dial: srv.Dial})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { m.Close() })
				return e, m
			}
			t.Run(tc.name+"/"+seam, func(t *testing.T) {
				e, m := start(t)
				ok, err := m.IsMountPoint(e.root, e.target)
				if ok != tc.mounted || (err != nil && !is(err, tc.make)) {
					t.Errorf("IsMountPoint: %v, %v; want %v", ok, err, tc.mounted)
				}
				mt, err := m.Inspect(e.root, e.target)
				if (mt != nil) != tc.mounted || (err != nil && !is(err, tc.make)) {
					t.Errorf("Inspect: %+v, %v; want something: %v", mt, err, tc.mounted)
				}
				pub, err := m.Published(e.root)
				if want := tc.mounted; err != nil || slices.Contains(pub, e.target) != want {
					t.Errorf("Published: %v, %v; want the target listed: %v", pub, err, want)
				}
				checkErr(t, "MakeTarget", m.MakeTarget(e.root, e.target), tc.make)

				before := e.at(t, e.target)
				err = m.Mount(e.root, dirSource(e.source), e.target)
				checkErr(t, "Mount", err, tc.mount.err)
				if got := e.at(t, e.target); got != tc.mount.leaves {
					t.Errorf("after Mount (was %s): %s, want %s", before, got, tc.mount.leaves)
				}
				if err == nil {
					if ok, err := m.IsMountPoint(e.root, e.target); !ok || err != nil {
						t.Errorf("IsMountPoint after Mount: %v, %v", ok, err)
					}
				}
			})
			t.Run(tc.name+"/"+seam+"/Unmount", func(t *testing.T) {
				e, m := start(t)
				checkErr(t, "Unmount", m.Unmount(e.root, e.target), tc.unmount.err)
				if got := e.at(t, e.target); got != tc.unmount.leaves {
					t.Errorf("after Unmount: %s, want %s", got, tc.unmount.leaves)
				}
				for _, d := range []string{e.source, e.elsewhere} {
					if b, err := os.ReadFile(filepath.Join(d, "data")); err != nil && tc.sourceErr == nil || err == nil && string(b) != "kept" {
						t.Errorf("data behind a link touched: %q, %v", b, err)
					}
				}
			})
			t.Run(tc.name+"/"+seam+"/RemoveTarget", func(t *testing.T) {
				e, m := start(t)
				checkErr(t, "RemoveTarget", m.RemoveTarget(e.root, e.target), tc.remove.err)
				if got := e.at(t, e.target); got != tc.remove.leaves {
					t.Errorf("after RemoveTarget: %s, want %s", got, tc.remove.leaves)
				}
			})
		}
	}
}
