//go:build linux

package security

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/store/boltstore"
)

// loseState stops the driver, does damage to its state file and starts it again.
var loseState = map[string]func(t *testing.T, path string){
	"deleted": func(t *testing.T, path string) {
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
	},
	"truncated to zero": func(t *testing.T, path string) {
		if err := os.Truncate(path, 0); err != nil {
			t.Fatal(err)
		}
	},
	"truncated to 16KiB": func(t *testing.T, path string) {
		if err := os.Truncate(path, 16<<10); err != nil {
			t.Fatal(err)
		}
	},
	"meta pages garbage": func(t *testing.T, path string) {
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		junk := make([]byte, 8192)
		for i := range junk {
			junk[i] = byte(i*7 + 3)
		}
		if _, err := f.WriteAt(junk, 0); err != nil {
			t.Fatal(err)
		}
	},
}

// TestLostStateKeepsLiveData: a lost, reset or damaged state file never
// deletes the data of a volume a pod is using, and the kubelet's republish
// never stacks a second mount on it. Every volume is adopted from the node,
// its data intact, and the pod's deletion still cleans up everything.
func TestLostStateKeepsLiveData(t *testing.T) {
	for damage, do := range loseState {
		t.Run(strings.ReplaceAll(damage, " ", "-"), func(t *testing.T) {
			n := newNode(t, nil)
			pods := map[string]*drivertest.Pod{}
			targets := map[string]string{}
			var all []*drivertest.Pod
			for _, b := range []string{"tmpfs", "dir", "loop"} {
				pods[b] = n.h.Kubelet.NewPod("default", "app-"+b)
				all = append(all, pods[b])
				targets[b] = n.publish(pods[b], "data", b)
				n.write(targets[b], "precious", "data of "+b)
			}
			// Enough records that the file is larger than 16KiB.
			for i := range 12 {
				p := n.h.Kubelet.NewPod("default", "filler")
				all = append(all, p)
				n.publish(p, "f"+string(rune('a'+i)), "tmpfs")
			}
			n.stop()
			do(t, n.statePath())
			n.start()
			for b, target := range targets {
				n.wantOneMount(target)
				n.wantData(target, "precious", "data of "+b)
				if !n.hasRecord(api.VolumeHandle(pods[b].UID, "data")) {
					t.Errorf("%s volume not adopted after the state file was %s", b, damage)
				}
			}
			// The kubelet restarts and republishes everything: still one mount
			// each, same data, and the rebuilt records completed from the
			// requests.
			if err := n.h.Kubelet.Restart(n.ctx()); err != nil {
				t.Fatalf("kubelet restart: %v", err)
			}
			for b, target := range targets {
				n.wantOneMount(target)
				n.wantData(target, "precious", "data of "+b)
			}
			recs, err := n.h.Driver().Records(n.ctx())
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range recs {
				if r.Rebuilt || r.Hash == "" || r.Pod.Name == "" || r.Backend == "" {
					t.Errorf("record %s not completed by the republish: rebuilt %v, hash %q, pod %q, backend %q", r.VolumeID, r.Rebuilt, r.Hash, r.Pod.Name, r.Backend)
				}
			}
			if damage != "deleted" && damage != "truncated to zero" {
				if m, _ := filepath.Glob(n.statePath() + ".damaged-*"); len(m) != 1 {
					t.Errorf("damaged state file not kept aside: %v", m)
				}
			}
			for _, p := range all {
				if err := n.h.Kubelet.DeletePod(n.ctx(), p); err != nil {
					t.Fatalf("deleting pod %s: %v", p.Name, err)
				}
			}
			n.wantClean()
		})
	}
}

// TestLostStateAfterRebootKeepsLoopData: a node reboots (mounts gone, loop
// devices detached, disk kept) and the state file is lost too: the loop
// volume's backing file and dir volume's directory are kept, and the
// kubelet's republish brings their data back.
func TestLostStateAfterRebootKeepsLoopData(t *testing.T) {
	n := newNode(t, nil)
	pods := map[string]*drivertest.Pod{}
	targets := map[string]string{}
	for _, b := range []string{"dir", "loop"} {
		pods[b] = n.h.Kubelet.NewPod("default", "app-"+b)
		targets[b] = n.publish(pods[b], "data", b)
		n.write(targets[b], "precious", "data of "+b)
	}
	n.stop()
	// The reboot: every mount below the kubelet root and every loop device go.
	if _, err := unmountBelow(n.root, false); err != nil {
		t.Fatal(err)
	}
	detachLoopsBelow(t, n.base)
	if err := os.Remove(n.statePath()); err != nil {
		t.Fatal(err)
	}
	n.start()
	if err := n.h.Kubelet.Restart(n.ctx()); err != nil {
		t.Fatalf("kubelet restart: %v", err)
	}
	for b, target := range targets {
		n.wantOneMount(target)
		n.wantData(target, "precious", "data of "+b)
	}
	for _, p := range pods {
		if err := n.h.Kubelet.DeletePod(n.ctx(), p); err != nil {
			t.Fatal(err)
		}
	}
	n.wantClean()
}

