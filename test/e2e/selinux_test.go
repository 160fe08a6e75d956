//go:build e2e && linux

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestSELinuxMountInline: the scratch CSIDriver with spec.seLinuxMount: true, and a
// pod with an SELinux level (spec.securityContext.seLinuxOptions) using a tmpfs, a
// loop ext4, a dir and a readOnly tmpfs volume. Every NodePublishVolume the kubelet
// sends carries a mount volume_capability without mount_flags (so no
// "context=..."), as the driver's sanitized request log shows, and the container
// writes to the three writable volumes and gets EROFS on the readOnly one: the
// field changes nothing for inline volumes.
//
// What this shows, exactly: the kubelet's request for an inline volume of a driver
// that claims seLinuxMount. What it cannot show on this machine: that it is the
// volume being inline that keeps context= away. These nodes have no SELinux LSM
// (no /sys/fs/selinux), and the kubelet computes no label at all there
// (pkg/volume/util/selinux.go GetMountSELinuxLabel returns before looking at the
// volume when SELinux is disabled), so a PersistentVolume would not get
// context= here either. On an SELinux node the kubelet clears the label of every
// volume without a PersistentVolume (VolumeSupportsSELinuxMount returns false,
// pkg/kubelet/volumemanager/cache/desired_state_of_world.go), which
// docs/operations.md ("SELinux nodes") cites; test/selinux/verify.sh checks the
// same request there. Were context= ever sent, the driver would refuse the
// volume (InvalidArgument, mount_flags are not supported) and the pod would not
// start, which this test would see.
func TestSELinuxMountInline(t *testing.T) {
	c := clu
	d := requireDriver(t)
	ctx := context.Background()
	if c.runtime != runtimeContainerd {
		t.Skip("writes from a running container: EPHEMERA_E2E_RUNTIME=containerd")
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Fatalf("mkfs.ext4: %v (the loop backend needs e2fsprogs on the node)", err)
	}

	cur, err := c.cs.StorageV1().CSIDrivers().Get(ctx, driverName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.SELinuxMount = ptrTo(true)
	upd, err := c.cs.StorageV1().CSIDrivers().Update(ctx, cur, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("update CSIDriver seLinuxMount=true: %v", err)
	}
	t.Cleanup(func() {
		if err := c.applyCSIDriver(context.Background()); err != nil {
			t.Errorf("restore CSIDriver: %v", err)
		}
		time.Sleep(time.Second) // the kubelet's informer
	})
	if upd.Spec.SELinuxMount == nil || !*upd.Spec.SELinuxMount {
		t.Fatalf("the API server (Kubernetes %s) did not keep spec.seLinuxMount: true: %v", c.k8sVersion, upd.Spec.SELinuxMount)
	}
	time.Sleep(2 * time.Second) // the kubelet reads CSIDriver objects through an informer

	ro := tmpfsVolume("ro", "4Mi")
	ro.CSI.ReadOnly = ptrTo(true)
	vols := []struct {
		vol  corev1.Volume
		path string
	}{
		{tmpfsVolume("tmpfs", "8Mi"), dataPath},
		{csiVolume("loop", map[string]string{"backend": "loop", "size": fmt.Sprint(64 << 20), "fsType": "ext4"}), "/loop"},
		{csiVolume("dir", map[string]string{"backend": "dir"}), "/dir"},
		{ro, "/ro"},
	}
	p := c.newPod("default", "selinux-mount", vols[0].vol, steps(
		st("write", dataPath+"/f", "16"), st("write", "/loop/f", "16"), st("write", "/dir/f", "16"),
		st("write", "/ro/f", "16"), st("pause")))
	for _, v := range vols[1:] {
		p.Spec.Volumes = append(p.Spec.Volumes, v.vol)
		p.Spec.Containers[0].VolumeMounts = append(p.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: v.vol.Name, MountPath: v.path})
	}
	// A level as OpenShift's restricted SCC assigns per namespace: on an SELinux
	// node the kubelet would make a context= label of it for a volume that took one.
	p.Spec.SecurityContext = &corev1.PodSecurityContext{SELinuxOptions: &corev1.SELinuxOptions{Level: "s0:c123,c456"}}
	since := d.logSize()
	p = c.createPod(t, p)
	defer c.deletePod(t, p, goneTimeout)
	p = c.waitRunning(t, p, runningTimeout)

	out := c.output(t, p, 4)
	for i := range 3 {
		wantStep(t, out, i, "write ok", "size=16")
	}
	wantStep(t, out, 3, "write err EROFS")

	for _, v := range vols {
		h := volumeHandle(string(p.UID), v.vol.Name)
		pub := d.rpcLines(since, "NodePublishVolume", h)
		if len(pub) == 0 {
			t.Errorf("%s: no NodePublishVolume request for %s in %s", v.vol.Name, h, d.logPath)
		}
		for _, l := range pub {
			mnt, readonly, err := publishMount(l)
			if err != nil {
				t.Errorf("%s: %v: %s", v.vol.Name, err, l)
				continue
			}
			if flags, ok := mnt["mount_flags"]; ok {
				t.Errorf("%s: NodePublishVolume with mount_flags %v (seLinuxMount: true), want none: %s", v.vol.Name, flags, l)
			}
			if strings.Contains(l, "context=") {
				t.Errorf("%s: NodePublishVolume mentions context=: %s", v.vol.Name, l)
			}
			if want := v.vol.CSI.ReadOnly != nil && *v.vol.CSI.ReadOnly; readonly != want {
				t.Errorf("%s: NodePublishVolume readonly=%v, want %v", v.vol.Name, readonly, want)
			}
			t.Logf("%s: volume_capability.mount %v, readonly %v", v.vol.Name, mnt, readonly)
		}
	}
}

// publishMount decodes the request of a driver's "Request" log line for
// NodePublishVolume (protosanitizer's JSON of the proto's fields by their names,
// quoted by klog as request="...") and
// returns its volume_capability's mount access type and its readonly field.
func publishMount(line string) (mount map[string]any, readonly bool, err error) {
	_, q, ok := strings.Cut(line, " request=")
	if !ok {
		return nil, false, fmt.Errorf("no request= in the log line")
	}
	q, err = strconv.QuotedPrefix(q)
	if err != nil {
		return nil, false, fmt.Errorf("request=: %w", err)
	}
	s, err := strconv.Unquote(q)
	if err != nil {
		return nil, false, fmt.Errorf("request=: %w", err)
	}
	var req struct {
		VolumeCapability struct {
			Mount map[string]any `json:"mount"`
		} `json:"volume_capability"`
		Readonly bool `json:"readonly"`
	}
	if err := json.Unmarshal([]byte(s), &req); err != nil {
		return nil, false, fmt.Errorf("request JSON: %w", err)
	}
	if req.VolumeCapability.Mount == nil {
		return nil, false, fmt.Errorf("volume_capability has no mount access type")
	}
	return req.VolumeCapability.Mount, req.Readonly, nil
}
