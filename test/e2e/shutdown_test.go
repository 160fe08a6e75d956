//go:build e2e && linux

package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ephemera-csi/ephemera/test/e2e/logind"
)

const (
	// shutdownNS holds TestGracefulNodeShutdown's workload pods.
	shutdownNS = "shutdown"
	// systemCriticalPriority is the kubelet's SystemCriticalPriority
	// (k8s.io/kubernetes pkg/apis/scheduling): system-cluster-critical is this,
	// system-node-critical (the driver's class in deploy/base) 1000 more.
	systemCriticalPriority = 2000000000
	// The shutdown node's grace periods: ordinary pods first, for up to
	// shutdownGraceWorkloads, then the critical ones (the driver), for up to
	// shutdownGraceCritical.
	shutdownGraceWorkloads = 20
	shutdownGraceCritical  = 10
)

// shutdownKubeletConfig is what an operator adds to the KubeletConfiguration for
// graceful node shutdown by pod priority (docs/operations.md, "Graceful node
// shutdown"): the groups are killed from the lowest priority up, each group's
// volumes unmounted before the next group is killed.
var shutdownKubeletConfig = fmt.Sprintf(`shutdownGracePeriodByPodPriority:
- {priority: 0, shutdownGracePeriodSeconds: %d}
- {priority: %d, shutdownGracePeriodSeconds: %d}
`, shutdownGraceWorkloads, systemCriticalPriority, shutdownGraceCritical)

// shutdownNode is a node whose kubelet has graceful node shutdown on: its
// system bus is a private dbus-daemon (DBUS_SYSTEM_BUS_ADDRESS in the kubelet's
// environment) on which a stand-in logind (test/e2e/logind) hands out the
// kubelet's delay lock and announces shutdowns.
type shutdownNode struct {
	*node
	bus    *proc
	logind *logind.Logind
}

// addShutdownNode brings up e2e-node-b below <root>/nodes/s (processes *-s)
// with the kubelet configuration extra (shutdownGracePeriodByPodPriority...),
// its bus and logind started first (the kubelet connects once, at start). It
// registers the node's teardown (pods of ns deleted while the kubelet runs,
// then node.remove, then the bus) and returns once the kubelet holds its lock.
func (c *cluster) addShutdownNode(t *testing.T, ns, extra string) *shutdownNode {
	t.Helper()
	ctx := context.Background()
	t0 := time.Now()
	dir := filepath.Join(c.root, "nodes", "s")
	s := &shutdownNode{}
	var sock string
	var err error
	s.bus, s.logind, sock, err = c.startLogind(ctx, filepath.Join(dir, "dbus"), "dbus-daemon-s")
	t.Cleanup(func() {
		if s.logind != nil {
			s.logind.Close()
		}
		if s.bus != nil {
			s.bus.stop(5 * time.Second)
		}
	})
	if err != nil {
		t.Fatal(err)
	}

	s.node, err = c.newNode(secondNodeName, dir, "-s")
	if err != nil {
		t.Fatal(err)
	}
	s.extraKubeletConfig = extra
	s.kubeletEnv = []string{"DBUS_SYSTEM_BUS_ADDRESS=" + logind.Address(sock)}
	t.Cleanup(func() { s.remove(t, nil, ns) })
	started := time.Now()
	if err := c.addNode(ctx, s.node); err != nil {
		t.Fatal(err)
	}
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := s.logind.WaitInhibitor(lctx, "kubelet", started); err != nil {
		t.Fatalf("%v\nkubelet log:\n%s", err, tail(readFile(s.kubelet.logPath), 30))
	}
	c.step("shutdown node up, the kubelet holds its delay lock", t0)
	return s
}

