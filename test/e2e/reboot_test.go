//go:build e2e && linux

package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestNodeReboot simulates a node reboot under running pods: the kubelet, the
// driver and containerd stop, every container dies, everything mounted below
// the kubelet's root and containerd's state dir is unmounted (tmpfs contents
// vanish), the runtime's state (a tmpfs /run on a real node) is wiped and the
// loop devices are detached; the driver's state dir, the loop backing files,
// the kubelet's root and containerd's root stay, as they would on disk. A pod is
// force-deleted while the node is down. Then containerd, the kubelet and the
// driver start again:
//   - the pods that still exist (restartPolicy Always) run again, their volume
//     republished at the target exactly once: the tmpfs volume fresh and empty,
//     the loop volume re-attached to its backing file with the data written
//     before the reboot;
//   - the deleted pod's loop volume is removed (device, file, record, target);
//   - after the survivors are deleted nothing is left: no mount below the
//     kubelet's pods dir, no loop device bound to a backing file of the
//     driver, no backing file, no record.
func TestNodeReboot(t *testing.T) {
	c := clu
	if c.runtime != runtimeContainerd {
		t.Skip("needs containers that die and restart: EPHEMERA_E2E_RUNTIME=containerd")
	}
	d := requireDriver(t)
	ctx := context.Background()
	tmpfsVol := tmpfsVolume("scratch", "8Mi")
	loopVol := csiVolume("disk", map[string]string{"backend": "loop", "size": "64Mi"})
	always := func(p *corev1.Pod) *corev1.Pod {
		p.Spec.RestartPolicy = corev1.RestartPolicyAlways
		return p
	}
	keepTmpfs := c.createPod(t, always(c.newPod("default", "reboot-tmpfs", tmpfsVol, nil)))
	keepLoop := c.createPod(t, always(c.newPod("default", "reboot-loop", loopVol, nil)))
	gone := c.createPod(t, c.newPod("default", "reboot-gone", loopVol, nil))
	pods := []*corev1.Pod{keepTmpfs, keepLoop, gone}
	defer func() {
		for _, p := range pods {
			c.deletePod(t, p, 0)
		}
	}()
	sums := map[string]string{}
	for i, p := range pods {
		pods[i] = c.waitRunning(t, p, runningTimeout)
		w := wantStep(t, c.exec(t, pods[i], "write", "/data/before", "65536"), 0, "write ok")
		sums[p.Name] = w[strings.Index(w, "sha256="):]
	}
	keepTmpfs, keepLoop, gone = pods[0], pods[1], pods[2]
	loopDir := filepath.Join(d.stateDir, "loop")
	fileOf := func(p *corev1.Pod) string {
		return filepath.Join(loopDir, volumeHandle(string(p.UID), p.Spec.Volumes[0].Name)+".img")
	}
	for _, p := range []*corev1.Pod{keepLoop, gone} {
		if devs := loopDevicesOf(fileOf(p)); len(devs) != 1 {
			t.Fatalf("pod %s: loop devices bound to %s: %v, want one", p.Name, fileOf(p), devs)
		}
	}

	t0 := time.Now()
	c.powerOff(t, loopDir)
	t.Logf("node down in %v", time.Since(t0).Round(100*time.Millisecond))
	if ms := mountsUnder(c.kubeletRoot); len(ms) > 0 {
		t.Fatalf("%d mounts left below the kubelet root after power-off, e.g. %s", len(ms), ms[0].MountPoint)
	}
	zero := int64(0)
	if err := c.cs.CoreV1().Pods(gone.Namespace).Delete(ctx, gone.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	since := d.logSize()
	t1 := time.Now()
	c.powerOn(t)
	t.Logf("node up again in %v", time.Since(t1).Round(100*time.Millisecond))

	for _, p := range []*corev1.Pod{keepTmpfs, keepLoop} {
		c.waitRestarted(t, p, 2*time.Minute)
		vol := p.Spec.Volumes[0]
		m := c.published(t, p, vol)
		h := volumeHandle(string(p.UID), vol.Name)
		if n := len(d.rpcLines(since, "NodePublishVolume", h)); n < 1 {
			t.Errorf("pod %s: no NodePublishVolume after the reboot", p.Name)
		}
		if p == keepTmpfs {
			if m.FSType != "tmpfs" {
				t.Errorf("pod %s: volume mounted as %s, want tmpfs", p.Name, m.FSType)
			}
			out := c.exec(t, p, "ls", "/data", "--", "read", "/data/before")
			if l := wantStep(t, out, 0, "ls ok"); l != "" && !strings.HasSuffix(l, "entries=") {
				t.Errorf("pod %s: tmpfs volume not empty after the reboot: %s", p.Name, l)
			}
			wantStep(t, out, 1, "read err ENOENT")
			continue
		}
		if m.FSType != "ext4" {
			t.Errorf("pod %s: volume mounted as %s, want ext4", p.Name, m.FSType)
		}
		if devs := loopDevicesOf(fileOf(p)); len(devs) != 1 || devs[0] != m.Source {
			t.Errorf("pod %s: loop devices bound to %s: %v, want exactly the mounted %s", p.Name, fileOf(p), devs, m.Source)
		}
		r := wantStep(t, c.exec(t, p, "read", "/data/before"), 0, "read ok", "size=65536")
		if !strings.HasSuffix(r, sums[p.Name]) {
			t.Errorf("pod %s: data written before the reboot reads back as %q, want %s", p.Name, r, sums[p.Name])
		}
	}

	// The pod deleted while the node was down: its volume goes too.
	gh := volumeHandle(string(gone.UID), gone.Spec.Volumes[0].Name)
	err := waitFor(ctx, 90*time.Second, 250*time.Millisecond, "the deleted pod's loop volume removed", func() (bool, error) {
		if devs := loopDevicesOf(fileOf(gone)); len(devs) > 0 {
			return false, fmt.Errorf("loop devices %v still bound to %s", devs, fileOf(gone))
		}
		if _, err := os.Stat(fileOf(gone)); !os.IsNotExist(err) {
			return false, fmt.Errorf("backing file %s still there (%v)", fileOf(gone), err)
		}
		return true, nil
	})
	if err != nil {
		t.Error(err)
	}
	how := "neither NodeUnpublishVolume nor the orphan GC in the driver log"
	if len(d.rpcLines(since, "NodeUnpublishVolume", gh)) > 0 {
		how = "the kubelet's NodeUnpublishVolume (volume reconstructed from the pod directory)"
	} else if l := d.logSince(since); strings.Contains(l, "Removed orphaned volume") && strings.Contains(l, gh) {
		how = "the driver's orphan GC"
	}
	t.Logf("the deleted pod's volume removed within %v of the node coming up, by %s", time.Since(t1).Round(100*time.Millisecond), how)
	c.cleanedUp(t, gone, gone.Spec.Volumes[0])

	handles := []string{gh}
	for _, p := range []*corev1.Pod{keepTmpfs, keepLoop} {
		handles = append(handles, volumeHandle(string(p.UID), p.Spec.Volumes[0].Name))
		c.deletePod(t, p, goneTimeout)
		c.cleanedUp(t, p, p.Spec.Volumes[0])
	}
	if ms := mountsUnder(filepath.Join(c.kubeletRoot, "pods")); len(ms) > 0 {
		t.Errorf("%d mounts left below the kubelet's pods dir, e.g. %s", len(ms), ms[0].MountPoint)
	}
	for _, p := range []*corev1.Pod{keepLoop, gone} {
		if devs := loopDevicesOf(fileOf(p)); len(devs) > 0 {
			t.Errorf("loop devices still bound to %s: %v", fileOf(p), devs)
		}
		if _, err := os.Stat(fileOf(p)); !os.IsNotExist(err) {
			t.Errorf("backing file %s left (%v)", fileOf(p), err)
		}
	}
	d.assertNoRecords(t, handles...)
}

// powerOff stops the node as a reboot would: the kubelet, the driver and
// containerd stop, every container and shim dies, everything mounted below the
// kubelet's root and containerd's state dir is unmounted, the kubelet's pod
// cgroups are removed, the runtime's volatile state (runc's and containerd's state dirs: /run on a real node) is
// removed and the loop devices bound to files in loopDir are detached. What a
// disk keeps stays: the driver's state dir and backing files, the kubelet's
// root, containerd's root (images, container metadata).
func (c *cluster) powerOff(t *testing.T, loopDir string) {
	t.Helper()
	c.kubelet.stop(15 * time.Second)
	c.drv.stop()
	c.cri.kill()
	runcRoot := filepath.Join(c.runcRoot, "k8s.io")
	ids, _ := os.ReadDir(runcRoot)
	for _, id := range ids {
		if out, err := exec.Command("runc", "--root", runcRoot, "delete", "--force", id.Name()).CombinedOutput(); err != nil {
			t.Logf("runc delete --force %s: %v: %s", id.Name(), err, out)
		}
	}
	// The user-namespace handler's containers (a soak's hostUsers: false
	// pods), with the runc that made them, as teardown does.
	if bin, err := os.ReadFile(usernsRuncRoot(c.dir) + ".bin"); err == nil {
		root := filepath.Join(usernsRuncRoot(c.dir), "k8s.io")
		uids, _ := os.ReadDir(root)
		for _, id := range uids {
			if out, err := exec.Command(string(bin), "--root", root, "delete", "--force", id.Name()).CombinedOutput(); err != nil {
				t.Logf("runc delete --force %s (userns): %v: %s", id.Name(), err, out)
			}
		}
		ids = append(ids, uids...)
	}
	// The shims name containerd's socket on their command line; nothing else does.
	killByCmdline(c.ctrSock)
	for _, id := range ids {
		sum := sha256.Sum256([]byte(filepath.Join(c.root, "containerd", "c.sock", "k8s.io", id.Name())))
		_ = os.Remove(filepath.Join("/run/containerd/s", hex.EncodeToString(sum[:])))
	}
	// A reboot leaves no cgroup: the pod cgroups below the kubelet's cgroupRoot
	// go (the root itself is the node's, as "/" on a real node).
	if c.podCgroups {
		if failed := removeCgroupTree(c.cgroupRoot, true); len(failed) > 0 {
			t.Fatalf("remove the pod cgroups below %s: %v", c.cgroupRoot, failed)
		}
	}
	state := filepath.Join(c.root, "containerd", "state")
	for _, dir := range []string{c.kubeletRoot, state, c.runcRoot} {
		if failed := unmountAllUnder(dir); len(failed) > 0 {
			t.Fatalf("unmount below %s: %v", dir, failed)
		}
	}
	for _, dir := range []string{state, c.runcRoot} {
		if err := os.RemoveAll(dir); err != nil {
			t.Fatalf("wipe %s: %v", dir, err)
		}
	}
	files, _ := filepath.Glob(filepath.Join(loopDir, "*.img"))
	for _, f := range files {
		for _, dev := range loopDevicesOf(f) {
			if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
				t.Fatalf("losetup -d %s (%s): %v: %s", dev, f, err, out)
			}
		}
		// losetup -d of a device nobody holds detaches at once.
		if devs := loopDevicesOf(f); len(devs) > 0 {
			t.Fatalf("loop devices %v still bound to %s after losetup -d", devs, f)
		}
	}
}

