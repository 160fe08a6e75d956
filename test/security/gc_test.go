//go:build linux

package security

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
)

// fastGC runs the orphan GC every 20ms with a 50ms grace period, without API
// confirmation (the scratch driver's default).
func fastGC(o *framework.Options) {
	o.GC.Interval = 20 * time.Millisecond
	o.GC.OrphanGracePeriod = 50 * time.Millisecond
}

// replacePodsDir puts a tmpfs over the kubelet's pods directory (the node's
// real pods directory, as a mount) and returns a function that detaches it
// lazily: an empty directory shows through, every pod directory looks gone,
// and the volumes mounted below it leave the driver's view while a container
// could still use them from its own mount namespace.
func replacePodsDir(t *testing.T, n *node) func() {
	t.Helper()
	pods := filepath.Join(n.root, "pods")
	if err := unix.Mount("real-pods", pods, "tmpfs", 0, "size=16m"); err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := unix.Unmount(pods, unix.MNT_DETACH); err != nil {
			t.Fatal(err)
		}
	}
}

// publishDirPods publishes a dir volume "data" for a pod of each name and
// writes the pod's name into it.
func publishDirPods(n *node, names ...string) []*drivertest.Pod {
	var pods []*drivertest.Pod
	for _, name := range names {
		p := n.h.Kubelet.NewPod("default", name)
		pods = append(pods, p)
		n.write(n.publish(p, "data", "dir"), "precious", name)
	}
	return pods
}

// TestGCDistrustsAReplacedPodsDir: when the pods directory the driver saw at
// startup is replaced (a mount over it lazily unmounted), the orphan GC
// removes nothing, however long every volume looks orphaned.
func TestGCDistrustsAReplacedPodsDir(t *testing.T) {
	requireRoot(t)
	n := newNode(t, fastGC)
	n.stop()
	detach := replacePodsDir(t, n)
	n.start() // the driver sees the real pods directory (the mount)
	pods := publishDirPods(n, "a", "b", "c")
	detach()
	time.Sleep(500 * time.Millisecond) // 25 GC passes, 10 grace periods
	for _, p := range pods {
		if b, err := os.ReadFile(filepath.Join(n.storage(p, "data"), "precious")); err != nil || string(b) != p.Name {
			t.Errorf("pod %s's volume data after the pods directory was replaced: %q, %v", p.Name, b, err)
		}
		if !n.hasRecord(api.VolumeHandle(p.UID, "data")) {
			t.Errorf("pod %s's volume record was removed", p.Name)
		}
	}
}

// TestGCRefusesAWholesaleOrphaning: a driver that starts after the pods
// directory was replaced trusts the empty one, but a pass in which most
// volumes look orphaned at once removes nothing without API confirmation.
// A single orphan among live volumes is still removed.
func TestGCRefusesAWholesaleOrphaning(t *testing.T) {
	requireRoot(t)
	n := newNode(t, func(o *framework.Options) { o.GC.Interval = -1 })
	n.stop()
	detach := replacePodsDir(t, n)
	n.start()
	pods := publishDirPods(n, "a", "b", "c")
	n.stop()
	detach()
	n.h.Options.GC.Interval, n.h.Options.GC.OrphanGracePeriod = 20*time.Millisecond, 50*time.Millisecond
	n.start() // now on the empty directory
	time.Sleep(500 * time.Millisecond)
	for _, p := range pods {
		if b, err := os.ReadFile(filepath.Join(n.storage(p, "data"), "precious")); err != nil || string(b) != p.Name {
			t.Errorf("pod %s's volume data after every volume looked orphaned: %q, %v", p.Name, b, err)
		}
	}

	// One orphan among live volumes: the GC does its job.
	for _, p := range pods[:2] {
		if err := os.MkdirAll(n.h.Kubelet.PodDir(p), 0o750); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for n.hasRecord(api.VolumeHandle(pods[2].UID, "data")) {
		if time.Now().After(deadline) {
			t.Fatal("the single orphan was never removed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := os.Stat(n.storage(pods[2], "data")); !os.IsNotExist(err) {
		t.Errorf("the orphan's storage is still there: %v", err)
	}
	for _, p := range pods[:2] {
		if _, err := os.Stat(filepath.Join(n.storage(p, "data"), "precious")); err != nil {
			t.Errorf("live volume of %s: %v", p.Name, err)
		}
	}
}
