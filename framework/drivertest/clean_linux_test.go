//go:build linux

package drivertest_test

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/store/memstore"
)

// mountTmpfs mounts a small tmpfs at dir until the test ends.
func mountTmpfs(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("drivertest", dir, "tmpfs", 0, "size=64k"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
}

// RequireClean reports a real mount below the kubelet root, but not one that
// was there before Start.
func TestRequireCleanHostMounts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounts tmpfs: run as root")
	}
	root := filepath.Join(t.TempDir(), "kubelet")
	mountTmpfs(t, filepath.Join(root, "plugins", "before"))
	h := drivertest.Start(t, framework.Options{
		Backends: map[string]framework.Backend{"none": framework.BackendFuncs{}},
		Node:     framework.NodeOptions{KubeletRootDir: root},
		Volumes:  framework.VolumeOptions{Mounter: mount.NewFake()},
		State:    framework.StateOptions{Store: memstore.New()},
	})
	h.RequireClean(t)

	after := filepath.Join(root, "plugins", "after")
	mountTmpfs(t, after)
	got, failed := requireClean(t, h)
	if !failed || len(got) != 1 || got[0] != "drivertest: left behind: mount at "+after {
		t.Errorf("RequireClean with a mount made by the test: failed %v, %q", failed, got)
	}
}
