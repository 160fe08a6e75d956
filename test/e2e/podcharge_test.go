//go:build e2e && linux

package e2e

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// What TestPodCgroupCharging and TestTwoNodes' fallback check run beside the
// shared driver: a scratch driver of its own name with genplugin
// (test/e2e/genplugin) as its backend "gen", whose every answer is a new
// generation of genBytes, refreshed on each republish (requiresRepublish).
const (
	chargeDriverName = "charge.csi.ephemera.dev"
	chargeNS         = "e2e-charge"
	genBytes         = 4 << 20
	// refreshAnnotation is patched on a pod to make its kubelet sync it: a
	// changed annotation is a pod update (pkg/kubelet/config
	// podsDifferSemantically), the sync's WaitForAttachAndMount reprocesses
	// the pod's volumes and the volume manager republishes those whose
	// CSIDriver says requiresRepublish. The kubelet's own resync
	// (syncFrequency 10s, with jitter) republishes them too.
	refreshAnnotation = "e2e.ephemera.dev/refresh"
)

// chargeRig is genplugin and a scratch driver serving it (chargeDriverName,
// --plugin gen=...) on one node; the driver runs in a memory cgroup of its
// own, so that what the kernel charges to it is read apart from everything
// else the test runs.
type chargeRig struct {
	n      *node
	d      *driver
	plugin *tokensPlugin
	cgroup string // the driver's memory cgroup (cgroupfs path)
}

// startChargeRig starts genplugin and the driver on node n, with the
// CSIDriver chargeDriverName (deploy/base's, requiresRepublish: true).
// Cleanups stop them, remove the driver's cgroup and delete the CSIDriver;
// the caller's pods, created later, are deleted first.
func (c *cluster) startChargeRig(t *testing.T, n *node) *chargeRig {
	t.Helper()
	ctx := context.Background()
	shared := requireDriver(t)
	bin := filepath.Join(c.root, "bin", "genplugin")
	if _, err := os.Stat(bin); err != nil {
		if err := c.goBuildIn(ctx, c.repoRoot, bin, "./test/e2e/genplugin"); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(n.dir, "charge")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}

	obj, err := c.csiDriverObject()
	if err != nil {
		t.Fatal(err)
	}
	obj.Name = chargeDriverName
	obj.Spec.RequiresRepublish = ptrTo(true)
	if _, err := c.cs.StorageV1().CSIDrivers().Create(ctx, obj, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create CSIDriver %s: %v", chargeDriverName, err)
	}
	t.Cleanup(func() {
		if err := c.cs.StorageV1().CSIDrivers().Delete(context.Background(), chargeDriverName, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete CSIDriver %s: %v", chargeDriverName, err)
		}
	})

	gp := &tokensPlugin{c: c, bin: bin, proc: "plugin-gen" + n.suffix, endpoint: "unix://" + filepath.Join(dir, "gen.sock")}
	if err := gp.startWith(ctx, fmt.Sprintf("--bytes=%d", genBytes)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gp.p.stop(10 * time.Second) })

	cg := cgroupRunDir(c.root) + "/charge" + n.suffix
	mem := cgroupV1Mount("memory")
	if err := os.MkdirAll(filepath.Join(mem, cg), 0o755); err != nil {
		t.Fatalf("memory cgroup for the driver: %v", err)
	}
	t.Cleanup(func() {
		if err := rmdirCgroup(filepath.Join(mem, cg)); err != nil {
			t.Errorf("remove the driver's memory cgroup: %v", err)
		}
	})

	d, err := c.newDriver(n, chargeDriverName, shared.bin, dir, "driver-charge"+n.suffix,
		"--driver-name="+chargeDriverName, "--plugin=gen="+gp.endpoint,
		"--events", "--kubeconfig="+filepath.Join(c.root, "admin.kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	d.memCgroup = cg
	t.Cleanup(func() {
		d.stop()
		err := waitFor(context.Background(), 30*time.Second, 100*time.Millisecond, "CSINode "+n.name+" without "+chargeDriverName, func() (bool, error) {
			cn, err := c.cs.StorageV1().CSINodes().Get(context.Background(), n.name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return true, nil
			} else if err != nil {
				return false, err
			}
			for _, x := range cn.Spec.Drivers {
				if x.Name == chargeDriverName {
					return false, nil
				}
			}
			return true, nil
		})
		if err != nil {
			t.Error(err)
		}
	})
	if err := d.start(ctx); err != nil {
		t.Fatalf("start %s on %s: %v", chargeDriverName, n.name, err)
	}
	if err := c.ensureNamespace(ctx, chargeNS); err != nil {
		t.Fatal(err)
	}
	return &chargeRig{n: n, d: d, plugin: gp, cgroup: cg}
}

// wantCharging checks how the driver said, at its start, that it charges
// content in memory-backed volumes: its log line and its gauge, mode
// "pod-cgroup" or "volume-size".
func (r *chargeRig) wantCharging(t *testing.T, mode string) {
	t.Helper()
	var line string
	for _, l := range strings.Split(r.d.log(), "\n") {
		if strings.Contains(l, `"Charging content in memory-backed volumes"`) {
			line = l // the last start's
		}
	}
	if !strings.Contains(line, `mode="`+mode+`"`) {
		t.Errorf("%s on %s: start log line %q, want mode=%q", r.d.proc, r.n.name, line, mode)
	}
	m := r.d.mustScrape(t)
	for _, other := range []string{"pod-cgroup", "volume-size"} {
		want := 0.0
		if other == mode {
			want = 1
		}
		if got := m.sum("ephemera_content_charging", map[string]string{"mode": other}); got != want {
			t.Errorf("%s on %s: ephemera_content_charging{mode=%q} = %v, want %v", r.d.proc, r.n.name, other, got, want)
		}
	}
}

// pod is a pod on the rig's node whose one container keeps every generation
// of its volume's token open (testbin hold), with a memory limit, and whose
// volume is genplugin's in a tmpfs of tmpfsSize.
func (r *chargeRig) pod(name string, limit int64, tmpfsSize string) *corev1.Pod {
	vol := corev1.Volume{Name: "token", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
		Driver: chargeDriverName, VolumeAttributes: map[string]string{"backend": "gen", "size": tmpfsSize},
	}}}
	p := r.n.c.newPod(chargeNS, name, vol, steps(st("hold", dataPath+"/token")))
	p.Spec.NodeName = r.n.name
	p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: *resource.NewQuantity(limit, resource.BinarySI)}
	return p
}

