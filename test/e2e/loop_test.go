//go:build e2e && linux

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"

	"github.com/ephemera-csi/ephemera/test/internal/sysloop"
)

// loopCase is one pod of TestLoopVolumes.
type loopCase struct {
	name     string
	fsType   string
	size     int64 // bytes, the "size" attribute
	readOnly bool
	fsGroup  bool // pod fsGroup 3456, container uid/gid 1000
	pod      *corev1.Pod
}

const (
	loopFSGroup = 3456
	loopUID     = 1000
)

// TestLoopVolumes: the loop backend through real pods. An ext4 and an xfs
// volume run in pods with an fsGroup and a non-root user: the volume's root and
// new files belong to the fsGroup, the user (not the owner) writes through the
// group, a write past "size" fails with ENOSPC inside the container, and the
// kubelet's volume stats calculator calls NodeGetVolumeStats for the volume,
// whose answer is the statfs of the mounted filesystem. A readOnly loop volume
// refuses writes with EROFS. After deletion no loop device is bound to the
// backing files, the files, mounts and records are gone.
func TestLoopVolumes(t *testing.T) {
	c := clu
	d := requireDriver(t)
	for _, tool := range []string{"mkfs.ext4", "mkfs.xfs"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s: %v (the loop backend needs e2fsprogs and xfsprogs on the node)", tool, err)
		}
	}
	cases := []*loopCase{
		{name: "loop-ext4", fsType: "ext4", size: 64 << 20, fsGroup: true},
		{name: "loop-xfs", fsType: "xfs", size: 300 << 20, fsGroup: true},
		{name: "loop-ro", fsType: "ext4", size: 16 << 20, readOnly: true},
	}
	// All pods at once: mkfs, pod start and the kubelet's stats period overlap.
	since := d.logSize()
	for _, lc := range cases {
		lc.pod = c.createPod(t, c.loopPod(lc))
	}
	defer func() {
		for _, lc := range cases {
			c.deletePod(t, lc.pod, 0)
		}
	}()
	for _, lc := range cases {
		lc.pod = c.waitRunning(t, lc.pod, runningTimeout)
	}
	var handles, files []string
	for _, lc := range cases {
		t.Run(lc.name, func(t *testing.T) {
			p, vol := lc.pod, lc.pod.Spec.Volumes[0]
			h := volumeHandle(string(p.UID), vol.Name)
			handles = append(handles, h)
			file := filepath.Join(d.stateDir, "loop", h+".img")
			files = append(files, file)
			m := c.published(t, p, vol)
			if m.FSType != lc.fsType || !strings.HasPrefix(m.Source, "/dev/loop") {
				t.Errorf("mount at the target: %s on %s, want %s on a loop device", m.FSType, m.Source, lc.fsType)
			}
			if m.readOnly() != lc.readOnly {
				t.Errorf("mount options %q: read-only %v, want %v", m.Options, m.readOnly(), lc.readOnly)
			}
			if devs := loopDevicesOf(file); len(devs) != 1 || devs[0] != m.Source {
				t.Errorf("loop devices bound to %s: %v, want exactly the mounted %s", file, devs, m.Source)
			}
			if st, err := os.Stat(file); err != nil || st.Size() != lc.size {
				t.Errorf("backing file %s: %v, want size %d", file, err, lc.size)
			}
			if lc.readOnly {
				out := c.output(t, p, 2)
				wantStep(t, out, 0, "write err EROFS")
				wantStep(t, out, 1, "ls ok")
				return
			}
			out := c.output(t, p, 6)
			g := fmt.Sprintf("gid=%d", loopFSGroup)
			// The root: owned by root, group fsGroup, group-writable and setgid.
			wantStep(t, out, 0, "stat ok mode=2775 uid=0 "+g)
			// uid 1000 writes through the group; the file inherits the group.
			wantStep(t, out, 1, "write ok", "size=1048576")
			uid := loopUID
			if c.runtime == runtimeFake {
				uid = 0 // no container: the harness runs the steps on the node, as root
			}
			wantStep(t, out, 2, fmt.Sprintf("stat ok mode=0644 uid=%d %s", uid, g))
			wantStep(t, out, 3, "write err ENOSPC")
			wantStep(t, out, 4, "rm ok")
			wantStep(t, out, 5, "read ok", "size=1048576")
			c.wantVolumeStats(t, d, since, p, vol)
		})
	}
	if t.Failed() {
		return
	}
	for _, lc := range cases {
		c.deletePod(t, lc.pod, 0)
	}
	for _, lc := range cases {
		c.waitPodGone(t, lc.pod, goneTimeout)
		c.cleanedUp(t, lc.pod, lc.pod.Spec.Volumes[0])
	}
	for _, f := range files {
		if devs := loopDevicesOf(f); len(devs) > 0 {
			t.Errorf("loop devices still bound to %s after the pod was deleted: %v", f, devs)
		}
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Errorf("backing file %s left after the pod was deleted (%v)", f, err)
		}
	}
	d.assertNoRecords(t, handles...)
}