// startLogind starts a private system bus (a dbus-daemon named proc, its
// socket and configuration in busDir) and the stand-in logind on it, as a
// node with graceful node shutdown needs them before its kubelet starts (it
// connects once, at start). It returns what it started also with an error, for
// the caller to stop, and the bus's socket.
func (c *cluster) startLogind(ctx context.Context, busDir, proc string) (*proc, *logind.Logind, string, error) {
	if err := os.MkdirAll(busDir, 0o755); err != nil {
		return nil, nil, "", err
	}
	daemon, err := exec.LookPath("dbus-daemon")
	if err != nil {
		return nil, nil, "", fmt.Errorf("dbus-daemon not installed (test/e2e/install-deps.sh installs Debian's dbus-daemon)")
	}
	sock := filepath.Join(busDir, "system_bus_socket")
	cfg := filepath.Join(busDir, "system.conf")
	if err := os.WriteFile(cfg, []byte(logind.BusConfig(sock)), 0o644); err != nil {
		return nil, nil, "", err
	}
	bus, err := c.startProc(proc, daemon, []string{"--nofork", "--nopidfile", "--config-file=" + cfg}, nil)
	if err != nil {
		return nil, nil, "", err
	}
	err = waitFor(ctx, 10*time.Second, 20*time.Millisecond, "dbus-daemon listening on "+sock, func() (bool, error) {
		if bus.exited() {
			return false, stop(fmt.Errorf("dbus-daemon exited, see %s", bus.logPath))
		}
		conn, err := net.Dial("unix", sock)
		if err != nil {
			return false, nil
		}
		conn.Close()
		return true, nil
	})
	if err != nil {
		return bus, nil, sock, err
	}
	// At least the sum of the grace periods: less, and the kubelet would write
	// /etc/systemd/logind.conf.d/99-kubelet.conf on this machine.
	l, err := logind.Start(logind.Address(sock), logind.Options{
		InhibitDelayMax: (shutdownGraceWorkloads + shutdownGraceCritical + 10) * time.Second,
	})
	return bus, l, sock, err
}

// gracefulShutdown announces a shutdown to the node's kubelet
// (PrepareForShutdown(true)) and waits until it releases its delay lock: the
// kubelet has then killed every pod, group by group. It fails the test if the
// lock is still held after logind's InhibitDelayMax. Nothing is powered off: the
// node's processes keep running, and the caller cancels (cancelShutdown) or
// restarts what a reboot would.
func gracefulShutdown(t *testing.T, s *shutdownNode) logind.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := s.logind.Shutdown(ctx)
	if err != nil {
		t.Fatalf("graceful shutdown of %s: %v", s.name, err)
	}
	if res.TimedOut {
		t.Fatalf("graceful shutdown of %s: the kubelet still held its lock after %v (logind powers off then)", s.name, res.Done.Sub(res.Announced))
	}
	return res
}

