//go:build e2e && linux

package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// fullNodePods is the kubelet's default maxPods: a node filled to it.
const fullNodePods = 110

// TestFullNode fills the node to the kubelet's default maxPods (110) with
// pods created all at once: 110 inline tmpfs pods (restartPolicy Always)
// during whose start the driver is SIGKILLed while NodePublishVolume calls are
// in flight and restarted, and later, with part of the pods Running, the
// kubelet is restarted. All pods must reach Running with every container
// ready and one tmpfs mount at each target, and no NodePublishVolume may be
// answered with a final error code by the restarted driver.
//
// With EPHEMERA_E2E_FULLNODE_COMPARE=1 (make e2e E2E_FULLNODE_COMPARE=1; it
// adds about three minutes) two batches without faults come first, for the
// time to all Running: 110 pods with emptyDir{medium: Memory} (the reference)
// and 110 inline tmpfs pods.
//
// All pods are deleted after each batch. At the end nothing is left: no mount
// below the kubelet's root (other than the kubelet's bind mount of its root
// onto itself) or the driver's directory, no pod directory of any of the
// pods, no target, no record in the driver's state.db.
//
// LATENCY lines log the times to all Running; they never fail the test.
func TestFullNode(t *testing.T) {
	c := clu
	d := requireDriver(t)
	const n = fullNodePods
	inlineVol := func(int) corev1.Volume { return tmpfsVolume("v", "4Mi") }
	t0 := time.Now()

	var all []*corev1.Pod // every pod of the test, for the leftover checks
	var handles []string  // every inline volume's handle
	defer func() {
		if t.Failed() {
			c.deleteMany(t, all)
		}
	}()
	check := func(pods []*corev1.Pod) {
		t.Helper()
		for _, p := range pods {
			if m := c.published(t, p, p.Spec.Volumes[0]); m.FSType != "tmpfs" {
				t.Errorf("pod %s: volume mounted as %q, want tmpfs", p.Name, m.FSType)
			}
			if p.Spec.Volumes[0].CSI != nil {
				handles = append(handles, volumeHandle(string(p.UID), p.Spec.Volumes[0].Name))
			}
		}
	}
	remove := func(pods []*corev1.Pod) {
		t.Helper()
		c.deleteMany(t, pods)
		for _, p := range pods {
			c.cleanedUp(t, p, p.Spec.Volumes[0])
		}
	}
	// batch starts n pods at once, without faults, and returns them with their
	// create->Running times and the time from the first Create to all Running.
	batch := func(prefix string, vol func(int) corev1.Volume) ([]*corev1.Pod, latency, time.Duration) {
		t.Helper()
		start := time.Now()
		pods, created := c.createMany(t, prefix, n, vol, nil)
		all = append(all, pods...) // before the wait: deleted on a failure
		running := c.waitManyRunning(t, prefix, pods, created, 4*time.Minute, nil)
		took := time.Since(start)
		t.Logf("%d %s pods Running: %s", n, prefix, summarize(running))
		check(pods)
		return pods, summarize(running), took
	}

	// The batches without faults, on request.
	var emptyAll, inlineAll time.Duration
	if os.Getenv("EPHEMERA_E2E_FULLNODE_COMPARE") == "1" {
		var pods []*corev1.Pod
		var emptyLat, inlineLat latency
		pods, emptyLat, emptyAll = batch("full-emptydir", func(int) corev1.Volume { return memoryEmptyDir("v") })
		remove(pods)
		before := d.mustScrape(t)
		pods, inlineLat, inlineAll = batch("full-inline", inlineVol)
		share := publishDelta(t, before, d.mustScrape(t), n, inlineLat.mean)
		remove(pods)
		t.Logf("LATENCY full node, %d pods at once, no faults: inline CSI all Running after %v (%s) | emptyDir{medium: Memory} all Running after %v (%s) | inline/emptyDir all-Running=%.2fx %s",
			n, inlineAll.Round(time.Millisecond), inlineLat, emptyAll.Round(time.Millisecond), emptyLat,
			float64(inlineAll)/float64(emptyAll), ratio(inlineLat, emptyLat))
		t.Logf("LATENCY full node driver: %s", share)
	}

	// The faulted batch: the case itself.
	faultedAll, f := c.faultedBatch(t, d, "full-faulted", n, inlineVol, &all)
	check(all[len(all)-n:])
	vs := ""
	if emptyAll > 0 {
		vs = fmt.Sprintf(" = %.2fx emptyDir{medium: Memory}'s %v = %.2fx the clean inline batch's %v",
			float64(f.allRunning)/float64(emptyAll), emptyAll.Round(time.Millisecond),
			float64(f.allRunning)/float64(inlineAll), inlineAll.Round(time.Millisecond))
	}
	t.Logf("LATENCY full node, %d inline pods at once, driver SIGKILLed (%d of %d NodePublishVolume calls received unanswered) and restarted, kubelet restarted with %d Running: all Running after %v%s; all containers ready after %v (%d container restarts)",
		n, f.inflight, f.received, f.runningAtKubelet, f.allRunning.Round(time.Millisecond), vs,
		faultedAll.Round(time.Millisecond), f.restarts)
	remove(all[len(all)-n:])

	c.assertNodeClean(t, d, all, handles)
	t.Logf("%d pods in %d batches: %v", len(all), len(all)/n, time.Since(t0).Round(time.Millisecond))
}

