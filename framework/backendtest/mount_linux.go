//go:build linux

package backendtest

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/mount"
)

func canMount() (bool, string) {
	if os.Geteuid() != 0 {
		return false, "mounting needs root"
	}
	return true, ""
}

// mount publishes src at v.TargetPath as the framework does (MakeTarget, then
// Mount) and unpublishes it at cleanup.
func (e *env) mount(t *testing.T, v *api.Volume, src api.Source) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(v.TargetPath), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := e.mounter.MakeTarget(e.kubeletRoot, v.TargetPath); err != nil {
		t.Fatalf("creating target: %v", err)
	}
	t.Cleanup(func() {
		if err := e.mounter.Unmount(e.kubeletRoot, v.TargetPath); err != nil {
			t.Errorf("cleanup: unmounting %s: %v", v.TargetPath, err)
		}
		if err := e.mounter.RemoveTarget(e.kubeletRoot, v.TargetPath); err != nil {
			t.Errorf("cleanup: removing %s: %v", v.TargetPath, err)
		}
	})
	if err := e.mounter.Mount(e.kubeletRoot, src, v.TargetPath); err != nil {
		t.Fatalf("mounting the Source %+v that Create returned: %v", src, err)
	}
	e.checkMounted(t, v.TargetPath, src)
}

// unmount unpublishes target as the framework's teardown does.
func (e *env) unmount(t *testing.T, target string) {
	t.Helper()
	if err := e.mounter.Unmount(e.kubeletRoot, target); err != nil {
		t.Fatalf("unmounting %s: %v", target, err)
	}
}

// checkMounted checks that exactly one filesystem is mounted at target, of type
// Options.FSType (or the Source's FSType when that is unset).
func (e *env) checkMounted(t *testing.T, target string, src api.Source) {
	t.Helper()
	infos, err := mount.ReadMountInfo()
	if err != nil {
		t.Fatal(err)
	}
	target = filepath.Clean(target)
	var at []mount.MountInfo
	for _, mi := range infos {
		if mi.MountPoint == target {
			at = append(at, mi)
		}
	}
	if len(at) != 1 {
		t.Fatalf("%d mounts at %s, want exactly 1", len(at), target)
	}
	want := e.s.opts.FSType
	if want == "" && !src.IsDir() {
		want = src.FSType
	}
	if want != "" && at[0].FSType != want {
		t.Errorf("filesystem mounted at the target is %q (source %q), want %q", at[0].FSType, at[0].Source, want)
	}
}

// unmountLeftovers detaches, deepest first, whatever is still mounted below
// dir and reports it: every mount a subtest makes must be gone by now.
func unmountLeftovers(t *testing.T, dir string) {
	infos, err := mount.ReadMountInfo()
	if err != nil {
		t.Error(err)
		return
	}
	if d, err := filepath.EvalSymlinks(dir); err == nil {
		dir = d
	}
	under := mount.MountsUnder(infos, dir)
	for i := len(under) - 1; i >= 0; i-- {
		t.Errorf("cleanup: %s was left mounted (%s from %s); detaching it", under[i].MountPoint, under[i].FSType, under[i].Source)
		if err := syscall.Unmount(under[i].MountPoint, syscall.MNT_DETACH); err != nil {
			t.Errorf("cleanup: unmounting %s: %v", under[i].MountPoint, err)
		}
	}
}

func isNoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}
