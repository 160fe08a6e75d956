//go:build linux

package security

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/drivers/dir"
	"github.com/ephemera-csi/ephemera/drivers/loop"
	"github.com/ephemera-csi/ephemera/drivers/tmpfs"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/test/internal/sysloop"
)

const driverName = "scratch.csi.ephemera.dev"

// node is one test's node: a tmpfs of its own (so fsync is cheap and nothing
// outside it changes) holding the kubelet root, the driver's state dir and
// whatever the test puts "outside" the root, and the driver running
// in-process on it.
type node struct {
	t       *testing.T
	base    string // the node's tmpfs
	root    string // kubelet root
	state   string // driver state dir
	outside string // a directory beside the root, on the same filesystem
	h       *drivertest.Harness
	opts    framework.Options
}

// attrs selects a backend in a pod's volumeAttributes.
var attrs = map[string]map[string]string{
	"tmpfs": {"backend": "tmpfs", "size": "1Mi"},
	"dir":   {"backend": "dir"},
	"loop":  {"backend": "loop", "size": "8Mi"},
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the security tests mount filesystems: run them as root")
	}
}

// newNode mounts the node's tmpfs and registers the cleanup that unmounts and
// detaches everything below it, even when the test fails.
func newNode(t *testing.T, mutate func(*framework.Options)) *node {
	t.Helper()
	requireRoot(t)
	base, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("security-node", base, "tmpfs", 0, "size=512m"); err != nil {
		t.Fatal(err)
	}
	n := &node{t: t, base: base, root: filepath.Join(base, "kubelet"), state: filepath.Join(base, "state"), outside: filepath.Join(base, "outside")}
	t.Cleanup(n.cleanup) // after the harness's cleanup (registered later, runs first)
	for _, d := range []string{filepath.Join(n.root, "pods"), n.outside} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	n.opts = framework.Options{
		DriverName: driverName,
		Backends:   n.backends(),
		Node: framework.NodeOptions{
			KubeletRootDir: n.root,
			StateDir:       n.state,
		},
		Volumes: framework.VolumeOptions{DefaultBackend: "tmpfs"},
		GC:      framework.GCOptions{Interval: -1},
	}
	if mutate != nil {
		mutate(&n.opts)
	}
	n.h = drivertest.Start(t, n.opts)
	return n
}

// storage returns the directory of a dir volume.
func (n *node) storage(pod *drivertest.Pod, name string) string {
	return filepath.Join(n.state, "volumes", api.VolumeHandle(pod.UID, name))
}

func (n *node) backends() map[string]framework.Backend {
	d, err := dir.New(dir.Options{Root: filepath.Join(n.state, "volumes")})
	if err != nil {
		n.t.Fatal(err)
	}
	l, err := loop.New(loop.Options{Dir: filepath.Join(n.state, "loop")})
	if err != nil {
		n.t.Fatal(err)
	}
	mem, err := tmpfs.New(tmpfs.Options{})
	if err != nil {
		n.t.Fatal(err)
	}
	return map[string]framework.Backend{"tmpfs": mem, "dir": d, "loop": l}
}

func (n *node) cleanup() {
	if n.h != nil {
		n.h.Stop()
	}
	if _, err := unmountBelow(n.base, false); err != nil {
		n.t.Errorf("cleanup: %v", err)
	}
	detachLoopsBelow(n.t, n.base)
	if err := unix.Unmount(n.base, unix.MNT_DETACH); err != nil {
		n.t.Errorf("cleanup: unmounting the node's tmpfs: %v", err)
	}
}

// unmountBelow detaches every mount strictly below dir (dir itself too when
// self), deepest first, and returns how many there were.
func unmountBelow(dir string, self bool) (int, error) {
	count := 0
	for range 100 {
		infos, err := mount.ReadMountInfo()
		if err != nil {
			return count, err
		}
		var under []mount.MountInfo
		for _, mi := range mount.MountsUnder(infos, dir) {
			if self || mi.MountPoint != dir {
				under = append(under, mi)
			}
		}
		if len(under) == 0 {
			return count, nil
		}
		slices.SortStableFunc(under, func(a, b mount.MountInfo) int { return len(b.MountPoint) - len(a.MountPoint) })
		for _, mi := range under {
			if err := unix.Unmount(mi.MountPoint, unix.MNT_DETACH); err == nil {
				count++
			} else if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				return count, fmt.Errorf("unmounting %s: %w", mi.MountPoint, err)
			}
		}
	}
	return count, fmt.Errorf("mounts below %s keep coming back", dir)
}