// faults is what faultedBatch did and saw.
type faults struct {
	received, inflight int // NodePublishVolume calls of the batch the killed driver received, and left unanswered
	runningAtKubelet   int // pods Running when the kubelet was stopped
	republished        int // NodePublishVolume calls after the kubelet restart
	allRunning         time.Duration
	restarts           int32 // container restarts in the batch
}

// faultedBatch creates n inline pods (restartPolicy Always: a container the
// kubelet fails to start across its restart is started again, see KUBELET.md)
// at once and, while they start, SIGKILLs the driver as soon as it has received
// 10 NodePublishVolume calls of the batch and not answered some, starts it
// again after 1 s, and restarts the kubelet once a quarter of the pods runs.
// It waits until every pod is Running with its container ready, checks the
// driver's answers, appends the pods to *all and returns the time from the
// first Create to all ready.
func (c *cluster) faultedBatch(t *testing.T, d *driver, prefix string, n int, vol func(int) corev1.Volume, all *[]*corev1.Pod) (time.Duration, faults) {
	t.Helper()
	var f faults
	ctx, cancel := context.WithCancel(context.Background())
	var running atomic.Int32
	off := d.logSize()
	var driverOff, kubeletOff int64
	var faultErr error
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		faultErr = func() error {
			err := waitFor(ctx, 2*time.Minute, 20*time.Millisecond, "NodePublishVolume calls of the batch in flight", func() (bool, error) {
				recv, open := publishesInFlight(d.logSince(off))
				return recv >= 10 && open > 0, nil
			})
			if err != nil {
				return err
			}
			d.kill9() // returns once the process is reaped: its log is complete
			f.received, f.inflight = publishesInFlight(d.logSince(off))
			t.Logf("driver killed with SIGKILL: %d NodePublishVolume calls of the batch received, %d of them unanswered; %d pods Running", f.received, f.inflight, running.Load())
			time.Sleep(time.Second)
			driverOff = d.logSize()
			t1 := time.Now()
			if err := d.start(ctx); err != nil {
				return fmt.Errorf("restart driver: %w", err)
			}
			t.Logf("driver restarted and registered in %v; %d pods Running", time.Since(t1).Round(time.Millisecond), running.Load())
			err = waitFor(ctx, 3*time.Minute, 20*time.Millisecond, "a quarter of the pods Running", func() (bool, error) {
				return int(running.Load()) >= n/4, nil
			})
			if err != nil {
				return err
			}
			f.runningAtKubelet = int(running.Load())
			if f.runningAtKubelet >= n {
				return errors.New("all pods were Running before the kubelet restart: not a restart in the middle")
			}
			kubeletOff = d.logSize()
			t2 := time.Now()
			if err := c.restartKubelet(ctx); err != nil {
				return fmt.Errorf("restart kubelet: %w", err)
			}
			t.Logf("kubelet restarted with %d of %d pods Running, healthy again in %v", f.runningAtKubelet, n, time.Since(t2).Round(time.Millisecond))
			return nil
		}()
	}()
	// On a failure below, stop the fault injection before the pods are deleted.
	defer func() {
		cancel()
		<-finished
	}()

	start := time.Now()
	pods, created := c.createMany(t, prefix, n, vol, func(p *corev1.Pod) { p.Spec.RestartPolicy = corev1.RestartPolicyAlways })
	*all = append(*all, pods...)
	times := c.waitManyRunning(t, prefix, pods, created, 5*time.Minute, func(r int) { running.Store(int32(r)) })
	f.allRunning = time.Since(start)
	t.Logf("%d %s pods Running: %s", n, prefix, summarize(times))
	<-finished
	if faultErr != nil {
		t.Fatalf("faults: %v", faultErr)
	}

	// Phase Running is not enough after a kubelet restart: a container may
	// have failed to start and wait for its restart.
	var notReady string
	err := waitFor(context.Background(), 3*time.Minute, 250*time.Millisecond, fmt.Sprintf("%d %s pods Running and ready", n, prefix), func() (bool, error) {
		list, err := c.cs.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{LabelSelector: "batch=" + prefix})
		if err != nil {
			return false, err
		}
		ready := 0
		f.restarts = 0
		for i := range list.Items {
			p := &list.Items[i]
			for _, cs := range p.Status.ContainerStatuses {
				f.restarts += cs.RestartCount
			}
			if p.Status.Phase == corev1.PodRunning && podReady(p) {
				ready++
			} else {
				notReady = p.Name
			}
		}
		if ready < n {
			return false, fmt.Errorf("%d/%d ready, e.g. not %s", ready, n, notReady)
		}
		return true, nil
	})
	allReady := time.Since(start)
	if err != nil {
		for _, p := range pods {
			if p.Name == notReady {
				t.Logf("events of %s:\n%s", p.Name, c.podEvents(p))
			}
		}
		t.Fatal(err)
	}

	// The restarted driver's answers: kubelet retries of the calls the killed
	// driver left unanswered, then the republish of every volume the restarted
	// kubelet reconstructed. Transient codes are fine (the kubelet retries);
	// a final one would make the kubelet give the volume up.
	codes := map[string]int{}
	for _, l := range strings.Split(d.logSince(driverOff), "\n") {
		if !strings.Contains(l, `method="/csi.v1.Node/NodePublishVolume"`) {
			continue
		}
		if strings.Contains(l, `"Request failed"`) || strings.Contains(l, `"Request refused"`) {
			code := "?"
			if m := codeRE.FindStringSubmatch(l); m != nil {
				code = m[1]
			}
			codes[code]++
			if !transientCodes[code] {
				t.Errorf("NodePublishVolume answered with a final error after the driver restart: %s", l)
			}
		}
	}
	recv, open := publishesInFlight(d.logSince(kubeletOff))
	f.republished = recv
	if open > 0 {
		t.Errorf("%d NodePublishVolume calls unanswered by the running driver", open)
	}
	t.Logf("restarted driver: NodePublishVolume errors by code %v; %d NodePublishVolume calls after the kubelet restart for %d pods", codes, recv, n)
	return allReady, f
}

