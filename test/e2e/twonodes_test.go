//go:build e2e && linux

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
)

// twoNodesNS is TestTwoNodes' namespace: its cleanup deletes every pod in it.
const twoNodesNS = "twonodes"

// addNode brings up one more node below <root>/nodes/<short>: its own runtime
// (a private containerd, or the fake CRI), kubelet root, ports, pod logs and
// volume plugin dir, processes named <proc>-<short>. Its teardown (n.remove) is
// the caller's to register, before anything can fail.
func (c *cluster) addNode(ctx context.Context, n *node) error {
	t0 := time.Now()
	if err := n.startRuntime(ctx); err != nil {
		return err
	}
	if err := n.startKubelet(ctx); err != nil {
		return err
	}
	c.step("node "+n.name+" up (runtime start to node registered)", t0)
	return nil
}

// remove tears the node down, whatever state a failed test left it in: while its
// kubelet and driver still run, it deletes the pods of ns and waits until they are
// gone (so the kubelets unpublish their volumes); then it stops the driver d (may be
// nil), the kubelet and the runtime, deletes their containers, kills the shims,
// removes the kubelet's cgroups (deepest first), unmounts everything below the node's dir (deepest first), removes it and the
// kubelet's links in /var/log/containers, and force-deletes what the API server
// still has of the node: its pods, its CSINode and its Node object.
func (n *node) remove(t *testing.T, d *driver, ns string) {
	c := n.c
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if n.kubelet == nil || n.kubelet.exited() {
		// Nothing would ever unpublish the node's pods: forget them.
		n.forceDeletePods(ctx)
	}
	if err := c.deletePodsIn(ctx, ns, 60*time.Second); err != nil {
		t.Errorf("teardown of %s: %v", n.name, err)
	}
	d.stop()
	n.kubelet.stop(10 * time.Second)
	n.cri.stop(10 * time.Second)
	removeContainers(n.dir, n.dir)
	if failed := removeCgroupTree(n.cgroupRoot, false); len(failed) > 0 {
		t.Errorf("teardown of %s: cgroups: %v", n.name, failed)
	}
	if failed := unmountAllUnder(n.dir); len(failed) > 0 {
		t.Errorf("teardown of %s: unmount: %v", n.name, failed)
	}
	removeContainerLogLinks(n.dir)
	if err := os.RemoveAll(n.dir); err != nil {
		t.Errorf("teardown of %s: %v", n.name, err)
	}
	n.forceDeletePods(ctx)
	if err := c.cs.StorageV1().CSINodes().Delete(ctx, n.name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete CSINode %s: %v", n.name, err)
	}
	if err := c.cs.CoreV1().Nodes().Delete(ctx, n.name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete Node %s: %v", n.name, err)
	}
	if ms := mountsUnder(n.dir); len(ms) > 0 {
		t.Errorf("teardown of %s: %d mounts left below %s", n.name, len(ms), n.dir)
	}
}

// forceDeletePods deletes the pods bound to the node from the API server at once
// (grace period 0), as for a node that is gone.
func (n *node) forceDeletePods(ctx context.Context) {
	zero := int64(0)
	pods, err := n.c.cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.name})
	if err != nil {
		return
	}
	for _, p := range pods.Items {
		_ = n.c.cs.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	}
}

// deletePodsIn deletes every pod of ns and waits up to d until they are gone.
func (c *cluster) deletePodsIn(ctx context.Context, ns string, d time.Duration) error {
	pods, err := c.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, p := range pods.Items {
		_ = c.cs.CoreV1().Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{})
	}
	return waitFor(ctx, d, 200*time.Millisecond, "pods of "+ns+" gone", func() (bool, error) {
		pods, err := c.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		if len(pods.Items) > 0 {
			return false, fmt.Errorf("%d pods left, e.g. %s", len(pods.Items), pods.Items[0].Name)
		}
		return true, nil
	})
}

