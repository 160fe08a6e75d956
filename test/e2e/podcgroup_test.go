//go:build e2e && linux

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// containerPID returns the ID of the pod's first container and the PID of its
// process as the node's containerd reports it (ctr tasks ls), not found
// through the cgroups that the callers then check.
func (n *node) containerPID(t *testing.T, p *corev1.Pod) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cur, err := n.c.cs.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get pod: %v", err)
	}
	if len(cur.Status.ContainerStatuses) == 0 || cur.Status.ContainerStatuses[0].ContainerID == "" {
		t.Fatalf("pod %s has no container ID yet", p.Name)
	}
	_, id, _ := strings.Cut(cur.Status.ContainerStatuses[0].ContainerID, "://")
	out, err := n.ctr(ctx, "tasks", "ls")
	if err != nil {
		t.Fatalf("ctr tasks ls on %s: %v\n%s", n.name, err, out)
	}
	// TASK PID STATUS
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) == 3 && f[0] == id {
			pid, err := strconv.Atoi(f[1])
			if err != nil || pid <= 0 {
				t.Fatalf("ctr tasks ls: task %s has PID %q", id, f[1])
			}
			return id, pid
		}
	}
	t.Fatalf("ctr tasks ls on %s does not list container %s of pod %s:\n%s", n.name, id, p.Name, out)
	return "", 0
}

// wantContainerCgroup checks the memory cgroup of the pod's container process
// on node n: with pod cgroups on, <cgroupRoot>/kubepods/<QoS>/pod<UID>/<container
// ID> (no QoS level for a Guaranteed pod); off, the runtime's own place for it
// (containerd: /k8s.io/<container ID>), outside any kubepods.
func (n *node) wantContainerCgroup(t *testing.T, p *corev1.Pod) {
	t.Helper()
	id, pid := n.containerPID(t, p)
	got, err := procCgroup(pid, "memory")
	if err != nil {
		t.Fatal(err)
	}
	if !n.podCgroups {
		if strings.Contains(got, "/kubepods") || !strings.HasSuffix(got, "/"+id) {
			t.Errorf("pod %s on %s (pod cgroups off): container %s is in memory cgroup %s, want the runtime's <parent>/%s outside any kubepods", p.Name, n.name, id, got, id)
		}
		return
	}
	qos := ""
	if p.Status.QOSClass != corev1.PodQOSGuaranteed {
		qos = "/" + strings.ToLower(string(p.Status.QOSClass))
	}
	if want := n.cgroupRoot + "/kubepods" + qos + "/pod" + string(p.UID) + "/" + id; got != want {
		t.Errorf("pod %s on %s (pod cgroups on): container %s is in memory cgroup %s, want %s", p.Name, n.name, id, got, want)
	}
}

// readMemoryCgroupFile reads a file of a cgroup v1 memory cgroup (cgroupfs path).
func readMemoryCgroupFile(t *testing.T, cgroup, file string) string {
	t.Helper()
	mnt := cgroupV1Mount("memory")
	if mnt == "" {
		t.Fatal("no cgroup v1 memory hierarchy mounted")
	}
	b, err := os.ReadFile(filepath.Join(mnt, cgroup, file))
	if err != nil {
		t.Fatalf("memory cgroup %s: %v", cgroup, err)
	}
	return strings.TrimSpace(string(b))
}

// memoryStat returns one counter of a memory cgroup's memory.stat.
func memoryStat(t *testing.T, cgroup, key string) int64 {
	t.Helper()
	for _, l := range strings.Split(readMemoryCgroupFile(t, cgroup, "memory.stat"), "\n") {
		if k, v, ok := strings.Cut(l, " "); ok && k == key {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("memory.stat of %s: %s %q", cgroup, k, v)
			}
			return n
		}
	}
	t.Fatalf("memory.stat of %s has no %s", cgroup, key)
	return 0
}

// TestPodCgroups: the first node's kubelet runs with pod cgroups on
// (cgroupsPerQOS: true, cgroupRoot of its own, cgroupfs in the kubelet and in
// containerd's runc), as every production node does. A pod with an inline tmpfs
// volume and a memory limit of 64Mi (and a CPU request only: Burstable):
//   - its container's process (PID from containerd) is in the memory cgroup
//     <cgroupRoot>/kubepods/burstable/pod<UID>/<container ID> (/proc/PID/cgroup);
//   - the pod's cgroup and the container's have memory.limit_in_bytes 64Mi;
//   - the 8 MiB the container wrote into its tmpfs volume are charged to the
//     pod's cgroup (total_shmem of its memory.stat), not to the driver that
//     mounted the volume;
//   - once the pod is gone, so is its cgroup.
//
// Containerd only (the fake CRI runs no process).
func TestPodCgroups(t *testing.T) {
	c := clu
	if c.runtime != runtimeContainerd {
		t.Skip("the fake CRI runs no container process")
	}
	if cgroupV1Mount("memory") == "" {
		t.Skip("no cgroup v1 memory hierarchy (this scenario reads cgroup v1 files)")
	}
	requireDriver(t)
	const limit, written = 64 << 20, 8 << 20
	vol := tmpfsVolume("scratch", "16Mi")
	pod := c.newPod("default", "pod-cgroups", vol, steps(st("write", "/data/f", fmt.Sprint(written)), st("pause")))
	pod.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: *resource.NewQuantity(limit, resource.BinarySI)}
	p := c.createPod(t, pod)
	defer c.deletePod(t, p, goneTimeout)
	p = c.waitRunning(t, p, runningTimeout)
	wantStep(t, c.output(t, p, 1), 0, "write ok", fmt.Sprintf("size=%d", written))
	if p.Status.QOSClass != corev1.PodQOSBurstable {
		t.Fatalf("pod QoS class %s, want Burstable", p.Status.QOSClass)
	}

	id, pid := c.containerPID(t, p)
	got, err := procCgroup(pid, "memory")
	if err != nil {
		t.Fatal(err)
	}
	podCgroup := c.cgroupRoot + "/kubepods/burstable/pod" + string(p.UID)
	if want := podCgroup + "/" + id; got != want {
		t.Fatalf("container %s (PID %d) is in memory cgroup %s, want %s", id, pid, got, want)
	}
	t.Logf("container PID %d in memory cgroup %s", pid, got)
	for _, cg := range []string{podCgroup, got} {
		if l := readMemoryCgroupFile(t, cg, "memory.limit_in_bytes"); l != strconv.Itoa(limit) {
			t.Errorf("memory.limit_in_bytes of %s = %s, want %d (the pod's limit)", cg, l, limit)
		}
	}
	shmem := memoryStat(t, podCgroup, "total_shmem")
	if shmem < written {
		t.Errorf("the pod's cgroup is charged %d bytes of shmem, want at least the %d the container wrote into its tmpfs volume", shmem, written)
	}
	t.Logf("pod cgroup %s: memory.limit_in_bytes %d, total_shmem %d, usage %s", podCgroup, limit, shmem,
		readMemoryCgroupFile(t, podCgroup, "memory.usage_in_bytes"))

	c.deletePod(t, p, goneTimeout)
	if _, err := os.Stat(filepath.Join(cgroupV1Mount("memory"), podCgroup)); err == nil {
		t.Errorf("pod cgroup %s still exists after the pod is gone", podCgroup)
	}
}