var (
	codeRE     = regexp.MustCompile(`code="?([A-Za-z]+)`)
	volumeIDRE = regexp.MustCompile(`volumeID="([^"]+)"`)
	handleRE   = regexp.MustCompile(`csi-[0-9a-f]{64}`)
	// transientCodes are the codes the kubelet does not treat as final
	// (isFinalError in pkg/volume/csi): the volume stays "uncertain" and the
	// call is retried.
	transientCodes = map[string]bool{"Canceled": true, "DeadlineExceeded": true, "Unavailable": true, "ResourceExhausted": true, "Aborted": true}
)

// publishesInFlight counts in a piece of the driver log the NodePublishVolume
// requests and those not answered (no "Request done", "failed" or "refused"
// line for the same volume after them).
func publishesInFlight(log string) (received, open int) {
	pending := map[string]int{}
	for _, l := range strings.Split(log, "\n") {
		if !strings.Contains(l, `method="/csi.v1.Node/NodePublishVolume"`) {
			continue
		}
		m := volumeIDRE.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		switch {
		case strings.Contains(l, `"Request"`):
			received++
			pending[m[1]]++
		case strings.Contains(l, `"Request done"`), strings.Contains(l, `"Request failed"`), strings.Contains(l, `"Request refused"`):
			pending[m[1]]--
		}
	}
	for _, v := range pending {
		if v > 0 {
			open += v
		}
	}
	return received, open
}

func podReady(p *corev1.Pod) bool {
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// assertNodeClean checks, after all pods are gone, that nothing of them is left
// on the node: no mount below the kubelet's root (but its bind mount of the
// root onto itself) or the driver's directory, no pod directory, and (with the
// driver stopped) no record at all in the driver's state.db.
func (c *cluster) assertNodeClean(t *testing.T, d *driver, pods []*corev1.Pod, handles []string) {
	t.Helper()
	var left []string
	for _, m := range append(mountsUnder(c.kubeletRoot), mountsUnder(filepath.Dir(d.stateDir))...) {
		if m.MountPoint != c.kubeletRoot {
			left = append(left, m.MountPoint)
		}
	}
	if len(left) > 0 {
		t.Errorf("%d mounts left below the kubelet root or the driver's dir, e.g. %s", len(left), left[0])
	}
	// The kubelet removes the directories of deleted pods in its housekeeping
	// (every 2 s), after the API object is gone.
	var dirs []string
	err := waitFor(context.Background(), 30*time.Second, 250*time.Millisecond, "pod directories removed", func() (bool, error) {
		dirs = dirs[:0]
		for _, p := range pods {
			dir := filepath.Join(c.kubeletRoot, "pods", string(p.UID))
			if _, err := os.Lstat(dir); err == nil {
				dirs = append(dirs, dir)
			}
		}
		if len(dirs) > 0 {
			return false, fmt.Errorf("%d of %d pod directories left, e.g. %s", len(dirs), len(pods), dirs[0])
		}
		return true, nil
	})
	if err != nil {
		t.Error(err)
	}
	mine := map[string]bool{}
	for _, h := range handles {
		mine[h] = true
	}
	d.withDriverStopped(t, func() {
		keys, err := d.stateRecords()
		if err != nil {
			t.Errorf("read driver state: %v", err)
			return
		}
		var own, other []string
		for _, k := range keys {
			if mine[handleRE.FindString(k)] {
				own = append(own, k)
			} else {
				other = append(other, k)
			}
		}
		sort.Strings(own)
		if len(own) > 0 {
			t.Errorf("%d bbolt records of this test's %d volumes left, e.g. %s", len(own), len(handles), own[0])
		}
		if len(other) > 0 {
			t.Errorf("%d bbolt records of other volumes left (not this test's): %v", len(other), other)
		}
		t.Logf("driver state.db: %d volume records (%d volumes checked)", len(keys), len(handles))
	})
}