// scheduledPod is c.newPod for the scheduler: no spec.nodeName, the label
// app=<app>, and a toleration of node.kubernetes.io/not-ready. The
// TaintNodesByCondition admission plugin puts that taint on every new Node, and
// the node lifecycle controller removes it only once the node is Ready, some
// seconds after it registers: the pods need not wait for that.
func (c *cluster) scheduledPod(name, app string, vol corev1.Volume) *corev1.Pod {
	p := c.newPod(twoNodesNS, name, vol, steps(st("write", "/data/f", "4096"), st("pause")))
	p.Spec.NodeName = ""
	p.Labels["app"] = app
	p.Spec.Tolerations = []corev1.Toleration{{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	return p
}

// TestTwoNodes: issue 15, scenario 4. A second node (its own kubelet, containerd,
// root dir, ports and scratch driver with --nodeid=e2e-node-b and
// --max-volumes-per-node=2) joins the cluster, and a real kube-scheduler places
// pods that name no node.
//
//   - The pods land on both nodes (a topology spread over kubernetes.io/hostname),
//     each volume published by the driver of its pod's node, mounted below that
//     node's kubelet root and never seen by the other driver.
//   - Node B is the harness's node with pod cgroups off (cgroupsPerQOS: false):
//     its containers run in containerd's /k8s.io/<container ID>, the first
//     node's in <its cgroupRoot>/kubepods/burstable/pod<UID>/<container ID>.
//     A driver there charges content in memory-backed volumes to itself, each
//     volume at its size (fallbackCharging, a subtest).
//   - --max-volumes-per-node reaches CSINode (allocatable.count 2 on node B, none
//     on the first node, whose driver has no limit). The scheduler does not count
//     inline CSI volumes against it: in kube-scheduler v1.34.4 to v1.37.2 the NodeVolumeLimits
//     plugin (pkg/scheduler/framework/plugins/nodevolumelimits/csi.go) counts
//     volumes of PVCs, generic ephemeral volumes and migrated in-tree inline volumes
//     only; its PreFilter returns Skip for a pod whose volumes are all CSI inline
//     volumes. So a third pod for node B is bound to it (PodScheduled=True, no
//     FailedScheduling), and the limit is enforced by the driver at publish: the
//     pod stays Pending with the kubelet's FailedMount event carrying the driver's
//     ResourceExhausted, and starts once a pod on node B ends.
//   - The orphan GC's pod informer of each driver is its own node's: with node B's
//     kubelet down and a running pod's directory out of sight, node B's GC asks the
//     API server (--gc-confirm-with-api) and keeps the volume because its informer
//     has the pod the scheduler bound to node B; the first node's driver never
//     logs a volume or pod of node B, and neither driver's GC removes or fails
//     anything.
func TestTwoNodes(t *testing.T) {
	c := clu
	start := time.Now()
	drvA := requireDriver(t)
	ctx := context.Background()
	if err := c.ensureNamespace(ctx, twoNodesNS); err != nil {
		t.Fatal(err)
	}
	sinceA := drvA.logSize()
	metricsA0, err := drvA.scrapeMetrics(ctx)
	if err != nil {
		t.Fatal(err)
	}

	// Node B and its driver; torn down in reverse order, and all
	// pods of the test deleted first while both kubelets and drivers run.
	b, err := c.newNode(secondNodeName, filepath.Join(c.root, "nodes", "b"), "-b")
	if err != nil {
		t.Fatal(err)
	}
	// The harness's one node with pod cgroups off (the first node has them on).
	b.podCgroups = false
	var drvB *driver
	t.Cleanup(func() {
		t0 := time.Now()
		b.remove(t, drvB, twoNodesNS)
		t.Logf("node %s torn down in %v", b.name, time.Since(t0).Round(time.Millisecond))
	})
	if err := c.addNode(ctx, b); err != nil {
		t.Fatal(err)
	}
	if drvB, err = c.newDriver(b, driverName, drvA.bin, filepath.Join(b.dir, "driver"), "driver-b", "--max-volumes-per-node=2"); err != nil {
		t.Fatal(err)
	}
	if err := drvB.start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("second node and its driver up in %v", time.Since(start).Round(time.Millisecond))

	// Node B is the harness's node without pod cgroups: content in
	// memory-backed volumes is charged to the driver there, at the volume's
	// size (issue 44 item 6; TestPodCgroupCharging is the first node's).
	t.Run("fallback charging", func(t *testing.T) { c.fallbackCharging(t, b) })

	// The limit reaches CSINode through NodeGetInfo.
	for _, x := range []struct {
		node string
		want int32 // 0: no allocatable count
	}{{nodeName, 0}, {secondNodeName, 2}} {
		n, err := c.cs.StorageV1().CSINodes().Get(ctx, x.node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var got *int32
		found := false
		for _, d := range n.Spec.Drivers {
			if d.Name == driverName {
				found = true
				if d.NodeID != x.node {
					t.Errorf("CSINode %s: driver node ID %q, want %q", x.node, d.NodeID, x.node)
				}
				if d.Allocatable != nil {
					got = d.Allocatable.Count
				}
			}
		}
		switch {
		case !found:
			t.Errorf("CSINode %s does not list %s", x.node, driverName)
		case x.want == 0 && got != nil:
			t.Errorf("CSINode %s: allocatable count %d, want none (no --max-volumes-per-node)", x.node, *got)
		case x.want != 0 && (got == nil || *got != x.want):
			t.Errorf("CSINode %s: allocatable count %v, want %d", x.node, got, x.want)
		}
	}

	// Four pods spread over the two nodes by the scheduler (maxSkew 1 ⇒ 2 + 2).
	nodes := map[string]*node{nodeName: &c.node, secondNodeName: b}
	drivers := map[string]*driver{nodeName: drvA, secondNodeName: drvB}
	vol := tmpfsVolume("data", "8Mi")
	t1 := time.Now()
	var spread []*corev1.Pod
	for i := range 4 {
		p := c.scheduledPod(fmt.Sprintf("spread-%d", i), "spread", vol)
		p.Spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{
			MaxSkew: 1, TopologyKey: "kubernetes.io/hostname", WhenUnsatisfiable: corev1.DoNotSchedule,
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "spread"}},
		}}
		spread = append(spread, c.createPod(t, p))
	}
	perNode := map[string][]*corev1.Pod{}
	for i, p := range spread {
		p = c.waitRunning(t, p, runningTimeout)
		spread[i] = p
		perNode[p.Spec.NodeName] = append(perNode[p.Spec.NodeName], p)
	}
	t.Logf("4 pods scheduled and Running in %v: %d on %s, %d on %s", time.Since(t1).Round(time.Millisecond),
		len(perNode[nodeName]), nodeName, len(perNode[secondNodeName]), secondNodeName)
	if len(perNode[nodeName]) != 2 || len(perNode[secondNodeName]) != 2 {
		t.Fatalf("want 2 pods per node, got %v", podNodes(spread))
	}
	for _, p := range spread {
		n, other := nodes[p.Spec.NodeName], otherNode(p.Spec.NodeName)
		target := filepath.Join(n.kubeletRoot, "pods", string(p.UID), "volumes", "kubernetes.io~csi", vol.Name, "mount")
		if ms := mountsAt(target); len(ms) != 1 || ms[0].FSType != "tmpfs" {
			t.Errorf("pod %s on %s: want one tmpfs at %s, got %+v", p.Name, n.name, target, ms)
		}
		if _, err := os.Stat(filepath.Join(nodes[other].kubeletRoot, "pods", string(p.UID))); err == nil {
			t.Errorf("pod %s of %s has a directory below %s's kubelet root", p.Name, n.name, other)
		}
		h := volumeHandle(string(p.UID), vol.Name)
		since := int64(0)
		if p.Spec.NodeName == nodeName {
			since = sinceA
		}
		if got := len(drivers[p.Spec.NodeName].rpcLines(since, "NodePublishVolume", h)); got != 1 {
			t.Errorf("pod %s on %s: its driver logged %d NodePublishVolume requests, want 1", p.Name, n.name, got)
		}
		// Pod cgroups on the first node, none on node B.
		if c.runtime == runtimeContainerd {
			n.wantContainerCgroup(t, p)
		}
	}

	// Node B is full (2 volumes, --max-volumes-per-node=2). A third pod for it is
	// bound all the same, and waits for a slot at the driver.
	over := c.scheduledPod("over-limit", "over", vol)
	over.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": secondNodeName}
	over = c.createPod(t, over)
	t2 := time.Now()
	msg := c.waitEvent(t, over, regexp.MustCompile(`ResourceExhausted.*--max-volumes-per-node 2`), 60*time.Second)
	t.Logf("pod beyond node B's limit: FailedMount after %v: %s", time.Since(t2).Round(time.Millisecond), msg)
	cur, err := c.cs.CoreV1().Pods(twoNodesNS).Get(ctx, over.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cur.Spec.NodeName != secondNodeName || cur.Status.Phase != corev1.PodPending {
		t.Errorf("pod beyond the limit: node %q phase %s, want %s and Pending", cur.Spec.NodeName, cur.Status.Phase, secondNodeName)
	}
	if !podCondition(cur, corev1.PodScheduled, corev1.ConditionTrue) {
		t.Errorf("pod beyond the limit: PodScheduled is not True: %+v", cur.Status.Conditions)
	}
	if evs := c.eventsWithReason(ctx, over, "FailedScheduling"); len(evs) > 0 {
		t.Errorf("the scheduler refused the pod beyond the limit (inline CSI volumes are not counted in v1.34.4 to v1.37.2, so it should not): %q", evs)
	}
	// A slot frees: the pod starts at the kubelet's next mount retry.
	freed := perNode[secondNodeName][0]
	t3 := time.Now()
	c.deletePod(t, freed, goneTimeout)
	t4 := time.Now()
	over = c.waitRunning(t, over, runningTimeout)
	t.Logf("pod beyond the limit Running %v after deleting %s from node B (%v after that pod was gone)",
		time.Since(t3).Round(time.Millisecond), freed.Name, time.Since(t4).Round(time.Millisecond))

	// Node B's orphan GC confirms with the API server through its own informer.
	keep := perNode[secondNodeName][1]
	c.gcKeepsPodOfOwnNode(t, b, drvB, keep, vol)

	// Neither driver saw the other node's pods; neither GC removed or failed.
	logA, logB := drvA.logSince(sinceA), drvB.log()
	all := append(append([]*corev1.Pod{}, spread...), over)
	for _, p := range all {
		uid := string(p.UID)
		nodeOf := p.Spec.NodeName
		otherLog := logA
		if nodeOf == nodeName {
			otherLog = logB
		}
		if strings.Contains(otherLog, uid) || strings.Contains(otherLog, volumeHandle(uid, vol.Name)) {
			t.Errorf("pod %s runs on %s, but the other node's driver logged its UID or volume", p.Name, nodeOf)
		}
	}
	// Each informer watches its own node's pods (the framework logs the node it
	// selects on when the informer syncs).
	for name, l := range map[string]string{nodeName: drvA.log(), secondNodeName: logB} {
		synced := informerNodes(l)
		ok := len(synced) > 0
		for _, x := range synced {
			ok = ok && x == name
		}
		if !ok {
			t.Errorf("driver of %s: its pod informers synced for nodes %q, want only %s", name, synced, name)
		}
	}
	metricsA1, err := drvA.scrapeMetrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	metricsB, err := drvB.scrapeMetrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{"removed", "failed"} {
		if d := metricsA1.sum("ephemera_gc_total", map[string]string{"result": r}) - metricsA0.sum("ephemera_gc_total", map[string]string{"result": r}); d != 0 {
			t.Errorf("first node's driver: ephemera_gc_total{result=%q} grew by %v during the test", r, d)
		}
		if v := metricsB.sum("ephemera_gc_total", map[string]string{"result": r}); v != 0 {
			t.Errorf("node B's driver: ephemera_gc_total{result=%q} = %v", r, v)
		}
	}

	// Cleanup through the kubelets: every volume unpublished by its own driver.
	t5 := time.Now()
	if err := c.deletePodsIn(ctx, twoNodesNS, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	for _, p := range all {
		n := p.Spec.NodeName
		since := int64(0)
		if n == nodeName {
			since = sinceA
		}
		if len(drivers[n].rpcLines(since, "NodeUnpublishVolume", volumeHandle(string(p.UID), vol.Name))) == 0 {
			t.Errorf("pod %s on %s: no NodeUnpublishVolume in its driver's log", p.Name, n)
		}
	}
	for _, n := range []*node{&c.node, b} {
		if ms := mountsUnder(filepath.Join(n.kubeletRoot, "pods")); len(ms) > 0 {
			t.Errorf("%d mounts left below %s's pods dir after the pods are gone", len(ms), n.name)
		}
	}
	drvB.stop()
	if keys, err := drvB.stateRecords(); err != nil {
		t.Errorf("node B's driver state: %v", err)
	} else if len(keys) > 0 {
		t.Errorf("node B's driver still has %d volume records: %v", len(keys), keys)
	}
	t.Logf("pods deleted and volumes unpublished in %v; test body %v", time.Since(t5).Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}

// gcKeepsPodOfOwnNode hides the directory of pod p (running on node n) from the
// orphan GC of n's driver while n's kubelet is down (renamed within the kubelet
// root, mounts and all), waits for a GC pass past the grace period that finds the
// volume orphaned and the pod existing (the driver's informer, field-selected on
// n's name, has the pod the scheduler bound there), then puts the directory back
// and starts the kubelet again. The volume stays mounted throughout.
func (c *cluster) gcKeepsPodOfOwnNode(t *testing.T, n *node, d *driver, p *corev1.Pod, vol corev1.Volume) {
	t.Helper()
	ctx := context.Background()
	t0 := time.Now()
	before, err := d.scrapeMetrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n.kubelet.stop(15 * time.Second)
	podDir := filepath.Join(n.kubeletRoot, "pods", string(p.UID))
	hidden := filepath.Join(n.kubeletRoot, "hidden-"+string(p.UID))
	if err := os.Rename(podDir, hidden); err != nil {
		if rerr := n.runKubelet(ctx, false); rerr != nil {
			t.Errorf("restart kubelet: %v", rerr)
		}
		t.Fatalf("hide %s: %v", podDir, err)
	}
	restored := false
	restore := func() {
		if restored {
			return
		}
		restored = true
		if err := os.Rename(hidden, podDir); err != nil {
			t.Errorf("restore %s: %v", podDir, err)
		}
		if err := n.runKubelet(ctx, false); err != nil {
			t.Errorf("restart kubelet of %s: %v", n.name, err)
		}
	}
	defer restore()
	var confirmed float64
	err = waitFor(ctx, 30*time.Second, 200*time.Millisecond, "node B's orphan GC confirms the pod exists", func() (bool, error) {
		m, err := d.scrapeMetrics(ctx)
		if err != nil {
			return false, err
		}
		confirmed = m.sum("ephemera_gc_total", map[string]string{"result": "pod_exists"}) - before.sum("ephemera_gc_total", map[string]string{"result": "pod_exists"})
		return confirmed > 0, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	after, err := d.scrapeMetrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{"removed", "failed", "refused"} {
		if v := after.sum("ephemera_gc_total", map[string]string{"result": r}) - before.sum("ephemera_gc_total", map[string]string{"result": r}); v != 0 {
			t.Errorf("node B's GC: %v volumes %s while the pod's directory was hidden", v, r)
		}
	}
	target := filepath.Join(hidden, "volumes", "kubernetes.io~csi", vol.Name, "mount")
	if ms := mountsAt(target); len(ms) != 1 {
		t.Errorf("the hidden pod's volume: want one mount at %s, got %d", target, len(ms))
	}
	restore()
	c.waitRunning(t, p, runningTimeout)
	t.Logf("node B's GC kept the volume of %s (pod_exists +%v) and the kubelet is back, in %v", p.Name, confirmed, time.Since(t0).Round(time.Millisecond))
}

// informerSyncedRE matches the framework's log line when the orphan GC's pod
// informer has synced, with the node it watches (framework/kube.Pods.Run).
var informerSyncedRE = regexp.MustCompile(`"Pod informer synced".* node="([^"]*)"`)

// informerNodes returns the node of every "Pod informer synced" line of a driver log.
func informerNodes(log string) []string {
	var out []string
	for _, m := range informerSyncedRE.FindAllStringSubmatch(log, -1) {
		out = append(out, m[1])
	}
	return out
}

func otherNode(name string) string {
	if name == nodeName {
		return secondNodeName
	}
	return nodeName
}

func podNodes(ps []*corev1.Pod) map[string]string {
	m := map[string]string{}
	for _, p := range ps {
		m[p.Name] = p.Spec.NodeName
	}
	return m
}

func podCondition(p *corev1.Pod, typ corev1.PodConditionType, want corev1.ConditionStatus) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == typ {
			return c.Status == want
		}
	}
	return false
}

// eventsWithReason returns the messages of the pod's events with the reason.
func (c *cluster) eventsWithReason(ctx context.Context, p *corev1.Pod, reason string) []string {
	evs, err := c.cs.CoreV1().Events(p.Namespace).List(ctx, metav1.ListOptions{
		FieldSelector: fields.Set{"involvedObject.name": p.Name, "reason": reason}.String(),
	})
	if err != nil {
		return []string{"(events: " + err.Error() + ")"}
	}
	var out []string
	for _, e := range evs.Items {
		out = append(out, e.Message)
	}
	return out
}
