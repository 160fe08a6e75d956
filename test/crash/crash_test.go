//go:build linux

package crash

import (
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/ephemera-csi/ephemera/drivers/loop"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
)

// mountedFailpoints are the publish failpoints after the mount. The backends
// here write no intent record (framework needsIntent: each is a Finder and a
// Lister or mount-only), so a volume killed there is adopted by the restarted
// driver from the mount table and stays mounted; the kubelet's retry finishes
// its publish. Before them, nothing the node shows survives the restart.
var mountedFailpoints = []string{"publish-after-mount", "publish-after-content", "publish-after-done"}

// TestPublishCrash kills the driver at every side-effect boundary of a first
// NodePublishVolume, restarts it on the same state, and then either lets the
// kubelet retry the publish (the pod still exists) or deletes the pod (the
// kubelet unpublishes the uncertain volume). Either way the volume ends up
// mounted exactly once, then nothing is left.
func TestPublishCrash(t *testing.T) {
	if skipReason != "" {
		t.Skip(skipReason)
	}
	for _, b := range backends {
		fps := publishFailpoints
		if b.name == "loop" {
			// The loop backend's own boundaries inside Create come first.
			fps = append(slices.Clone(loop.Failpoints), fps...)
		}
		for _, fp := range fps {
			for _, podDeleted := range []bool{false, true} {
				name := fmt.Sprintf("%s/%s/retry", b.name, fp)
				if podDeleted {
					name = fmt.Sprintf("%s/%s/pod-deleted", b.name, fp)
				}
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					testPublishCrash(t, b, fp, podDeleted)
				})
			}
		}
	}
}

func testPublishCrash(t *testing.T, b backend, fp string, podDeleted bool) {
	r := newRig(t)
	pod := r.kubelet.NewPod("default", "crash")
	vol := drivertest.InlineVolume{Name: "scratch", Attributes: b.attrs}
	target := r.kubelet.TargetPath(pod, vol.Name)

	r.start(fp)
	r.wantCrashError("NodePublishVolume", r.kubelet.Publish(r.ctx(), pod, vol))
	r.waitKilled()
	if s := r.kubelet.State(pod, vol.Name); s != drivertest.StateUncertain {
		t.Fatalf("kubelet state after the crash: %v, want uncertain", s)
	}

	r.start("")
	// The startup reconcile ran before the driver served: a volume mounted at
	// its target is adopted (never mounted twice), anything else is not
	// mounted.
	if slices.Contains(mountedFailpoints, fp) {
		r.wantMounts(target, 1)
	} else {
		r.wantMounts(target, 0)
	}

	if !podDeleted {
		if err := r.kubelet.Publish(r.ctx(), pod, vol); err != nil {
			t.Fatalf("retried publish: %v", err)
		}
		target := r.wantPublished(pod, vol, b)
		r.writeData(target, "hello "+fp)
		// A second retry (a kubelet that missed the OK) must not stack a mount.
		if err := r.kubelet.Publish(r.ctx(), pod, vol); err != nil {
			t.Fatalf("second publish: %v", err)
		}
		r.wantPublished(pod, vol, b)
		r.wantData(target, "hello "+fp)
	}
	if err := r.kubelet.DeletePod(r.ctx(), pod); err != nil {
		t.Fatalf("deleting the pod: %v", err)
	}
	if s := r.kubelet.State(pod, vol.Name); s != drivertest.StateNone {
		t.Fatalf("kubelet state after deleting the pod: %v, want none", s)
	}
	r.stop()
	r.wantClean(pod)
}

// TestUnpublishCrash kills the driver at every side-effect boundary of
// NodeUnpublishVolume while the pod is deleted, restarts it, and lets the
// kubelet retry the deletion.
func TestUnpublishCrash(t *testing.T) {
	if skipReason != "" {
		t.Skip(skipReason)
	}
	for _, b := range backends {
		for _, fp := range unpublishFailpoints {
			t.Run(b.name+"/"+fp, func(t *testing.T) {
				t.Parallel()
				testUnpublishCrash(t, b, fp)
			})
		}
	}
}

func testUnpublishCrash(t *testing.T, b backend, fp string) {
	r := newRig(t)
	pod := r.kubelet.NewPod("default", "crash")
	vol := drivertest.InlineVolume{Name: "scratch", Attributes: b.attrs}

	r.start("")
	if err := r.kubelet.Publish(r.ctx(), pod, vol); err != nil {
		t.Fatalf("publish: %v", err)
	}
	target := r.wantPublished(pod, vol, b)
	r.writeData(target, "bye")
	r.stop()

	r.start(fp)
	r.wantCrashError("NodeUnpublishVolume", r.kubelet.DeletePod(r.ctx(), pod))
	r.waitKilled()

	r.start("")
	// Every failpoint of an unpublish is after the unmount, and the record
	// stays until the end: the restarted driver serves a volume that is not
	// mounted any more.
	r.wantMounts(target, 0)
	// The kubelet retries; NodeUnpublish finishes what the killed one started
	// (every step is OK when already done).
	if err := r.kubelet.DeletePod(r.ctx(), pod); err != nil {
		t.Fatalf("retried pod deletion: %v", err)
	}
	if s := r.kubelet.State(pod, vol.Name); s != drivertest.StateNone {
		t.Fatalf("kubelet state after deleting the pod: %v, want none", s)
	}
	r.stop()
	r.wantClean(pod)
}