// heldFile is one file a pod's testbin hold step keeps open.
type heldFile struct {
	ino  uint64
	size int64
	head string // its first line: genplugin's "generation N volume ... pod ..."
}

var holdRE = regexp.MustCompile(`^STEP 0 hold ok held=(\d+) ino=(\d+) size=(\d+) head=(".*")$`)

// held returns the files the first run of the pod's container keeps open,
// in the order it opened them (its log on the rig's node).
func (r *chargeRig) held(t *testing.T, p *corev1.Pod) []heldFile {
	t.Helper()
	var out []heldFile
	for _, l := range r.n.containerLog(p) {
		m := holdRE.FindStringSubmatch(l)
		if m == nil {
			if strings.HasPrefix(l, "STEP 0 hold err") {
				t.Logf("pod %s: %s", p.Name, l)
			}
			continue
		}
		ino, _ := strconv.ParseUint(m[2], 10, 64)
		size, _ := strconv.ParseInt(m[3], 10, 64)
		head, _ := strconv.Unquote(m[4])
		if n, _ := strconv.Atoi(m[1]); n != len(out)+1 {
			t.Fatalf("pod %s: hold line %q out of order", p.Name, l)
		}
		out = append(out, heldFile{ino: ino, size: size, head: head})
	}
	return out
}