// loopPod is the pod of a TestLoopVolumes case.
func (c *cluster) loopPod(lc *loopCase) *corev1.Pod {
	vol := csiVolume("disk", map[string]string{"backend": "loop", "size": fmt.Sprint(lc.size), "fsType": lc.fsType})
	args := steps(st("write", "/data/x", "10"), st("ls", "/data"), st("pause"))
	if lc.readOnly {
		vol.CSI.ReadOnly = ptrTo(true)
	} else {
		args = steps(
			st("stat", "/data"),
			st("write", "/data/f", "1048576"),
			st("stat", "/data/f"),
			st("write", "/data/big", fmt.Sprint(lc.size)), // metadata takes some: ENOSPC
			st("rm", "/data/big"),
			st("read", "/data/f"),
			st("pause"))
	}
	p := c.newPod("default", lc.name, vol, args)
	if lc.fsGroup {
		p.Spec.SecurityContext = &corev1.PodSecurityContext{
			FSGroup:    ptrTo(int64(loopFSGroup)),
			RunAsUser:  ptrTo(int64(loopUID)),
			RunAsGroup: ptrTo(int64(loopUID)),
		}
	}
	return p
}

// loopDevicesOf lists the loop devices (/dev/loopN) bound to file, as
// losetup -j does; a device whose file was deleted counts too.
func loopDevicesOf(file string) []string {
	var out []string
	for _, d := range sysloop.Where(func(f string) bool { return f == file }) {
		out = append(out, d.Path)
	}
	return out
}

// wantVolumeStats: the kubelet's volume stats calculator (every
// volumeStatsAggPeriod, 5 s here) calls NodeGetVolumeStats for the pod's volume
// with its target path, and succeeds; the driver's answer to that request is
// the statfs of the filesystem mounted at the target.
//
// The kubelet's /stats/summary, where these figures surface, answers 500 on the
// machines this suite runs on ("failed to get rootFs info: cannot find
// filesystem info for device"): cAdvisor finds no filesystem stats for the root
// container under their hybrid cgroup v1 layout, and the whole summary fails
// with it. So the answer is read from the driver's socket with the kubelet's
// request instead.
func (c *cluster) wantVolumeStats(t *testing.T, d *driver, since int64, p *corev1.Pod, vol corev1.Volume) {
	t.Helper()
	h := volumeHandle(string(p.UID), vol.Name)
	target := c.hostVolumePath(p, vol)
	t0 := time.Now()
	var lines []string
	err := waitFor(context.Background(), 30*time.Second, 250*time.Millisecond, "the kubelet's NodeGetVolumeStats for "+p.Name, func() (bool, error) {
		lines = d.rpcLines(since, "NodeGetVolumeStats", h)
		return len(lines) > 0, nil
	})
	if err != nil {
		t.Error(err)
		return
	}
	t.Logf("the kubelet called NodeGetVolumeStats %v after the pod ran", time.Since(t0).Round(100*time.Millisecond))
	if !strings.Contains(lines[0], target) {
		t.Errorf("the kubelet's NodeGetVolumeStats lacks the target path %s:\n%s", target, lines[0])
	}
	if f := d.failedLines(since, h); len(f) > 0 {
		t.Errorf("driver failed requests for %s:\n%s", h, strings.Join(f, "\n"))
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+strings.TrimPrefix(d.endpoint, "unix://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := csi.NewNodeClient(conn).NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: h, VolumePath: target})
	if err != nil {
		t.Fatalf("NodeGetVolumeStats: %v", err)
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(target, &st); err != nil {
		t.Fatalf("statfs %s: %v", target, err)
	}
	bs := int64(st.Bsize)
	want := map[csi.VolumeUsage_Unit][3]int64{
		csi.VolumeUsage_BYTES:  {int64(st.Blocks) * bs, int64(st.Bavail) * bs, int64(st.Blocks-st.Bfree) * bs},
		csi.VolumeUsage_INODES: {int64(st.Files), int64(st.Ffree), int64(st.Files - st.Ffree)},
	}
	if len(resp.Usage) != 2 {
		t.Errorf("NodeGetVolumeStats usage: %v, want bytes and inodes", resp.Usage)
	}
	for _, u := range resp.Usage {
		w := want[u.Unit]
		if got := [3]int64{u.Total, u.Available, u.Used}; got != w {
			t.Errorf("NodeGetVolumeStats %s: total, available, used %v, want the statfs of the target %v", u.Unit, got, w)
		}
	}
	size := c.volumeSize(vol)
	if b := want[csi.VolumeUsage_BYTES]; b[0] > size || b[0] < size/2 || b[2] < 1<<20 {
		t.Errorf("volume %s of size %d: bytes total, available, used %v, want a capacity of at most the size and a use of at least the 1MiB file", vol.Name, size, b)
	}
	t.Logf("NodeGetVolumeStats: %v", resp.Usage)
}

func (c *cluster) volumeSize(vol corev1.Volume) int64 {
	var n int64
	fmt.Sscan(vol.CSI.VolumeAttributes["size"], &n)
	return n
}
