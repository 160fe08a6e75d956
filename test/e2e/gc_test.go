//go:build e2e

package e2e

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ephemera-csi/ephemera/framework/kube"
)

// TestOrphanGCPodInformer runs the orphan GC's API confirmation (framework/kube)
// against the real API server: the informer sees only this node's pods (the
// fake clientset ignores field selectors; the API server does not), by UID, and
// notices deletions.
func TestOrphanGCPodInformer(t *testing.T) {
	c := clu
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pods, err := kube.NewPods(c.cs, nodeName, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := pods.Start(ctx, 30*time.Second); err != nil {
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