// TestDriverRestartKeepsLiveVolumes kills the driver with SIGKILL while it
// serves three published volumes, restarts it and has the kubelet republish
// them all (kubelet restart semantics): each stays mounted exactly once with
// its data.
func TestDriverRestartKeepsLiveVolumes(t *testing.T) {
	r := newRig(t)
	t.Parallel()
	type pv struct {
		pod  *drivertest.Pod
		vol  drivertest.InlineVolume
		b    backend
		data string
	}
	var vols []pv
	r.start("")
	for i, b := range []backend{backends[0], backends[1], backends[0]} {
		v := pv{
			pod:  r.kubelet.NewPod("default", fmt.Sprintf("live-%d", i)),
			vol:  drivertest.InlineVolume{Name: fmt.Sprintf("vol-%d", i), Attributes: b.attrs},
			b:    b,
			data: fmt.Sprintf("data of volume %d", i),
		}
		if err := r.kubelet.Publish(r.ctx(), v.pod, v.vol); err != nil {
			t.Fatalf("publish %s: %v", v.vol.Name, err)
		}
		r.writeData(r.wantPublished(v.pod, v.vol, v.b), v.data)
		vols = append(vols, v)
	}

	r.kill()
	for _, v := range vols {
		// Killing the driver does not touch the pods' mounts.
		r.wantData(r.wantPublished(v.pod, v.vol, v.b), v.data)
	}
	r.start("")
	for _, v := range vols {
		r.wantData(r.wantPublished(v.pod, v.vol, v.b), v.data)
	}
	if err := r.kubelet.Restart(r.ctx()); err != nil {
		t.Fatalf("kubelet restart (republish): %v", err)
	}
	for _, v := range vols {
		r.wantData(r.wantPublished(v.pod, v.vol, v.b), v.data)
	}
	var pods []*drivertest.Pod
	for _, v := range vols {
		if err := r.kubelet.DeletePod(r.ctx(), v.pod); err != nil {
			t.Fatalf("deleting pod %s: %v", v.pod.Name, err)
		}
		pods = append(pods, v.pod)
	}
	r.stop()
	r.wantClean(pods...)
}

// TestNodeReboot publishes a tmpfs and a dir volume, stops the driver and
// unmounts both targets (what a reboot does to the mount table while the
// kubelet's and the driver's directories survive), then restarts the driver
// and the kubelet: both volumes are mounted again exactly once, the tmpfs fresh
// and empty, the dir with its data.
func TestNodeReboot(t *testing.T) {
	r := newRig(t)
	t.Parallel()
	pod := r.kubelet.NewPod("default", "reboot")
	mem := drivertest.InlineVolume{Name: "mem", Attributes: backends[0].attrs}
	disk := drivertest.InlineVolume{Name: "disk", Attributes: backends[1].attrs}

	r.start("")
	for _, v := range []drivertest.InlineVolume{mem, disk} {
		if err := r.kubelet.Publish(r.ctx(), pod, v); err != nil {
			t.Fatalf("publish %s: %v", v.Name, err)
		}
	}
	r.writeData(r.wantPublished(pod, mem, backends[0]), "memory")
	r.writeData(r.wantPublished(pod, disk, backends[1]), "disk")
	r.stop()

	for _, v := range []drivertest.InlineVolume{mem, disk} {
		target := r.kubelet.TargetPath(pod, v.Name)
		if err := syscall.Unmount(target, 0); err != nil {
			t.Fatalf("unmounting %s: %v", target, err)
		}
		r.wantMounts(target, 0)
	}

	r.start("")
	if err := r.kubelet.Restart(r.ctx()); err != nil {
		t.Fatalf("kubelet restart (republish): %v", err)
	}
	r.wantData(r.wantPublished(pod, mem, backends[0]), "")
	r.wantData(r.wantPublished(pod, disk, backends[1]), "disk")
	// And once more: a republish of repaired volumes changes nothing.
	if err := r.kubelet.Restart(r.ctx()); err != nil {
		t.Fatalf("second kubelet restart: %v", err)
	}
	r.wantData(r.wantPublished(pod, mem, backends[0]), "")
	r.wantData(r.wantPublished(pod, disk, backends[1]), "disk")

	if err := r.kubelet.DeletePod(r.ctx(), pod); err != nil {
		t.Fatalf("deleting the pod: %v", err)
	}
	r.stop()
	r.wantClean(pod)
}