func detachLoopsBelow(t *testing.T, dir string) {
	for _, dev := range sysloop.Below(dir) {
		fd, err := unix.Open(dev.Path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Errorf("cleanup: %s: %v", dev.Path, err)
			continue
		}
		if err := unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0); err != nil {
			t.Errorf("cleanup: detaching %s: %v", dev.Path, err)
		}
		unix.Close(fd)
	}
}

func (n *node) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	n.t.Cleanup(cancel)
	return ctx
}

// stop stops the driver; start starts it again on the same state.
func (n *node) stop()  { n.h.Stop() }
func (n *node) start() { n.h.Restart() }

func (n *node) statePath() string { return filepath.Join(n.state, framework.StateFile) }

// publish publishes vol of pod through the kubelet simulator.
func (n *node) publish(pod *drivertest.Pod, name, backend string) string {
	n.t.Helper()
	vol := drivertest.InlineVolume{Name: name, Attributes: attrs[backend]}
	if err := n.h.Kubelet.Publish(n.ctx(), pod, vol); err != nil {
		n.t.Fatalf("publish %s (%s): %v", name, backend, err)
	}
	return n.h.Kubelet.TargetPath(pod, name)
}

// mountsAt returns the mounts at path.
func (n *node) mountsAt(path string) []mount.MountInfo {
	n.t.Helper()
	infos, err := mount.ReadMountInfo()
	if err != nil {
		n.t.Fatal(err)
	}
	var out []mount.MountInfo
	for _, mi := range infos {
		if mi.MountPoint == path {
			out = append(out, mi)
		}
	}
	return out
}

// wantOneMount fails unless exactly one filesystem is mounted at target.
func (n *node) wantOneMount(target string) {
	n.t.Helper()
	if m := n.mountsAt(target); len(m) != 1 {
		n.t.Fatalf("%d mounts at %s, want exactly 1: %+v", len(m), target, m)
	}
}

func (n *node) write(target, name, data string) {
	n.t.Helper()
	if err := os.WriteFile(filepath.Join(target, name), []byte(data), 0o644); err != nil {
		n.t.Fatalf("writing into the volume: %v", err)
	}
}

func (n *node) wantData(target, name, data string) {
	n.t.Helper()
	b, err := os.ReadFile(filepath.Join(target, name))
	if err != nil || string(b) != data {
		n.t.Fatalf("data in the volume at %s: %q, %v; want %q", target, b, err, data)
	}
}

// wantClean fails if anything of the driver is left on the node: mounts below
// the kubelet root, volume storage, loop devices, records.
func (n *node) wantClean() {
	n.t.Helper()
	infos, err := mount.ReadMountInfo()
	if err != nil {
		n.t.Fatal(err)
	}
	if m := mount.MountsUnder(infos, n.root); len(m) > 0 {
		n.t.Errorf("mounts left below the kubelet root: %+v", m)
	}
	for _, d := range []string{filepath.Join(n.state, "volumes"), filepath.Join(n.state, "loop")} {
		entries, _ := os.ReadDir(d)
		for _, e := range entries {
			if !strings.HasPrefix(e.Name(), ".") {
				n.t.Errorf("storage left: %s", filepath.Join(d, e.Name()))
			}
		}
	}
	if l := sysloop.Below(n.base); len(l) > 0 {
		n.t.Errorf("loop devices left: %v", l)
	}
}

// hasRecord reports whether the running driver has a record of volume id.
func (n *node) hasRecord(id string) bool {
	n.t.Helper()
	_, err := n.h.Node.NodeGetVolumeHealth(n.ctx(), &csi.NodeGetVolumeHealthRequest{VolumeId: id})
	switch status.Code(err) {
	case codes.OK:
		return true
	case codes.NotFound:
		return false
	}
	n.t.Fatalf("NodeGetVolumeHealth(%s): %v", id, err)
	return false
}

// isMountPoint reports whether path (no symbolic link followed) is the root
// of a mount.
func isMountPoint(path string) bool {
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, unix.AT_SYMLINK_NOFOLLOW|unix.AT_NO_AUTOMOUNT, unix.STATX_BASIC_STATS, &st); err != nil {
		return false
	}
	return st.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0
}

func mountFS(source, dir, fstype, data string) error {
	return unix.Mount(source, dir, fstype, 0, data)
}