// refresh patches the pod's refresh annotation, so that its kubelet
// republishes its volume (see refreshAnnotation).
func (c *cluster) refresh(t *testing.T, p *corev1.Pod, round int) {
	t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"%d"}}}`, refreshAnnotation, round)
	if _, err := c.cs.CoreV1().Pods(p.Namespace).Patch(context.Background(), p.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("patch pod %s: %v", p.Name, err)
	}
}

// podMemoryCgroup is the pod's memory cgroup on a node with pod cgroups
// (cgroupfs path): <cgroupRoot>/kubepods/<qos>/pod<UID>.
func (n *node) podMemoryCgroup(p *corev1.Pod) string {
	qos := ""
	if p.Status.QOSClass != corev1.PodQOSGuaranteed {
		qos = "/" + strings.ToLower(string(p.Status.QOSClass))
	}
	return n.cgroupRoot + "/kubepods" + qos + "/pod" + string(p.UID)
}

// memoryCounter reads one number of a memory cgroup: a memory.stat key
// ("total_shmem"), "oom_kill" of memory.oom_control, or a file of its own
// ("memory.failcnt"). ok is false when the cgroup is gone.
func memoryCounter(cgroup, key string) (v int64, ok bool, err error) {
	mnt := cgroupV1Mount("memory")
	file, field := key, ""
	switch {
	case strings.HasPrefix(key, "memory."):
	case key == "oom_kill":
		file, field = "memory.oom_control", key
	default:
		file, field = "memory.stat", key
	}
	b, err := os.ReadFile(filepath.Join(mnt, cgroup, file))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, false, nil
	} else if err != nil {
		return 0, false, err
	}
	if field == "" {
		v, err = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		return v, err == nil, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if k, s, found := strings.Cut(l, " "); found && k == field {
			v, err = strconv.ParseInt(s, 10, 64)
			return v, err == nil, err
		}
	}
	return 0, false, fmt.Errorf("%s of %s has no %s", file, cgroup, field)
}

func mustMemoryCounter(t *testing.T, cgroup, key string) int64 {
	t.Helper()
	v, ok, err := memoryCounter(cgroup, key)
	if err != nil || !ok {
		t.Fatalf("memory cgroup %s: %s: %v (exists: %v)", cgroup, key, err, ok)
	}
	return v
}

const mib = 1 << 20

// TestPodCgroupCharging (issue 44 item 6): on the first node, whose kubelet
// runs with pod cgroups (cgroupsPerQOS, cgroupRoot of its own), the driver
// writes the content of memory-backed volumes from the pod's memory cgroup,
// so what a pod keeps alive of it is charged to the pod, never to the driver.
//
// A scratch driver of its own (chargeDriverName, genplugin's 4 MiB
// generations, requiresRepublish) runs in a memory cgroup of its own and
// says so at start: "Charging content in memory-backed volumes" mode
// pod-cgroup, ephemera_content_charging{mode="pod-cgroup"} 1. Two pods keep
// every generation of their token open (testbin hold) while their kubelet
// republishes their volumes (an annotation patch per round): the holder
// (memory limit 64Mi) and the hog (16Mi, restartPolicy Always). Read from
// the kernel (cgroup v1 memory.stat, memory.oom_control, memory.failcnt):
//
//   - the holder's pod cgroup is charged about 4 MiB of shmem per generation
//     it holds (at least 5);
//   - the driver's cgroup gains no shmem (under 1 MiB) while the pods hold
//     tens of MiB of its writes, never hits its limit, and the driver
//     process is the same throughout; ephemera_content_held_bytes stays 0;
//   - the hog, which cannot hold more than a few generations in 16Mi, is
//     OOM-killed by its own pod cgroup (its container's last state
//     OOMKilled, oom_kill in its pod cgroup) or has its refresh refused
//     ResourceExhausted; it was charged its generations before that;
//   - the holder, its neighbour, is neither: its refreshes keep succeeding
//     (a new generation after the hog's end), no OOM kill in its cgroup,
//     its container never restarted.
//
// Containerd only, cgroup v1 (the files it reads).
func TestPodCgroupCharging(t *testing.T) {
	c := clu
	if c.runtime != runtimeContainerd {
		t.Skip("needs a container that keeps files open in its volume: EPHEMERA_E2E_RUNTIME=containerd")
	}
	if cgroupV1Mount("memory") == "" {
		t.Skip("no cgroup v1 memory hierarchy (this scenario reads cgroup v1 files)")
	}
	if !c.podCgroups {
		t.Fatal("the first node's kubelet runs without pod cgroups")
	}
	t0 := time.Now()
	ctx := context.Background()
	r := c.startChargeRig(t, &c.node)
	r.wantCharging(t, "pod-cgroup")
	pid := r.d.p.cmd.Process.Pid
	m0 := r.d.mustScrape(t)
	drvShmem0 := mustMemoryCounter(t, r.cgroup, "total_shmem")
	drvUsage0 := mustMemoryCounter(t, r.cgroup, "memory.usage_in_bytes")
	since := r.d.logSize()
	c.step("charge driver and genplugin started", t0)

	const holderLimit, hogLimit = 64 * mib, 16 * mib
	holder := c.createPod(t, r.pod("holder", holderLimit, "48Mi"))
	t.Cleanup(func() { c.deletePod(t, holder, goneTimeout) })
	hogSpec := r.pod("hog", hogLimit, "48Mi")
	hogSpec.Spec.RestartPolicy = corev1.RestartPolicyAlways
	hog := c.createPod(t, hogSpec)
	t.Cleanup(func() { c.deletePod(t, hog, goneTimeout) })
	holder = c.waitRunning(t, holder, runningTimeout)
	hog = c.waitRunning(t, hog, runningTimeout)
	for _, p := range []*corev1.Pod{holder, hog} {
		if p.Status.QOSClass != corev1.PodQOSBurstable {
			t.Fatalf("pod %s: QoS class %s, want Burstable", p.Name, p.Status.QOSClass)
		}
	}
	holderCg, hogCg := c.podMemoryCgroup(holder), c.podMemoryCgroup(hog)
	holderH := volumeHandle(string(holder.UID), "token")
	hogH := volumeHandle(string(hog.UID), "token")
	err := waitFor(ctx, 30*time.Second, 100*time.Millisecond, "both pods hold their first generation", func() (bool, error) {
		return len(r.held(t, holder)) > 0 && len(r.held(t, hog)) > 0, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	c.step("holder and hog Running, first generation held", t0)

	// The rounds: both pods refreshed until the hog is stopped (OOM-killed
	// or refused) and the holder holds at least 5 generations, one of them
	// from after the hog's end.
	var (
		hogOutcome   string // how the hog was stopped; "" while it is not
		hogHeldMax   int    // generations the hog's first run held
		hogShmemMax  int64  // the most total_shmem read in the hog's pod cgroup
		hogOOMKills  int64  // oom_kill of the hog's pod cgroup
		hogFailcnt   int64  // memory.failcnt of the hog's pod cgroup
		holderAtHog  int    // generations the holder held when the hog was stopped
		holderRounds int
	)
	observeHog := func() {
		if v, ok, _ := memoryCounter(hogCg, "total_shmem"); ok && v > hogShmemMax {
			hogShmemMax = v
		}
		if v, ok, _ := memoryCounter(hogCg, "oom_kill"); ok {
			hogOOMKills = v
		}
		if v, ok, _ := memoryCounter(hogCg, "memory.failcnt"); ok {
			hogFailcnt = v
		}
		hogHeldMax = max(hogHeldMax, len(r.held(t, hog)))
		if hogOutcome != "" {
			return
		}
		cur, err := c.cs.CoreV1().Pods(chargeNS).Get(ctx, hog.Name, metav1.GetOptions{})
		if err == nil && len(cur.Status.ContainerStatuses) > 0 {
			cs := cur.Status.ContainerStatuses[0]
			for _, term := range []*corev1.ContainerStateTerminated{cs.LastTerminationState.Terminated, cs.State.Terminated} {
				if term != nil {
					hogOutcome = fmt.Sprintf("container terminated: reason %s, exit code %d (restarts %d)", term.Reason, term.ExitCode, cs.RestartCount)
					return
				}
			}
		}
		if l := r.d.answeredLines(since, hogH, "ResourceExhausted"); len(l) > 0 {
			hogOutcome = "refresh refused: " + l[0]
		}
	}
	for round := 1; ; round++ {
		if hogOutcome != "" && len(r.held(t, holder)) >= max(5, holderAtHog+1) {
			break
		}
		if round > 10 {
			t.Fatalf("after %d rounds: the holder holds %d generations, the hog %d (stopped: %q)", round-1, len(r.held(t, holder)), hogHeldMax, hogOutcome)
		}
		nHolder, nHog := len(r.held(t, holder)), len(r.held(t, hog))
		c.refresh(t, holder, round)
		if hogOutcome == "" {
			c.refresh(t, hog, round)
		}
		hogWasStopped := hogOutcome != ""
		err := waitFor(ctx, 20*time.Second, 100*time.Millisecond, fmt.Sprintf("round %d: a new generation held by the holder, and by the hog or its end", round), func() (bool, error) {
			observeHog()
			if hogOutcome != "" && !hogWasStopped && holderAtHog == 0 {
				holderAtHog = len(r.held(t, holder))
			}
			return len(r.held(t, holder)) > nHolder && (hogOutcome != "" || len(r.held(t, hog)) > nHog), nil
		})
		if err != nil {
			t.Fatalf("%v\nholder events:\n%s\nhog events:\n%s", err, c.podEvents(holder), c.podEvents(hog))
		}
		holderRounds++
		t.Logf("round %d: holder holds %d generations (pod cgroup total_shmem %d), hog %d (total_shmem at most %d, oom_kill %d)",
			round, len(r.held(t, holder)), mustMemoryCounter(t, holderCg, "total_shmem"), len(r.held(t, hog)), hogShmemMax, hogOOMKills)
	}
	c.step(fmt.Sprintf("%d refresh rounds", holderRounds), t0)

	// The holder: every generation held, each charged to its pod's cgroup.
	held := r.held(t, holder)
	shmem := mustMemoryCounter(t, holderCg, "total_shmem")
	after := len(r.held(t, holder))
	seen := map[string]bool{}
	for i, h := range held {
		if h.size != genBytes || !strings.HasPrefix(h.head, "generation ") || !strings.Contains(h.head, " pod "+chargeNS+"/holder") || seen[h.head] {
			t.Errorf("holder's file %d: %d bytes, first line %q; want %d bytes of a generation of its own", i+1, h.size, h.head, genBytes)
		}
		seen[h.head] = true
	}
	if lo, hi := int64(len(held))*genBytes, int64(after+1)*genBytes+mib; shmem < lo || shmem > hi {
		t.Errorf("holder's pod cgroup %s: total_shmem %d for %d generations held of %d bytes: want %d to %d", holderCg, shmem, len(held), genBytes, lo, hi)
	}
	t.Logf("holder: %d generations held, pod cgroup total_shmem %d (%.2f MiB per generation), usage %d, limit %d",
		len(held), shmem, float64(shmem)/float64(len(held))/mib, mustMemoryCounter(t, holderCg, "memory.usage_in_bytes"), holderLimit)
	if n := mustMemoryCounter(t, holderCg, "oom_kill"); n != 0 {
		t.Errorf("holder's pod cgroup: oom_kill %d, want 0", n)
	}
	cur, err := c.cs.CoreV1().Pods(chargeNS).Get(ctx, holder.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cs := cur.Status.ContainerStatuses; len(cs) != 1 || cs[0].RestartCount != 0 || cs[0].State.Running == nil {
		t.Errorf("holder's container: %+v, want running, never restarted", cs)
	}
	if f := r.d.answeredLines(since, holderH, ""); len(f) > 0 {
		t.Errorf("a publish or refresh of the holder's volume failed:\n%s", strings.Join(f, "\n"))
	}

	// The hog: stopped by its own limit, after its generations were charged
	// to it.
	t.Logf("hog: %s; held %d generations, its pod cgroup's total_shmem reached %d, memory.failcnt %d, oom_kill %d", hogOutcome, hogHeldMax, hogShmemMax, hogFailcnt, hogOOMKills)
	switch {
	case strings.HasPrefix(hogOutcome, "container terminated"):
		if !strings.Contains(hogOutcome, "reason OOMKilled") && hogOOMKills == 0 {
			t.Errorf("hog: %s, and no OOM kill in its pod cgroup: want it OOM-killed by its limit", hogOutcome)
		}
	case strings.HasPrefix(hogOutcome, "refresh refused"):
		if !strings.Contains(hogOutcome, "memory limit") {
			t.Errorf("hog: %s; want the refusal to name its memory limit", hogOutcome)
		}
	}
	// Either way the hog's own cgroup is where the limit was hit: the kernel
	// failed a charge there, or OOM-killed there.
	if hogFailcnt == 0 && hogOOMKills == 0 {
		t.Errorf("hog's pod cgroup %s: memory.failcnt 0 and oom_kill 0: its limit was never hit", hogCg)
	}
	if hogShmemMax < 2*genBytes {
		t.Errorf("hog's pod cgroup: total_shmem at most %d, want at least two generations (%d) charged to it before it was stopped", hogShmemMax, 2*genBytes)
	}

	// The driver: not charged, not restarted, counting nothing held.
	drvShmem := mustMemoryCounter(t, r.cgroup, "total_shmem")
	drvUsage := mustMemoryCounter(t, r.cgroup, "memory.usage_in_bytes")
	m1 := r.d.mustScrape(t)
	// Its usage is its own process's: anonymous memory (the answers of
	// genplugin in flight, and the Go heap not yet collected), logged.
	t.Logf("driver's memory cgroup %s: total_shmem %d -> %d; usage %d -> %d (total_rss %d, total_cache %d; go_memstats_heap_inuse_bytes %v)",
		r.cgroup, drvShmem0, drvShmem, drvUsage0, drvUsage, mustMemoryCounter(t, r.cgroup, "total_rss"), mustMemoryCounter(t, r.cgroup, "total_cache"),
		m1.sum("go_memstats_heap_inuse_bytes", nil))
	for _, k := range []string{"memory.failcnt", "oom_kill"} {
		if v := mustMemoryCounter(t, r.cgroup, k); v != 0 {
			t.Errorf("driver's memory cgroup: %s %d, want 0", k, v)
		}
	}
	if drvShmem-drvShmem0 > mib {
		t.Errorf("driver's memory cgroup: total_shmem %d -> %d while the pods hold %d generations of %d bytes: want it flat (under 1 MiB more)", drvShmem0, drvShmem, len(held)+hogHeldMax, genBytes)
	}
	if r.d.p.exited() || r.d.p.cmd.Process.Pid != pid {
		t.Errorf("the driver exited or was restarted (%v)", r.d.p.exitErr())
	}
	if v := m1.sum("ephemera_content_held_bytes", nil); v != 0 {
		t.Errorf("ephemera_content_held_bytes = %v with pods charged: want 0", v)
	}
	if a, b := m0.sum("process_start_time_seconds", nil), m1.sum("process_start_time_seconds", nil); a != b {
		t.Errorf("process_start_time_seconds %v -> %v: the driver restarted", a, b)
	}
	t.Logf("ephemera_refresh_total: ok +%v, failed +%v", refreshes(m1, "ok")-refreshes(m0, "ok"), refreshes(m1, "failed")-refreshes(m0, "failed"))

	// Cleanup: the pods' volumes unpublished, their cgroups gone.
	for _, p := range []*corev1.Pod{holder, hog} {
		c.deletePod(t, p, goneTimeout)
		c.cleanedUp(t, p, p.Spec.Volumes[0])
	}
	for _, cg := range []string{holderCg, hogCg} {
		if _, ok, _ := memoryCounter(cg, "memory.failcnt"); ok {
			t.Errorf("pod cgroup %s still exists after its pod is gone", cg)
		}
	}
	c.step("pod cgroup charging", t0)
}

// fallbackCharging is TestTwoNodes' check of node n, whose kubelet has pod
// cgroups off (cgroupsPerQOS: false): the driver (a chargeRig on n) finds no
// kubepods below its cgroup root and charges content in memory-backed
// volumes to itself, each such volume counted at its tmpfs's size.
//
//   - "Charging content in memory-backed volumes" mode volume-size,
//     ephemera_content_charging{mode="volume-size"} 1;
//   - a pod with a 10Mi tmpfs of genplugin's 4 MiB generations, keeping each
//     open: ephemera_content_held_bytes counts the volume at its size (not
//     at its content's) while it exists, and 0 once it is gone;
//   - its pages are the driver's (its memory cgroup's total_shmem grows by
//     about a generation per generation held), never more than the volume's
//     size;
//   - once the pod's old generations fill its tmpfs, its refresh is refused
//     (ResourceExhausted to the kubelet, ephemera_refresh_total{result=
//     "failed"}, a RefreshFailed event on the pod), its last good content
//     still in place.
func (c *cluster) fallbackCharging(t *testing.T, n *node) {
	t0 := time.Now()
	ctx := context.Background()
	if n.podCgroups {
		t.Fatalf("node %s runs with pod cgroups", n.name)
	}
	if _, err := os.Stat(filepath.Join(cgroupV1Mount("memory"), "kubepods")); err == nil {
		t.Fatalf("the host has a kubepods memory cgroup below /: node %s's driver (--kubelet-cgroup-root=/) would find another kubelet's pods", n.name)
	}
	r := c.startChargeRig(t, n)
	r.wantCharging(t, "volume-size")
	drvShmem0 := mustMemoryCounter(t, r.cgroup, "total_shmem")
	m0 := r.d.mustScrape(t)
	if v := m0.sum("ephemera_content_held_bytes", nil); v != 0 {
		t.Errorf("ephemera_content_held_bytes = %v before any volume, want 0", v)
	}
	since := r.d.logSize()

	const size = 10 * mib
	p := c.createPod(t, r.pod("fallback", 64*mib, "10Mi"))
	t.Cleanup(func() { c.deletePod(t, p, goneTimeout) })
	p = c.waitRunning(t, p, runningTimeout)
	h := volumeHandle(string(p.UID), "token")
	if p.Spec.NodeName != n.name {
		t.Fatalf("pod %s on %s, want %s", p.Name, p.Spec.NodeName, n.name)
	}
	waitHeld := func(k int) {
		t.Helper()
		err := waitFor(ctx, 20*time.Second, 100*time.Millisecond, fmt.Sprintf("pod %s holds %d generations", p.Name, k), func() (bool, error) {
			return len(r.held(t, p)) >= k, nil
		})
		if err != nil {
			t.Fatalf("%v\nevents:\n%s", err, c.podEvents(p))
		}
	}
	waitHeld(1)
	m1 := r.d.mustScrape(t)
	held1 := m1.sum("ephemera_content_held_bytes", nil)
	shmem1 := mustMemoryCounter(t, r.cgroup, "total_shmem")
	t.Logf("one generation: ephemera_content_held_bytes %v, the driver's total_shmem %d -> %d", held1, drvShmem0, shmem1)
	// What the kernel lets the volume's tmpfs hold: its size and its
	// inodes but the root's at 1 KiB each (content.InodeCharge), from statfs
	// of the mount; not what its content takes.
	volDir := filepath.Join(n.kubeletRoot, "pods", string(p.UID), "volumes", "kubernetes.io~csi", "token", "mount")
	var sfs syscall.Statfs_t
	if err := syscall.Statfs(volDir, &sfs); err != nil {
		t.Fatal(err)
	}
	fsSize := int64(sfs.Blocks) * sfs.Bsize
	if want := float64(fsSize + int64(sfs.Files-1)*1024); fsSize != size || held1 != want {
		t.Errorf("ephemera_content_held_bytes = %v with one volume holding %d bytes of content, whose tmpfs has %d bytes and %d inodes: want %v (its size, and its inodes but the root's at 1 KiB)", held1, genBytes, fsSize, sfs.Files, want)
	}
	if d := shmem1 - drvShmem0; d < genBytes || d > size+mib {
		t.Errorf("the driver's memory cgroup gained %d bytes of shmem for one generation of %d: want the driver charged it (no pod cgroup), within the volume's size", d, genBytes)
	}

	// A second generation fits beside the first, which the pod keeps; the
	// third does not: the pod's old files fill its own tmpfs.
	c.refresh(t, p, 1)
	waitHeld(2)
	shmem2 := mustMemoryCounter(t, r.cgroup, "total_shmem")
	t.Logf("two generations: the driver's total_shmem %d", shmem2)
	if d := shmem2 - drvShmem0; d < 2*genBytes || d > size+mib {
		t.Errorf("the driver's memory cgroup gained %d bytes of shmem for two generations of %d kept by the pod: want at least %d, and at most the volume's size", d, genBytes, 2*genBytes)
	}
	c.refresh(t, p, 2)
	err := waitFor(ctx, 30*time.Second, 200*time.Millisecond, "a republish of "+h+" answered ResourceExhausted", func() (bool, error) {
		return len(r.d.answeredLines(since, h, "ResourceExhausted")) > 0, nil
	})
	if err != nil {
		t.Fatalf("%v\nevents:\n%s", err, c.podEvents(p))
	}
	t.Logf("refused refresh: %s", r.d.answeredLines(since, h, "ResourceExhausted")[0])
	var refused string
	err = waitFor(ctx, 30*time.Second, 250*time.Millisecond, "a RefreshFailed event on pod "+p.Name, func() (bool, error) {
		evs := c.eventsWithReason(ctx, p, "RefreshFailed")
		if len(evs) > 0 {
			refused = evs[0]
		}
		return len(evs) > 0, nil
	})
	if err != nil {
		t.Errorf("%v\nevents:\n%s", err, c.podEvents(p))
	}
	t.Logf("RefreshFailed event: %q", refused)
	m2 := r.d.mustScrape(t)
	if d := refreshes(m2, "failed") - refreshes(m1, "failed"); d < 1 {
		t.Errorf("ephemera_refresh_total{result=\"failed\"} rose by %v, want >= 1", d)
	}
	if v := m2.sum("ephemera_content_held_bytes", nil); v != held1 {
		t.Errorf("ephemera_content_held_bytes = %v after the refused refresh, want %v (the volume at its size, once)", v, held1)
	}
	if shmem := mustMemoryCounter(t, r.cgroup, "total_shmem"); shmem-drvShmem0 > size+mib {
		t.Errorf("the driver's memory cgroup holds %d bytes of shmem more than before the pod: want at most the volume's size %d", shmem-drvShmem0, size)
	}
	if k := len(r.held(t, p)); k != 2 {
		t.Errorf("pod %s holds %d generations after the refused refresh, want 2", p.Name, k)
	}
	// The last good content is in place: the volume's token (on the node,
	// the mount the container has) is the second generation the pod holds.
	heldNow := r.held(t, p)
	b, err := os.ReadFile(filepath.Join(volDir, "token"))
	if err != nil {
		t.Fatal(err)
	}
	if head, _, _ := strings.Cut(string(b[:min(len(b), 200)]), "\n"); len(heldNow) == 2 && (head != heldNow[1].head || len(b) != genBytes) {
		t.Errorf("pod %s's token after the refused refresh: %d bytes, %q; want the last good generation %q", p.Name, len(b), head, heldNow[1].head)
	}

	c.deletePod(t, p, goneTimeout)
	if v := r.d.mustScrape(t).sum("ephemera_content_held_bytes", nil); v != 0 {
		t.Errorf("ephemera_content_held_bytes = %v once the volume is gone, want 0", v)
	}
	// With the pod gone (its descriptors closed) and the tmpfs unmounted,
	// the pages the driver paid for are freed.
	var shmemEnd int64
	err = waitFor(ctx, 10*time.Second, 100*time.Millisecond, "the driver's shmem freed with the volume", func() (bool, error) {
		shmemEnd = mustMemoryCounter(t, r.cgroup, "total_shmem")
		return shmemEnd-drvShmem0 < mib, nil
	})
	if err != nil {
		t.Errorf("%v: total_shmem %d, was %d before the pod", err, shmemEnd, drvShmem0)
	}
	t.Logf("fallback charging on %s checked in %v", n.name, time.Since(t0).Round(time.Millisecond))
}

// answeredLines returns the driver's log lines (from offset since) of the
// requests about the volume handle that were answered with an error: code's
// ("ResourceExhausted"), or any with code "". The framework logs a final
// refusal ("Request refused", V(2)) apart from a failure ("Request failed").
func (d *driver) answeredLines(since int64, handle, code string) []string {
	var out []string
	for _, l := range strings.Split(d.logSince(since), "\n") {
		if !strings.Contains(l, handle) || !strings.Contains(l, `"Request refused"`) && !strings.Contains(l, `"Request failed"`) {
			continue
		}
		if code == "" || strings.Contains(l, `code="`+code+`"`) {
			out = append(out, l)
		}
	}
	return out
}