// repairFailpoints are the publish failpoints a republish that repairs an
// unmounted volume passes (it re-creates the storage and mounts it again, but
// writes no intent and no new phase).
var repairFailpoints = []string{"publish-after-mkdir", "publish-after-mount", "publish-after-content"}

// TestNodeRebootRepairCrash is TestNodeReboot with the driver killed in the
// middle of repairing the unmounted volume: the record stays Published, and
// the kubelet's next republish finishes the repair without stacking a mount.
func TestNodeRebootRepairCrash(t *testing.T) {
	if skipReason != "" {
		t.Skip(skipReason)
	}
	for _, fp := range repairFailpoints {
		if !slices.Contains(publishFailpoints, fp) {
			t.Fatalf("failpoint %q is not in failpoint.Publish any more; update repairFailpoints", fp)
		}
	}
	for _, b := range backends {
		for _, fp := range repairFailpoints {
			t.Run(b.name+"/"+fp, func(t *testing.T) {
				t.Parallel()
				r := newRig(t)
				pod := r.kubelet.NewPod("default", "reboot")
				vol := drivertest.InlineVolume{Name: "scratch", Attributes: b.attrs}
				r.start("")
				if err := r.kubelet.Publish(r.ctx(), pod, vol); err != nil {
					t.Fatalf("publish: %v", err)
				}
				target := r.wantPublished(pod, vol, b)
				r.writeData(target, "before reboot")
				r.stop()
				if err := syscall.Unmount(target, 0); err != nil {
					t.Fatal(err)
				}

				r.start(fp)
				r.wantCrashError("republish", r.kubelet.Restart(r.ctx()))
				r.waitKilled()
				r.start("")
				if err := r.kubelet.Restart(r.ctx()); err != nil {
					t.Fatalf("kubelet restart after the crash: %v", err)
				}
				want := "before reboot"
				if b.name == "tmpfs" {
					want = "" // memory does not survive a reboot
				}
				r.wantData(r.wantPublished(pod, vol, b), want)
				if err := r.kubelet.DeletePod(r.ctx(), pod); err != nil {
					t.Fatalf("deleting the pod: %v", err)
				}
				r.stop()
				r.wantClean(pod)
			})
		}
	}
}

// TestPublishCrashFinishesTheVolume kills a first publish of a read-only
// volume with an fsGroup after its mount, before the fsGroup, the content or
// the read-only flag were applied. The restarted driver adopts the mount; the
// kubelet's retry must not take it for a finished volume: it ends read-only
// and owned by the fsGroup, as an uninterrupted publish would.
func TestPublishCrashFinishesTheVolume(t *testing.T) {
	if skipReason != "" {
		t.Skip(skipReason)
	}
	for _, b := range backends {
		for _, fp := range []string{"publish-after-mount", "publish-after-content"} {
			t.Run(b.name+"/"+fp, func(t *testing.T) {
				t.Parallel()
				r := newRig(t)
				pod := r.kubelet.NewPod("default", "crash")
				gid := int64(2345)
				pod.FSGroup = &gid
				vol := drivertest.InlineVolume{Name: "scratch", ReadOnly: true, Attributes: b.attrs}
				target := r.kubelet.TargetPath(pod, vol.Name)

				r.start(fp)
				r.wantCrashError("NodePublishVolume", r.kubelet.Publish(r.ctx(), pod, vol))
				r.waitKilled()
				r.start("")
				r.wantMounts(target, 1)
				if err := r.kubelet.Publish(r.ctx(), pod, vol); err != nil {
					t.Fatalf("retried publish: %v", err)
				}
				r.wantPublished(pod, vol, b)
				mi := mountsAt(t, target)[0]
				if !slices.Contains(strings.Split(mi.Options, ","), "ro") {
					t.Errorf("volume at %s is mounted %s, want read-only", target, mi.Options)
				}
				var st syscall.Stat_t
				if err := syscall.Stat(target, &st); err != nil {
					t.Fatal(err)
				}
				if st.Gid != uint32(gid) || st.Mode&syscall.S_ISGID == 0 || st.Mode&0o070 != 0o070 {
					t.Errorf("volume root: gid %d mode %o, want gid %d with group rwx and setgid", st.Gid, st.Mode&0o7777, gid)
				}
				if err := r.kubelet.DeletePod(r.ctx(), pod); err != nil {
					t.Fatalf("deleting the pod: %v", err)
				}
				r.stop()
				r.wantClean(pod)
			})
		}
	}
}