// cancelShutdown announces that the shutdown is off (PrepareForShutdown(false))
// and waits until the kubelet holds a new delay lock: it admits pods again.
func cancelShutdown(t *testing.T, s *shutdownNode) {
	t.Helper()
	since := time.Now()
	if err := s.logind.Cancel(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.logind.WaitInhibitor(ctx, "kubelet", since); err != nil {
		t.Fatal(err)
	}
}

func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

// klogTime is the time of a klog text line (Lmmdd hh:mm:ss.uuuuuu ..., UTC on
// these machines) of this year.
var klogTimeRE = regexp.MustCompile(`^[IWEF](\d{4} \d{2}:\d{2}:\d{2}\.\d{6}) `)

func klogTime(line string) (time.Time, bool) {
	m := klogTimeRE.FindStringSubmatch(line)
	if m == nil {
		return time.Time{}, false
	}
	ts, err := time.ParseInLocation("0102 15:04:05.000000", m[1], time.Local)
	if err != nil {
		return time.Time{}, false
	}
	return ts.AddDate(time.Now().Year(), 0, 0), true
}

// killedAt is when the kubelet's shutdown manager started killing the pod
// (its "Shutdown manager killing pod with gracePeriod" line, V(1)).
func killedAt(kubeletLog string, p *corev1.Pod) (time.Time, string) {
	for _, l := range strings.Split(kubeletLog, "\n") {
		if strings.Contains(l, `"Shutdown manager killing pod with gracePeriod"`) && strings.Contains(l, `pod="`+p.Namespace+"/"+p.Name+`"`) {
			ts, _ := klogTime(l)
			return ts, l
		}
	}
	return time.Time{}, ""
}

// orderWatch samples the node every 10 ms during a shutdown: when each target
// lost its mount and when the driver's process exited.
type orderWatch struct {
	stopc, done chan struct{}
	unmounted   map[string]time.Time
	driverExit  time.Time
}

func watchOrder(targets []string, driverPID int) *orderWatch {
	w := &orderWatch{stopc: make(chan struct{}), done: make(chan struct{}), unmounted: map[string]time.Time{}}
	sample := func() {
		now := time.Now()
		if ms, err := readMountInfo(); err == nil {
			for _, tg := range targets {
				if _, seen := w.unmounted[tg]; seen {
					continue
				}
				if !slices.ContainsFunc(ms, func(m mountInfo) bool { return m.MountPoint == tg }) {
					w.unmounted[tg] = now
				}
			}
		}
		if w.driverExit.IsZero() && !processRunning(driverPID) {
			w.driverExit = now
		}
	}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			sample()
			select {
			case <-w.stopc:
				sample() // what changed since the last tick, at the latest now
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

func (w *orderWatch) stop() {
	close(w.stopc)
	<-w.done
}

// processRunning: /proc/<pid> exists and is not a zombie.
func processRunning(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) S ...: the state follows the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// TestGracefulNodeShutdown (issue 45): a graceful node shutdown by pod
// priority, with the driver deployed as shipped (its DaemonSet pod
// system-node-critical). Every workload pod's volume must be unpublished by the
// driver before the kubelet stops the driver; then the node comes back and
// nothing is left.
func TestGracefulNodeShutdown(t *testing.T) {
	c := clu
	if c.runtime != runtimeContainerd {
		t.Skip("runs the driver as a DaemonSet pod: EPHEMERA_E2E_RUNTIME=containerd")
	}
	drv := requireDriver(t) // for its binary: the image below is made of it
	ctx := context.Background()
	start := time.Now()
	if err := c.ensureNamespace(ctx, shutdownNS); err != nil {
		t.Fatal(err)
	}
	s := c.addShutdownNode(t, shutdownNS, shutdownKubeletConfig)
	kubeletLog := func() string { return readFile(s.kubelet.logPath) }
	if !strings.Contains(kubeletLog(), `"Creating node shutdown manager"`) {
		t.Fatalf("the kubelet did not create its node shutdown manager:\n%s", tail(kubeletLog(), 30))
	}

	// The driver as deploy/overlays/linux-embedded-registrar ships it, its
	// image made of the harness's driver binary, pinned to this node.
	t1 := time.Now()
	image := "ephemera.local/e2e/scratch-driver:shutdown"
	tarPath := filepath.Join(s.dir, "driver-image.tar")
	if err := writeImageArchive(tarPath, drv.bin, driverInImage, map[string][]string{image: nil}); err != nil {
		t.Fatal(err)
	}
	if out, err := s.ctr(ctx, "images", "import", tarPath); err != nil {
		t.Fatalf("ctr images import: %v\n%s", err, out)
	}
	objs, err := readObjects(filepath.Join(c.manifestsDir(t), "kustomize-linux-embedded-registrar.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var ds *unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "DaemonSet" {
			ds = o
		}
	}
	if ds == nil {
		t.Fatal("kustomize-linux-embedded-registrar: no DaemonSet")
	}
	if pc, _, _ := unstructured.NestedString(ds.Object, "spec", "template", "spec", "priorityClassName"); pc != "system-node-critical" {
		t.Fatalf("the shipped DaemonSet's priorityClassName is %q, want system-node-critical", pc)
	}
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	stateRoot := filepath.Join(s.dir, "state")
	if err := s.forNode(ds, stateRoot, image, port); err != nil {
		t.Fatal(err)
	}
	spec, _, _ := unstructured.NestedMap(ds.Object, "spec", "template", "spec")
	spec["nodeSelector"] = map[string]any{"kubernetes.io/hostname": s.name}
	ctn := driverContainerIn(spec)
	args, _ := ctn["args"].([]any)
	for i, a := range args {
		if a == "--v=2" {
			args[i] = "--v=4" // the requests are logged at 4
		}
	}
	if err := unstructured.SetNestedMap(ds.Object, spec, "spec", "template", "spec"); err != nil {
		t.Fatal(err)
	}
	stateDB := filepath.Join(strings.TrimPrefix(driverArg(ds, "--state-dir="), "--state-dir="), "state.db")
	a := c.newApplier(t)
	t.Cleanup(func() {
		c.deleteDaemonSet(t, ds.GetNamespace(), ds.GetName(), goneTimeout)
		for i := len(objs) - 1; i >= 0; i-- {
			if objs[i].GetKind() == "CSIDriver" {
				continue // the harness's, restored below
			}
			if err := a.delete(context.Background(), objs[i]); err != nil {
				t.Errorf("delete %s: %v", describe(objs[i]), err)
			}
		}
		if err := c.applyCSIDriver(context.Background()); err != nil {
			t.Errorf("restore the harness's CSIDriver: %v", err)
		}
	})
	if err := c.ensureNamespace(ctx, ds.GetNamespace()); err != nil {
		t.Fatal(err)
	}
	registrations := func() int { return countInFile(s.kubelet.logPath, "Register new plugin with name: "+driverName+" ") }
	before := registrations()
	for _, o := range objs {
		if err := a.apply(ctx, o, false); err != nil {
			t.Fatalf("apply %s: %v", describe(o), err)
		}
	}
	drvPod := c.daemonSetPod(t, ds.GetNamespace(), ds.GetName(), s.name)
	drvPod = c.waitRunning(t, drvPod, runningTimeout)
	s.waitDriverRegistered(t, before, registrations, drvPod)
	if drvPod.Spec.Priority == nil || *drvPod.Spec.Priority <= systemCriticalPriority {
		t.Fatalf("the driver's pod has priority %v, want system-node-critical's (above %d)", drvPod.Spec.Priority, systemCriticalPriority)
	}
	c.step("driver DaemonSet pod running and registered on "+s.name, t1)

	// Workloads: ordinary pods (priority 0), each with an inline volume.
	t2 := time.Now()
	type workload struct {
		p      *corev1.Pod
		vol    corev1.Volume
		target string
		handle string
	}
	var ws []workload
	// The workloads' pods go while the driver still runs (cleanups run last
	// first), when the test ends early.
	t.Cleanup(func() {
		if err := c.deletePodsIn(context.Background(), shutdownNS, goneTimeout); err != nil {
			t.Errorf("delete the workloads: %v", err)
		}
	})
	// tmpfs only: the image holds the driver's binary alone, no mkfs for loop.
	for i, vol := range []corev1.Volume{tmpfsVolume("v", "8Mi"), tmpfsVolume("v", "16Mi"), tmpfsVolume("v", "4Mi")} {
		p := c.newPod(shutdownNS, fmt.Sprintf("app-%d", i), vol, steps(st("write", "/data/f", "4096"), st("pause")))
		p.Spec.NodeName = s.name
		ws = append(ws, workload{p: c.createPod(t, p), vol: vol})
	}
	for i := range ws {
		w := &ws[i]
		w.p = c.waitRunning(t, w.p, runningTimeout)
		if w.p.Spec.Priority == nil || *w.p.Spec.Priority != 0 {
			t.Fatalf("pod %s has priority %v, want 0", w.p.Name, w.p.Spec.Priority)
		}
		w.target = filepath.Join(s.kubeletRoot, "pods", string(w.p.UID), "volumes", "kubernetes.io~csi", w.vol.Name, "mount")
		w.handle = volumeHandle(string(w.p.UID), w.vol.Name)
		if ms := mountsAt(w.target); len(ms) != 1 {
			t.Fatalf("pod %s: %d mounts at %s, want 1", w.p.Name, len(ms), w.target)
		}
	}
	c.step(fmt.Sprintf("%d workload pods running on %s", len(ws), s.name), t2)

	// The shutdown.
	_, driverPID := s.containerPID(t, drvPod)
	var targets []string
	for _, w := range ws {
		targets = append(targets, w.target)
	}
	// The driver's log, held open: once its pod is terminal the DaemonSet
	// controller may delete it and the kubelet its log directory before the
	// checks below read it.
	drvLog := openPodLogs(t, s.node.podLogsDir, drvPod)
	watch := watchOrder(targets, driverPID)
	res := gracefulShutdown(t, s)
	err = waitFor(ctx, 30*time.Second, 50*time.Millisecond, "the driver's process exits", func() (bool, error) {
		return !processRunning(driverPID), nil
	})
	watch.stop()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("SHUTDOWN announced %s, the kubelet released its lock %v later; the driver's process exited %v after the announcement",
		res.Announced.Format("15:04:05.000"), res.Done.Sub(res.Announced).Round(time.Millisecond), watch.driverExit.Sub(res.Announced).Round(time.Millisecond))

	// The order: every workload volume unpublished by the driver, unmounted,
	// before the kubelet turned to the driver's pod.
	klog := kubeletLog()
	for _, l := range strings.Split(klog, "\n") {
		if strings.Contains(l, "nodeshutdown_manager") {
			t.Logf("kubelet: %s", l)
		}
	}
	drvKilled, line := killedAt(klog, drvPod)
	if drvKilled.IsZero() {
		t.Errorf("the kubelet's log has no \"Shutdown manager killing pod\" line for the driver's pod %s", drvPod.Name)
	} else {
		t.Logf("the kubelet began killing the driver's pod at %s (%s)", drvKilled.Format("15:04:05.000000"), line)
	}
	logText := drvLog()
	var lastUnmount time.Time
	for _, w := range ws {
		gone, ok := watch.unmounted[w.target]
		switch {
		case !ok:
			t.Errorf("pod %s: %s still mounted after the shutdown", w.p.Name, w.target)
			continue
		case !gone.Before(watch.driverExit):
			t.Errorf("pod %s: %s unmounted at %s, not before the driver's process exited at %s",
				w.p.Name, w.target, gone.Format("15:04:05.000"), watch.driverExit.Format("15:04:05.000"))
		case !drvKilled.IsZero() && !gone.Before(drvKilled):
			t.Errorf("pod %s: %s unmounted at %s, not before the kubelet began killing the driver's pod at %s",
				w.p.Name, w.target, gone.Format("15:04:05.000"), drvKilled.Format("15:04:05.000"))
		}
		if gone.After(lastUnmount) {
			lastUnmount = gone
		}
		killed, _ := killedAt(klog, w.p)
		t.Logf("SHUTDOWN pod %s: killed %v after the announcement, its volume unmounted %v after it",
			w.p.Name, killed.Sub(res.Announced).Round(time.Millisecond), gone.Sub(killed).Round(time.Millisecond))
		var unpub []string
		for _, l := range strings.Split(logText, "\n") {
			if strings.Contains(l, `"Request" method="/csi.v1.Node/NodeUnpublishVolume"`) && strings.Contains(l, w.handle) {
				unpub = append(unpub, l)
			}
		}
		if len(unpub) == 0 {
			t.Errorf("pod %s: no NodeUnpublishVolume for %s in the driver's log", w.p.Name, w.handle)
		}
		for _, l := range strings.Split(logText, "\n") {
			if strings.Contains(l, `"Request failed"`) && strings.Contains(l, w.handle) {
				t.Errorf("pod %s: a request for its volume failed: %s", w.p.Name, l)
			}
		}
		cur, err := c.cs.CoreV1().Pods(shutdownNS).Get(ctx, w.p.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// Terminal: Failed (the shutdown manager's status), or Succeeded when
		// the container exited 0 on SIGTERM (testbin's pause does), which the
		// kubelet keeps.
		if cur.Status.Phase != corev1.PodFailed && cur.Status.Phase != corev1.PodSucceeded || !podCondition(cur, corev1.DisruptionTarget, corev1.ConditionTrue) {
			t.Errorf("pod %s after the shutdown: phase %s, want a terminal one with the condition DisruptionTarget", w.p.Name, cur.Status.Phase)
		}
		var conds []string
		for _, cd := range cur.Status.Conditions {
			conds = append(conds, fmt.Sprintf("%s=%s(%s)", cd.Type, cd.Status, cd.Reason))
		}
		t.Logf("pod %s after the shutdown: phase %s, reason %q, message %q, conditions %v", w.p.Name, cur.Status.Phase, cur.Status.Reason, cur.Status.Message, conds)
		if ms := mountsUnder(filepath.Join(s.kubeletRoot, "pods", string(w.p.UID))); len(ms) != 0 {
			t.Errorf("pod %s: %d mounts left below its pod dir after the shutdown, e.g. %s", w.p.Name, len(ms), ms[0].MountPoint)
		}
	}
	if !drvKilled.IsZero() {
		t.Logf("SHUTDOWN last workload volume unmounted %v after the announcement; the kubelet began killing the driver %v after that; the driver's process exited %v after that",
			lastUnmount.Sub(res.Announced).Round(time.Millisecond), drvKilled.Sub(lastUnmount).Round(time.Millisecond), watch.driverExit.Sub(drvKilled).Round(time.Millisecond))
	}
	// The driver is down (the kubelet admits no pod while the node shuts
	// down: the DaemonSet's replacement waits): its state has no record left.
	if keys, err := boltRecords(stateDB); err != nil || len(keys) != 0 {
		t.Errorf("records in %s after the shutdown: %v (%v), want none", stateDB, keys, err)
	}

	// The node comes back: the shutdown is called off, then the kubelet
	// restarts (its new process takes a new lock).
	t3 := time.Now()
	cancelShutdown(t, s)
	since := time.Now()
	regBefore := registrations()
	if err := s.restartKubelet(ctx); err != nil {
		t.Fatal(err)
	}
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := s.logind.WaitInhibitor(lctx, "kubelet", since); err != nil {
		t.Fatal(err)
	}
	// The DaemonSet controller replaces the driver's failed pod.
	newDrv := s.newDriverPod(t, ds, drvPod)
	s.waitDriverRegistered(t, regBefore, registrations, newDrv)
	c.step("node back: shutdown cancelled, kubelet restarted, new driver pod registered", t3)

	if os.Getenv("EPHEMERA_E2E_SHUTDOWN_CONTROL") == "1" {
		t.Run("driver at priority 0", func(t *testing.T) {
			newDrv = s.driverAtPriorityZero(t, ds, newDrv, registrations)
		})
	}

	// It works: a new pod's volume is published; then every pod is deleted
	// and nothing is left.
	vol := tmpfsVolume("v", "8Mi")
	p := c.newPod(shutdownNS, "after", vol, steps(st("write", "/data/f", "4096"), st("pause")))
	p.Spec.NodeName = s.name
	p = c.waitRunning(t, c.createPod(t, p), runningTimeout)
	if tg := filepath.Join(s.kubeletRoot, "pods", string(p.UID), "volumes", "kubernetes.io~csi", vol.Name, "mount"); len(mountsAt(tg)) != 1 {
		t.Errorf("pod %s after the node came back: %d mounts at %s, want 1", p.Name, len(mountsAt(tg)), tg)
	}
	if err := c.deletePodsIn(ctx, shutdownNS, goneTimeout); err != nil {
		t.Fatal(err)
	}
	// Then the driver (the garbage collector deletes its pod, the kubelet
	// tears it down): no pod directory, mount or record is left on the node.
	c.deleteDaemonSet(t, ds.GetNamespace(), ds.GetName(), goneTimeout)
	if ms := mountsUnder(filepath.Join(s.kubeletRoot, "pods")); len(ms) != 0 {
		t.Errorf("%d mounts below the pods dir at the end, e.g. %s", len(ms), ms[0].MountPoint)
	}
	err = waitFor(ctx, 30*time.Second, 200*time.Millisecond, "no pod directory left on "+s.name, func() (bool, error) {
		des, err := os.ReadDir(filepath.Join(s.kubeletRoot, "pods"))
		if err != nil {
			return false, err
		}
		if len(des) == 0 {
			return true, nil
		}
		var names []string
		for _, d := range des {
			names = append(names, d.Name())
		}
		return false, fmt.Errorf("left: %v", names)
	})
	if err != nil {
		t.Error(err)
	}
	if keys, err := boltRecords(stateDB); err != nil || len(keys) != 0 {
		t.Errorf("records in %s at the end: %v (%v), want none", stateDB, keys, err)
	}
	t.Logf("scenario in %v", time.Since(start).Round(time.Millisecond))
}

// waitDriverRegistered waits for a new registration of the driver in the
// node's kubelet log (more than before) and for the node's CSINode to list it.
func (s *shutdownNode) waitDriverRegistered(t *testing.T, before int, registrations func() int, p *corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	err := waitFor(ctx, 60*time.Second, 100*time.Millisecond, "kubelet-s registered "+driverName+" and CSINode lists it", func() (bool, error) {
		if registrations() <= before {
			return false, nil
		}
		cn, err := s.c.cs.StorageV1().CSINodes().Get(ctx, s.name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		return slices.ContainsFunc(cn.Spec.Drivers, func(d storagev1.CSINodeDriver) bool { return d.Name == driverName }), nil
	})
	if err != nil {
		t.Fatalf("%v\nevents:\n%s", err, s.c.podEvents(p))
	}
}

// driverContainerIn is the container named driver of a pod spec.
func driverContainerIn(spec map[string]any) map[string]any {
	cs, _ := spec["containers"].([]any)
	for _, ci := range cs {
		if ctn, ok := ci.(map[string]any); ok && ctn["name"] == "driver" {
			return ctn
		}
	}
	return map[string]any{}
}

// newDriverPod waits for a pod of the DaemonSet ds on the node, Running, other
// than old (the DaemonSet controller's replacement), and returns it.
func (s *shutdownNode) newDriverPod(t *testing.T, ds *unstructured.Unstructured, old *corev1.Pod) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	var pod *corev1.Pod
	err := waitFor(ctx, 90*time.Second, 200*time.Millisecond, "a new driver pod running on "+s.name, func() (bool, error) {
		pods, err := s.c.cs.CoreV1().Pods(ds.GetNamespace()).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + s.name})
		if err != nil {
			return false, err
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			if p.UID != old.UID && p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil && strings.HasPrefix(p.Name, ds.GetName()) {
				pod = p
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

// setDriverPriorityClass sets (or, with "", removes) the priorityClassName of
// the DaemonSet's pod template; the rollout replaces the node's driver pod.
func (c *cluster) setDriverPriorityClass(t *testing.T, ds *unstructured.Unstructured, class string) {
	t.Helper()
	v := "null"
	if class != "" {
		v = fmt.Sprintf("%q", class)
	}
	patch := `{"spec":{"template":{"spec":{"priorityClassName":` + v + `}}}}`
	if _, err := c.cs.AppsV1().DaemonSets(ds.GetNamespace()).Patch(context.Background(), ds.GetName(), types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// driverAtPriorityZero is the control of TestGracefulNodeShutdown
// (EPHEMERA_E2E_SHUTDOWN_CONTROL=1, about a minute more): the same shutdown
// with the driver's priorityClassName removed, as a chart installed with
// priorityClassName="" has it. The driver is then in the workloads' group,
// killed with them: their unpublishes find no driver, the kubelet waits the
// group's whole grace period for unmounts that cannot happen and releases its
// lock with the volumes still mounted (what kubernetes/kubernetes#115148's
// reporters saw). Then the class is restored, the node comes back and the
// kubelet unpublishes them through the new driver. Returns the driver pod
// running at the end.
func (s *shutdownNode) driverAtPriorityZero(t *testing.T, ds *unstructured.Unstructured, drv *corev1.Pod, registrations func() int) *corev1.Pod {
	c := s.c
	ctx := context.Background()
	before := registrations()
	c.setDriverPriorityClass(t, ds, "")
	restored := false
	defer func() {
		if !restored {
			c.setDriverPriorityClass(t, ds, "system-node-critical")
		}
	}()
	drv = s.newDriverPod(t, ds, drv)
	s.waitDriverRegistered(t, before, registrations, drv)
	if drv.Spec.Priority == nil || *drv.Spec.Priority != 0 {
		t.Fatalf("the driver's pod without a priority class has priority %v, want 0", drv.Spec.Priority)
	}
	var targets []string
	for i := range 2 {
		vol := tmpfsVolume("v", "8Mi")
		p := c.newPod(shutdownNS, fmt.Sprintf("control-%d", i), vol, steps(st("write", "/data/f", "4096"), st("pause")))
		p.Spec.NodeName = s.name
		p = c.waitRunning(t, c.createPod(t, p), runningTimeout)
		targets = append(targets, filepath.Join(s.kubeletRoot, "pods", string(p.UID), "volumes", "kubernetes.io~csi", vol.Name, "mount"))
	}
	_, pid := s.containerPID(t, drv)
	logOff := fileSize(s.kubelet.logPath)
	watch := watchOrder(targets, pid)
	res := gracefulShutdown(t, s)
	watch.stop()
	klog := readFile(s.kubelet.logPath)[int(logOff):]
	for _, l := range strings.Split(klog, "\n") {
		if strings.Contains(l, "nodeshutdown_manager") || strings.Contains(l, "UnmountVolume.TearDown failed") {
			t.Logf("kubelet: %s", l)
		}
	}
	var still []string
	for _, tg := range targets {
		if len(mountsAt(tg)) > 0 {
			still = append(still, tg)
		}
	}
	t.Logf("CONTROL the kubelet released its lock %v after the announcement; the driver's process exited %v after it; %d of %d workload volumes still mounted at the release",
		res.Done.Sub(res.Announced).Round(time.Millisecond), watch.driverExit.Sub(res.Announced).Round(time.Millisecond), len(still), len(targets))
	if len(still) == 0 {
		t.Errorf("with the driver at priority 0 every volume was unmounted before the release: the control shows nothing (the kubelet's order is not what the scenario proves)")
	}
	if watch.driverExit.IsZero() || watch.driverExit.After(res.Done) {
		t.Errorf("the driver's process exited at %v, want before the release at %v", watch.driverExit, res.Done)
	}
	// A failed TearDown leaves the mount "uncertain" in the kubelet's actual
	// state of the world, which WaitForAllPodsUnmount counts as unmounted
	// (PodHasMountedVolumes looks for VolumeMounted only): the kubelet does
	// not wait the group's grace period, it moves on at once.
	if n := strings.Count(klog, "not found in the list of registered CSI drivers"); n == 0 {
		t.Errorf("the kubelet's log has no failed unmount for want of the driver")
	}

	// Back: the class restored, the shutdown called off, the kubelet restarted;
	// the new driver unpublishes what was left.
	c.setDriverPriorityClass(t, ds, "system-node-critical")
	restored = true
	cancelShutdown(t, s)
	before = registrations()
	if err := s.restartKubelet(ctx); err != nil {
		t.Fatal(err)
	}
	drv = s.newDriverPod(t, ds, drv)
	s.waitDriverRegistered(t, before, registrations, drv)
	err := waitFor(ctx, 90*time.Second, 200*time.Millisecond, "the left volumes unmounted", func() (bool, error) {
		for _, tg := range targets {
			if len(mountsAt(tg)) > 0 {
				return false, fmt.Errorf("%s still mounted", tg)
			}
		}
		return true, nil
	})
	if err != nil {
		t.Error(err)
	}
	return drv
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// openPodLogs opens the log files of the pod's containers in a kubelet's pod
// logs directory and returns what reads them whole: the open descriptors keep
// what the containers wrote, also after the kubelet removed the files.
func openPodLogs(t *testing.T, podLogsDir string, p *corev1.Pod) func() string {
	t.Helper()
	files := podLogFiles(podLogsDir, p)
	if len(files) == 0 {
		t.Fatalf("no container log of pod %s below %s", p.Name, podLogsDir)
	}
	var fs []*os.File
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		fs = append(fs, fh)
		t.Cleanup(func() { fh.Close() })
	}
	return func() string {
		var b strings.Builder
		for _, fh := range fs {
			if data, err := io.ReadAll(io.NewSectionReader(fh, 0, 1<<40)); err == nil {
				b.Write(data)
			}
		}
		return b.String()
	}
}
