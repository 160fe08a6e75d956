//go:build e2e && linux

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/ephemera-csi/ephemera/framework/kube"
)

// TestOrphanGCPodInformer runs the orphan GC's API confirmation (framework/kube,
// over its own core/v1 client, kube.Client) against the real API server: the
// informer sees only this node's pods (the fake clientset ignores field
// selectors; the API server does not), by UID, and notices deletions.
func TestOrphanGCPodInformer(t *testing.T) {
	c := clu
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client, err := kube.NewClient(c.restCfg)
	if err != nil {
		t.Fatal(err)
	}
	pods, err := kube.NewPods(kube.PodsOptions{Client: client.Pods(), NodeName: nodeName})
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- pods.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("Pods.Run: %v", err)
		}
	}()
	if err := waitFor(ctx, 30*time.Second, 50*time.Millisecond, "informer syncs", func() (bool, error) {
		return pods.HasSynced(), nil
	}); err != nil {
		t.Fatal(err)
	}
	here := c.createPod(t, c.newPod("default", "gc-here", memoryEmptyDir("data"), steps(st("pause"))))
	elsewhere := c.newPod("default", "gc-elsewhere", memoryEmptyDir("data"), steps(st("pause")))
	elsewhere.Spec.NodeName = "another-node"
	elsewhere, err = c.cs.CoreV1().Pods("default").Create(ctx, elsewhere, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.cs.CoreV1().Pods("default").Delete(context.Background(), elsewhere.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})

	exists := func(uid string) bool {
		ok, err := pods.PodExists(ctx, uid)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if err := waitFor(ctx, 20*time.Second, 50*time.Millisecond, "informer sees the pod", func() (bool, error) {
		return exists(string(here.UID)), nil
	}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // give the other pod's event time to arrive, if it were watched
	if exists(string(elsewhere.UID)) {
		t.Error("a pod bound to another node is in this node's informer")
	}
	c.deletePod(t, here, 60*time.Second)
	if err := waitFor(ctx, 20*time.Second, 50*time.Millisecond, "informer sees the deletion", func() (bool, error) {
		return !exists(string(here.UID)), nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestOrphanGCRemovesVolumeOfVanishedPod: the node loses a pod behind the
// kubelet's back (the kubelet is down, the pod is force-deleted from the API and
// its directory disappears), so no NodeUnpublishVolume will ever come. The
// driver's orphan GC, confirming with the API server that the pod is gone,
// removes the volume's storage and record after its grace period and posts an
// OrphanRemoved event; the restarted kubelet finds nothing to clean.
func TestOrphanGCRemovesVolumeOfVanishedPod(t *testing.T) {
	c := clu
	d := requireDriver(t)
	ctx := context.Background()
	vol := csiVolume("orphan", map[string]string{"backend": "dir"})
	p := c.createPod(t, c.newPod("default", "gc-orphan", vol, steps(st("write", "/data/f", "4096"), st("pause"))))
	p = c.waitRunning(t, p, runningTimeout)
	h := volumeHandle(string(p.UID), vol.Name)
	backing := filepath.Join(d.stateDir, "volumes", h)
	if _, err := os.Stat(backing); err != nil {
		t.Fatalf("dir volume's backing directory: %v", err)
	}

	c.kubelet.stop(15 * time.Second)
	kubeletUp := false
	defer func() {
		if !kubeletUp {
			if err := c.runKubelet(ctx, false); err != nil {
				t.Errorf("restarting the kubelet: %v", err)
			}
		}
	}()
	zero := int64(0)
	if err := c.cs.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	podDir := filepath.Join(c.kubeletRoot, "pods", string(p.UID))
	since := d.logSize()
	if failed := unmountAllUnder(podDir); len(failed) > 0 {
		t.Fatalf("unmounting the pod directory: %v", failed)
	}
	if err := os.RemoveAll(podDir); err != nil {
		t.Fatal(err)
	}

	t0 := time.Now()
	if err := waitFor(ctx, 30*time.Second, 200*time.Millisecond, "the orphan GC removes "+h, func() (bool, error) {
		l := d.logSince(since)
		return strings.Contains(l, "Removed orphaned volume") && strings.Contains(l, h), nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("orphan removed %v after its pod directory vanished (grace 2s, GC every 1s)", time.Since(t0).Round(100*time.Millisecond))
	if _, err := os.Stat(backing); !os.IsNotExist(err) {
		t.Errorf("backing directory left: %v", err)
	}
	// The driver tells the pod's owner what it did: an OrphanRemoved event on the
	// (deleted) pod, posted through the real API server (--events).
	if err := waitFor(ctx, 30*time.Second, 250*time.Millisecond, "the driver's OrphanRemoved event", func() (bool, error) {
		evs, err := c.cs.CoreV1().Events(p.Namespace).List(ctx, metav1.ListOptions{
			FieldSelector: fields.Set{"involvedObject.uid": string(p.UID), "reason": "OrphanRemoved"}.String(),
		})
		if err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if e.Source.Component == driverName && e.Type == "Normal" && strings.Contains(e.Message, vol.Name) {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Error(err)
	}
	if err := c.runKubelet(ctx, false); err != nil {
		t.Fatalf("restarting the kubelet: %v", err)
	}
	kubeletUp = true
	d.assertNoRecords(t, h)
}