// TestPublishNeverMountsOverAMount: a first publish whose target is already a
// mount point that is not the volume's storage is refused (FailedPrecondition)
// and touches nothing; nothing is ever stacked.
func TestPublishNeverMountsOverAMount(t *testing.T) {
	n := newNode(t, nil)
	pod := n.h.Kubelet.NewPod("default", "app")
	vol := drivertest.InlineVolume{Name: "data", Attributes: attrs["tmpfs"]}
	target := n.h.Kubelet.TargetPath(pod, "data")
	if err := os.MkdirAll(target, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("foreign", target, "tmpfs", 0, "size=64k"); err != nil {
		t.Fatal(err)
	}
	n.write(target, "theirs", "foreign data")
	err := n.h.Kubelet.Publish(n.ctx(), pod, vol)
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("publish over a foreign mount: %v, want FailedPrecondition", err)
	}
	n.wantOneMount(target)
	n.wantData(target, "theirs", "foreign data")
	if n.hasRecord(api.VolumeHandle(pod.UID, "data")) {
		t.Error("a record was written for the refused publish")
	}
	if err := unix.Unmount(target, 0); err != nil {
		t.Fatal(err)
	}
}

// TestMountedStorageIsNeverDeleted: storage that the mount table shows mounted
// anywhere (here a dir volume's directory bind-mounted by someone else) is not
// deleted by an unpublish: Aborted, data intact; once unmounted, the retry
// succeeds.
func TestMountedStorageIsNeverDeleted(t *testing.T) {
	n := newNode(t, nil)
	pod := n.h.Kubelet.NewPod("default", "app")
	target := n.publish(pod, "data", "dir")
	n.write(target, "precious", "x")
	storage := filepath.Join(n.state, "volumes", api.VolumeHandle(pod.UID, "data"))
	elsewhere := filepath.Join(n.outside, "bind")
	if err := os.MkdirAll(elsewhere, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(storage, elsewhere, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	n.h.Kubelet.SetRetry(drivertest.Backoff{Attempts: 1}) // the first answer is what is checked
	err := n.h.Kubelet.DeletePod(n.ctx(), pod)
	if status.Code(err) != codes.Aborted || !strings.Contains(err.Error(), elsewhere) {
		t.Fatalf("unpublish of a volume whose storage is mounted elsewhere: %v, want Aborted naming %s", err, elsewhere)
	}
	n.wantData(elsewhere, "precious", "x")
	if err := unix.Unmount(elsewhere, 0); err != nil {
		t.Fatal(err)
	}
	if err := n.h.Kubelet.DeletePod(n.ctx(), pod); err != nil {
		t.Fatalf("unpublish after the other mount went: %v", err)
	}
	n.wantClean()
}

// TestDamagedStateRefusedOnRequest: with StateRecovery "refuse" a damaged
// state file fails the startup with an error naming the file, and nothing is
// changed; RebuildState then recovers it, keeping the damaged file.
func TestDamagedStateRefusedOnRequest(t *testing.T) {
	n := newNode(t, func(o *framework.Options) { o.State.Recovery = framework.StateRecoveryRefuse })
	pod := n.h.Kubelet.NewPod("default", "app")
	target := n.publish(pod, "data", "dir")
	n.write(target, "precious", "x")
	n.stop()
	if err := os.Truncate(n.statePath(), 0); err != nil {
		t.Fatal(err)
	}
	d, err := framework.New(n.h.Options)
	if err != nil {
		t.Fatal(err)
	}
	err = d.Run(n.ctx())
	if err == nil || !strings.Contains(err.Error(), n.statePath()) || !strings.Contains(err.Error(), "refuse") {
		t.Fatalf("Run on a damaged state with StateRecovery refuse: %v", err)
	}
	if fi, err := os.Stat(n.statePath()); err != nil || fi.Size() != 0 {
		t.Fatalf("the damaged file was changed: %v, %v", fi, err)
	}
	d, err = framework.New(n.h.Options)
	if err != nil {
		t.Fatal(err)
	}
	aside, err := d.RebuildState(n.ctx())
	if err != nil || aside == "" {
		t.Fatalf("RebuildState: %q, %v", aside, err)
	}
	if fi, err := os.Stat(aside); err != nil || fi.Size() != 0 {
		t.Errorf("the damaged file was not kept at %s: %v", aside, err)
	}
	if _, err := boltstore.Inspect(n.statePath(), boltstore.InspectOptions{}); err != nil {
		t.Errorf("the rebuilt state: %v", err)
	}
	n.start()
	n.wantOneMount(target)
	n.wantData(target, "precious", "x")
	if err := n.h.Kubelet.DeletePod(n.ctx(), pod); err != nil {
		t.Fatal(err)
	}
	n.wantClean()
}