// powerOn starts containerd, the kubelet and the driver again, in that order.
func (c *cluster) powerOn(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.startRuntime(ctx); err != nil {
		t.Fatalf("start containerd: %v", err)
	}
	if err := c.runKubelet(ctx, false); err != nil {
		t.Fatalf("start kubelet: %v", err)
	}
	if err := c.drv.start(ctx); err != nil {
		t.Fatalf("start driver: %v", err)
	}
}

// waitRestarted waits until the pod's container runs again after a restart of
// the node (restart count at least 1, state running, pod Running).
func (c *cluster) waitRestarted(t *testing.T, p *corev1.Pod, d time.Duration) {
	t.Helper()
	c.waitPod(t, p, d, 250*time.Millisecond, "pod "+p.Name+" running again", func(cur *corev1.Pod) (bool, error) {
		if cur.UID != p.UID {
			return false, stop(fmt.Errorf("pod %s was replaced (uid %s, was %s)", p.Name, cur.UID, p.UID))
		}
		if cur.Status.Phase != corev1.PodRunning || len(cur.Status.ContainerStatuses) == 0 {
			return false, fmt.Errorf("phase %s", cur.Status.Phase)
		}
		cs := cur.Status.ContainerStatuses[0]
		if cs.RestartCount < 1 || cs.State.Running == nil {
			return false, fmt.Errorf("container restarts %d, state %+v", cs.RestartCount, cs.State)
		}
		return true, nil
	})
}
