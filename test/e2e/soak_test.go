//go:build e2e && linux

package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/test/e2e/logind"
	"github.com/ephemera-csi/ephemera/test/internal/machine"
)

// The soak (issue 45): workloads churn through their real owners (Deployments
// scaled up and down, Jobs, a DaemonSet whose pod is deleted and made again)
// with inline volumes of every backend, beside a control Deployment with
// emptyDir{medium: Memory}, while a schedule of faults derived from one seed
// runs; invariants are checked every few seconds and at the end, and a report
// per phase (calm, each fault kind) is printed and written to
// _output/soak-report.md. See "The soak" in README.md.

const (
	soakNS = "soak"
	// soakCheckEvery is the period of the continuous invariant checks.
	soakCheckEvery = 3 * time.Second
	// soakPersist is how long a transient state (a mount of a pod both the API
	// server and the kubelet have forgotten, a record without storage, a file
	// without record) may last before it is a violation: the kubelet's
	// unpublish, the driver's orphan GC (--gc-interval=1s,
	// --orphan-grace-period=2s) and a publish in progress all pass through
	// such states for a moment.
	soakPersist = 20 * time.Second
	// soakRunningBound is how long a pod that should run may stay not Running
	// once its fault has cleared (or from its creation, if later).
	soakRunningBound = 2 * time.Minute
	// soakCleanBound: after the workloads are deleted and their pods gone,
	// nothing of them may be left on the node after this.
	soakCleanBound = 60 * time.Second
	// soakSlowDelay is how long the slow plugin's Create takes.
	soakSlowDelay = 15 * time.Second
	// soakMemoryPlan is the driver's RSS budget: the memory limit of the
	// shipped DaemonSet (docs/operations.md, "the memory plan").
	soakMemoryPlan = 320 << 20
	// soakSettle is the calm kept after a fault has cleared before the next.
	soakSettle = 3 * time.Second
)

// faultKind is one row of the fault table. inject performs the fault and
// returns once it has cleared (the component is back and serving); the
// schedule starts the next fault only after a calm gap. Faults that take
// long (the API server outage) have minSoak: they are scheduled only in soaks
// at least that long. New kinds (a graceful node shutdown, a driver upgrade or
// rollback) are new rows.
type faultKind struct {
	name    string
	minSoak time.Duration
	// after: the kind this one comes right after in every round (the
	// upgrade back after the rollback).
	after  string
	inject func(ctx context.Context, s *soak) error
}

func soakFaults() []faultKind {
	return []faultKind{
		{name: "driver-sigkill", inject: func(ctx context.Context, s *soak) error {
			s.d.kill9()
			time.Sleep(time.Second)
			return s.d.start(ctx)
		}},
		{name: "driver-restart", inject: func(ctx context.Context, s *soak) error {
			s.d.stop()
			// With the driver stopped its state file can be read: every
			// record has its storage, and every storage its record.
			s.checkRecordsStopped()
			return s.d.start(ctx)
		}},
		{name: "kubelet-restart", inject: func(ctx context.Context, s *soak) error {
			return s.c.restartKubelet(ctx)
		}},
		{name: "containerd-restart", inject: func(ctx context.Context, s *soak) error {
			if s.c.runtime != runtimeContainerd {
				return nil
			}
			// SIGTERM: the containers keep running under their shims.
			s.c.cri.stop(15 * time.Second)
			return s.c.startRuntime(ctx)
		}},
		{name: "apiserver-restart", inject: func(ctx context.Context, s *soak) error {
			return s.c.restartAPIServer(ctx, s.c.authzMode)
		}},
		{name: "plugin-crash", inject: func(ctx context.Context, s *soak) error {
			// The content plugin or the slow plugin, as the seed says.
			p := s.plugins[s.faultRNG.IntN(len(s.plugins))]
			s.logf("plugin-crash: SIGKILL %s", p.proc)
			p.p.kill()
			time.Sleep(3 * time.Second)
			return p.startWith(ctx, p.args...)
		}},
		{name: "apiserver-outage-2m", minSoak: 10 * time.Minute, inject: func(ctx context.Context, s *soak) error {
			s.c.apiserver.stop(2 * time.Second)
			time.Sleep(2 * time.Minute)
			return s.c.startAPIServer(ctx)
		}},
		{name: "plugin-hang", minSoak: 10 * time.Minute, inject: func(ctx context.Context, s *soak) error { return s.pluginHang(ctx) }},
		{name: "plugin-flap", inject: func(ctx context.Context, s *soak) error { return s.pluginFlap(ctx) }},
		{name: "state-dir-full", minSoak: 10 * time.Minute, inject: func(ctx context.Context, s *soak) error { return s.stateDirFull(ctx) }},
		{name: "node-reboot", minSoak: 10 * time.Minute, inject: func(ctx context.Context, s *soak) error { return s.nodeReboot(ctx) }},
		{name: "graceful-node-shutdown", minSoak: 10 * time.Minute, inject: func(ctx context.Context, s *soak) error { return s.gracefulNodeShutdown(ctx) }},
		// A pair: the rollback to test/e2e/upgrade-from's release, then (the
		// schedule puts it next) the upgrade back to this tree's driver.
		{name: "driver-rollback", minSoak: 10 * time.Minute, inject: func(ctx context.Context, s *soak) error {
			return s.swapDriver(ctx, true)
		}},
		{name: "driver-upgrade", minSoak: 10 * time.Minute, after: "driver-rollback", inject: func(ctx context.Context, s *soak) error {
			return s.swapDriver(ctx, false)
		}},
	}
}

// soakPlugin is a plugin process of the soak with the arguments it starts with.
type soakPlugin struct {
	*tokensPlugin
	args []string
}

// podTrack is what the soak knows of one pod of its workloads.
type podTrack struct {
	name, uid string
	control   bool   // the emptyDir control workload
	slow      bool   // has a volume of the slow plugin
	phase     string // the schedule's phase when it was created
	created   time.Time
	running   time.Time // first seen Running (or Succeeded)
	deleted   bool      // deleted, or being deleted
	// waitedAfter is the phase of the fault that had cleared while it was
	// not Running yet, and clearedAt when it did.
	waitedAfter string
	clearedAt   time.Time
	handles     []string // its inline volumes' handles
	// faultTime is the soak's faultTime when it appeared: the time spent in
	// faults since is not counted against its bound.
	faultTime time.Duration
}

type phaseStats struct {
	inline, control []time.Duration
	slow            []time.Duration    // pods with a volume of the slow plugin (its Create takes soakSlowDelay)
	waited          int                // pods that waited for their volume past the fault's clearing
	rpc             map[string]float64 // "method code" -> calls
	worstWait       time.Duration      // longest clear -> Running after this fault
	peakRSS         int64
	faults          int
}

type soak struct {
	t        *testing.T
	c        *cluster
	d        *driver
	seed     uint64
	faultRNG *rand.Rand
	churnRNG *rand.Rand
	plugins  []*soakPlugin
	kinds    []faultKind // the fault table of this soak
	// deployments: soakDeployments, and soakUsernsDeployment where the node
	// has user namespaces.
	deployments map[string]int

	stateFS                string         // the state dir's own filesystem (state-dir-full)
	logind                 *logind.Logind // the soak node's (graceful-node-shutdown)
	oldBin, curBin         string         // the drivers swapped by driver-rollback and driver-upgrade
	oldVersion, curVersion string         // their ephemera_build_info versions
	load                   []string       // /proc/loadavg at the start and the end of the churn
	churned                time.Duration  // the churn's length (the schedule may run past the soak's to fit its rounds)

	mu         sync.Mutex
	phase      string // "calm" or the fault in progress
	faultOn    bool
	lastClear  time.Time
	faultStart time.Time
	faultTime  time.Duration        // spent in faults, cleared ones
	pods       map[string]*podTrack // by UID
	stats      map[string]*phaseStats
	timeline   []string
	violations []string
	pending    map[string]time.Time // violation key -> first seen
	lastScrape scrape
	goroutines []float64 // go_goroutines at the end of each calm gap
	start      time.Time
}

func (s *soak) logf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	s.mu.Lock()
	s.timeline = append(s.timeline, fmt.Sprintf("%8s %s", time.Since(s.start).Round(time.Second), msg))
	s.mu.Unlock()
	s.c.logf("soak: %s", msg)
}

func (s *soak) phaseStats(p string) *phaseStats {
	ps := s.stats[p]
	if ps == nil {
		ps = &phaseStats{rpc: map[string]float64{}}
		s.stats[p] = ps
	}
	return ps
}

// fail records a violated invariant (the seed, the fault and the timeline are
// printed with all violations at the end; the first also fails at once).
func (s *soak) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	s.mu.Lock()
	s.violations = append(s.violations, fmt.Sprintf("[%v, phase %s] %s", time.Since(s.start).Round(time.Second), s.phase, msg))
	s.mu.Unlock()
	s.c.logf("soak: INVARIANT VIOLATED (seed %d): %s", s.seed, msg)
}

// persistent reports whether the transient state key, seen now, has lasted
// longer than bound (once: not again while it lasts); seen holds the keys of
// this check, to forget the others.
func (s *soak) persistent(key string, bound time.Duration, seen map[string]bool) bool {
	seen[key] = true
	s.mu.Lock()
	defer s.mu.Unlock()
	first, ok := s.pending[key]
	if !ok {
		s.pending[key] = time.Now()
		return false
	}
	if time.Since(first) <= bound {
		return false
	}
	// Reported once while it lasts.
	s.pending[key] = time.Now().Add(24 * time.Hour)
	return true
}

// TestSoak runs the soak for EPHEMERA_SOAK (a duration; skipped when unset).
// EPHEMERA_SOAK_SEED fixes the fault schedule and the churn (default: the
// time); the seed is always printed.
func TestSoak(t *testing.T) {
	dur, ok := os.LookupEnv("EPHEMERA_SOAK")
	if !ok || dur == "" {
		t.Skip("set EPHEMERA_SOAK to a duration (e.g. 3m) to run the soak: make soak")
	}
	length, err := time.ParseDuration(dur)
	if err != nil || length < time.Minute {
		t.Fatalf("EPHEMERA_SOAK=%q: want a duration of at least 1m", dur)
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("EPHEMERA_SOAK_SEED"); v != "" {
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("EPHEMERA_SOAK_SEED=%q: %v", v, err)
		}
	}
	t.Logf("soak: %v, seed %d (EPHEMERA_SOAK_SEED=%d reproduces the schedule)", length, seed, seed)
	c := clu
	d := requireDriver(t)
	ctx := context.Background()
	s := &soak{
		t: t, c: c, d: d, seed: seed,
		faultRNG: rand.New(rand.NewPCG(seed, 1)),
		churnRNG: rand.New(rand.NewPCG(seed, 2)),
		phase:    "calm", pods: map[string]*podTrack{}, stats: map[string]*phaseStats{},
		pending: map[string]time.Time{}, start: time.Now(),
	}
	if s.kinds, err = selectKinds(length); err != nil {
		t.Fatal(err)
	}
	s.deployments = maps.Clone(soakDeployments)
	s.setup(ctx)
	s.start = time.Now() // the soak's length counts from here
	defer func() {
		if t.Failed() && len(s.violations) == 0 { // violations print the timeline themselves
			t.Logf("soak failed: seed %d (EPHEMERA_SOAK_SEED=%d EPHEMERA_SOAK=%v)\ntimeline:\n%s", seed, seed, length, strings.Join(s.timeline, "\n"))
		}
	}()

	// Idle goroutines of the driver before any workload.
	if m, err := d.scrapeMetrics(ctx); err == nil {
		s.lastScrape = m
		s.goroutines = append(s.goroutines, m.sum("go_goroutines", nil))
	}

	stopInformer := s.watchPods(ctx)
	defer stopInformer()
	s.createWorkloads(ctx)

	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); s.monitor(runCtx) }()
	go func() { defer wg.Done(); s.churn(runCtx) }()

	s.runSchedule(ctx, length)
	cancel()
	wg.Wait()
	s.waitAllRunning(ctx)
	s.checkOnce(ctx)
	s.scrapeInto("calm")

	s.teardownWorkloads(ctx)
	s.finalChecks(ctx)
	report := s.report(length)
	fmt.Fprintln(os.Stderr, report)
	if out := os.Getenv("EPHEMERA_SOAK_REPORT"); out != "" {
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err == nil {
			if err := os.WriteFile(out, []byte(report), 0o644); err != nil {
				t.Errorf("write report: %v", err)
			} else {
				t.Logf("report written to %s", out)
			}
		}
	}
	if len(s.violations) > 0 {
		t.Errorf("soak seed %d: %d invariant violations:\n%s\ntimeline:\n%s", seed, len(s.violations),
			strings.Join(s.violations, "\n"), strings.Join(s.timeline, "\n"))
	}
}

// setup starts the content plugin (genplugin, refreshed: the CSIDriver gets
// requiresRepublish) and the slow plugin, and gives the shared driver both.
func (s *soak) setup(ctx context.Context) {
	t, c, d := s.t, s.c, s.d
	dir := filepath.Join(c.root, "soak")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct{ name, pkg string }{{"genplugin", "./test/e2e/genplugin"}, {"slowplugin", "./test/e2e/slowplugin"}} {
		bin := filepath.Join(c.root, "bin", p.name)
		if _, err := os.Stat(bin); err != nil {
			if err := c.goBuildIn(ctx, c.repoRoot, bin, p.pkg); err != nil {
				t.Fatal(err)
			}
		}
	}
	gen := &soakPlugin{tokensPlugin: &tokensPlugin{c: c, bin: filepath.Join(c.root, "bin", "genplugin"), proc: "plugin-soak-gen",
		endpoint: "unix://" + filepath.Join(dir, "gen.sock")}, args: []string{"--bytes=4096"}}
	slow := &soakPlugin{tokensPlugin: &tokensPlugin{c: c, bin: filepath.Join(c.root, "bin", "slowplugin"), proc: "plugin-soak-slow",
		endpoint: "unix://" + filepath.Join(dir, "slow.sock")}, args: []string{"--delay=" + soakSlowDelay.String()}}
	s.plugins = []*soakPlugin{gen, slow}
	for _, p := range s.plugins {
		if err := p.startWith(ctx, p.args...); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.p.stop(10 * time.Second) })
	}

	cur, err := c.cs.StorageV1().CSIDrivers().Get(ctx, driverName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.RequiresRepublish = ptrTo(true)
	if _, err := c.cs.StorageV1().CSIDrivers().Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("CSIDriver requiresRepublish: %v", err)
	}
	t.Cleanup(func() {
		if err := c.applyCSIDriver(context.Background()); err != nil {
			t.Errorf("restore CSIDriver: %v", err)
		}
	})

	// The driver with the plugins, also across the faults' restarts (start
	// uses d.extra); the ordinary driver is put back at the end.
	saved, savedBin := d.extra, d.bin
	d.extra = append(append([]string(nil), saved...), "--plugin=gen="+gen.endpoint, "--plugin=slow="+slow.endpoint)
	if s.scheduled("driver-rollback") {
		// The build of test/e2e/upgrade-from's commit (TestDriverUpgradeRollback's,
		// cached), its linux/amd64 binary beside its image.
		rel := upgradeFromImage(t)
		s.oldBin = filepath.Join(filepath.Dir(rel.img.layout), "ephemera-scratch")
		s.oldVersion = rel.version
		s.curBin = d.bin
	}
	d.stop()
	var undoStateFS func()
	if s.scheduled("state-dir-full") {
		// A full node disk then fails the publish, not the pod's writes into
		// a loop volume (docs/operations.md).
		d.extra = append(d.extra, "--loop-preallocate")
		var err error
		if undoStateFS, err = s.setupStateFS(ctx); err != nil {
			t.Fatalf("state-dir-full: %v", err)
		}
	}
	t.Cleanup(func() {
		d.stop()
		if undoStateFS != nil {
			undoStateFS()
		}
		d.extra, d.bin, d.dropFlags = saved, savedBin, nil
		if err := d.start(context.Background()); err != nil {
			t.Errorf("restart the driver without the soak's plugins: %v", err)
		}
	})
	if err := d.start(ctx); err != nil {
		t.Fatal(err)
	}
	if m, err := d.scrapeMetrics(ctx); err == nil {
		for _, x := range m {
			if x.name == "ephemera_build_info" {
				s.curVersion = x.labels["version"]
			}
		}
	}
	if s.scheduled("graceful-node-shutdown") {
		undo, err := s.setupShutdown(ctx)
		if err != nil {
			t.Fatalf("graceful-node-shutdown on the soak's node: %v", err)
		}
		t.Cleanup(undo)
	}
	if why := s.setupUserns(ctx); why != "" {
		s.logf("no hostUsers: false workload: %s", why)
	} else {
		s.deployments[soakUsernsDeployment] = 2
	}
	var names []string
	for _, k := range s.kinds {
		names = append(names, k.name)
	}
	s.logf("fault kinds: %v; driver %s%s", names, s.curVersion, map[bool]string{true: ", rollback to " + s.oldVersion + " (" + s.oldBin + ")"}[s.oldBin != ""])
	if err := c.ensureNamespace(ctx, soakNS); err != nil {
		t.Fatal(err)
	}
}

// soakPodSpec is a pod of the soak's workloads: vols mounted at /v/<name>,
// the container writing a file in each writable one, then pausing (or
// sleeping, for a Job).
func (s *soak) soakPodSpec(labels map[string]string, vols []corev1.Volume, job bool) corev1.PodTemplateSpec {
	last := st("pause")
	if job {
		last = st("sleep", "5")
	}
	var args [][]string
	var mounts []corev1.VolumeMount
	for _, v := range vols {
		ro := v.CSI != nil && v.CSI.ReadOnly != nil && *v.CSI.ReadOnly
		mounts = append(mounts, corev1.VolumeMount{Name: v.Name, MountPath: "/v/" + v.Name, ReadOnly: ro})
		if !ro {
			args = append(args, st("write", "/v/"+v.Name+"/f", "4096"))
		}
	}
	args = append(args, last)
	p := s.c.newPod(soakNS, "x", vols[0], steps(args...))
	p.Spec.Volumes = vols
	p.Spec.Containers[0].VolumeMounts = mounts
	p.Spec.RestartPolicy = corev1.RestartPolicyAlways
	if job {
		p.Spec.RestartPolicy = corev1.RestartPolicyNever
	}
	for k, v := range labels {
		p.Labels[k] = v
	}
	return corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: p.Labels}, Spec: p.Spec}
}

func roVol(v corev1.Volume) corev1.Volume {
	v.CSI.ReadOnly = ptrTo(true)
	return v
}

// The workloads: name -> the template's volumes.
func soakVolumes() map[string][]corev1.Volume {
	return map[string][]corev1.Volume{
		"mixed": {tmpfsVolume("tmp", "8Mi"), csiVolume("ext4", map[string]string{"backend": "loop", "size": "32Mi", "fsType": "ext4"}),
			csiVolume("dir", map[string]string{"backend": "dir"}), roVol(csiVolume("gen", map[string]string{"backend": "gen", "size": "1Mi"}))},
		"xfs":     {csiVolume("xfs", map[string]string{"backend": "loop", "size": "300Mi", "fsType": "xfs"}), roVol(tmpfsVolume("ro", "1Mi"))},
		"slow":    {csiVolume("slow", map[string]string{"backend": "slow", "size": "1Mi"}), tmpfsVolume("tmp", "1Mi")},
		"control": {memoryEmptyDir("m1"), memoryEmptyDir("m2")},
		// user 1000, group 2000, fsGroup 3000 in the pod's user namespace.
		soakUsernsDeployment: {tmpfsVolume("tmp", "2Mi"), csiVolume("dir", map[string]string{"backend": "dir"}),
			roVol(csiVolume("gen", map[string]string{"backend": "gen", "size": "1Mi"}))},
	}
}

// soakDeployments are the Deployments and their largest scale
// (soakUsernsDeployment joins them where the node has user namespaces).
var soakDeployments = map[string]int{"mixed": 4, "xfs": 2, "slow": 2, "control": 4}

// soakUsernsDeployment: pods with hostUsers: false (their volumes ID-mapped
// by the runtime) through the RuntimeClass usernsHandler, up to 2.
const soakUsernsDeployment = "userns"

// deploymentNames are the soak's Deployments, sorted.
func (s *soak) deploymentNames() []string {
	names := make([]string, 0, len(s.deployments))
	for n := range s.deployments {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func (s *soak) createWorkloads(ctx context.Context) {
	t, c := s.t, s.c
	vols := soakVolumes()
	names := s.deploymentNames()
	for _, n := range names {
		labels := map[string]string{"soak": n}
		if n != "control" {
			labels["fsgroup"] = "yes"
		}
		tmpl := s.soakPodSpec(labels, vols[n], false)
		if n == "mixed" {
			tmpl.Spec.SecurityContext = &corev1.PodSecurityContext{FSGroup: ptrTo(int64(2000))}
		}
		if n == soakUsernsDeployment {
			// The API server refuses hostNetwork with hostUsers: false: the
			// node's pod network (writePodNetwork).
			tmpl.Spec.HostNetwork = false
			tmpl.Spec.HostUsers = ptrTo(false)
			tmpl.Spec.RuntimeClassName = ptrTo(usernsHandler)
			tmpl.Spec.SecurityContext = &corev1.PodSecurityContext{
				RunAsUser: ptrTo(int64(usernsUID)), RunAsGroup: ptrTo(int64(usernsGID)), FSGroup: ptrTo(int64(usernsFSGroup)),
			}
		}
		dep := &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: "soak-" + n, Namespace: soakNS},
			Spec: appsv1.DeploymentSpec{
				Replicas: ptrTo(int32(1)),
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"soak": n}},
				Template: tmpl,
			},
		}
		if _, err := c.cs.AppsV1().Deployments(soakNS).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create Deployment %s: %v", dep.Name, err)
		}
	}
	// The DaemonSet: bound by the scheduler (no nodeName in its template).
	tmpl := s.soakPodSpec(map[string]string{"soak": "ds"}, []corev1.Volume{tmpfsVolume("tmp", "4Mi"), roVol(csiVolume("gen", map[string]string{"backend": "gen", "size": "1Mi"}))}, false)
	tmpl.Spec.NodeName = ""
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "soak-ds", Namespace: soakNS},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"soak": "ds"}},
			Template: tmpl,
		},
	}
	if _, err := c.cs.AppsV1().DaemonSets(soakNS).Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create DaemonSet: %v", err)
	}
	s.logf("workloads created: Deployments %v (scale up to %v), DaemonSet soak-ds", names, s.deployments)
}

// churn scales the Deployments, starts Jobs and deletes the DaemonSet's pod,
// one action every 3-8 s (seeded); errors (an API server down) are logged.
func (s *soak) churn(ctx context.Context) {
	names := s.deploymentNames()
	jobs := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(3000+s.churnRNG.IntN(5000)) * time.Millisecond):
		}
		var err error
		var what string
		switch a := s.churnRNG.IntN(10); {
		case a < 6:
			n := names[s.churnRNG.IntN(len(names))]
			r := int32(s.churnRNG.IntN(s.deployments[n] + 1))
			what = fmt.Sprintf("scale soak-%s to %d", n, r)
			_, err = s.c.cs.AppsV1().Deployments(soakNS).UpdateScale(ctx, "soak-"+n, &autoscalingv1.Scale{
				ObjectMeta: metav1.ObjectMeta{Name: "soak-" + n, Namespace: soakNS}, Spec: autoscalingv1.ScaleSpec{Replicas: r}}, metav1.UpdateOptions{})
			if err != nil && apierrors.IsConflict(err) {
				err = nil
			}
		case a < 9:
			jobs++
			what = fmt.Sprintf("job soak-job-%d", jobs)
			err = s.createJob(ctx, fmt.Sprintf("soak-job-%d", jobs))
			s.deleteFinishedJobs(ctx)
		default:
			what = "delete the DaemonSet's pod"
			err = s.c.cs.CoreV1().Pods(soakNS).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "soak=ds"})
		}
		if err != nil {
			s.c.logf("soak churn: %s: %v", what, err)
		} else {
			s.c.logf("soak churn: %s", what)
		}
	}
}

func (s *soak) createJob(ctx context.Context, name string) error {
	tmpl := s.soakPodSpec(map[string]string{"soak": "job"},
		[]corev1.Volume{tmpfsVolume("tmp", "2Mi"), csiVolume("dir", map[string]string{"backend": "dir"})}, true)
	j := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: soakNS},
		Spec: batchv1.JobSpec{
			Completions: ptrTo(int32(2)), Parallelism: ptrTo(int32(2)), BackoffLimit: ptrTo(int32(6)),
			Template: tmpl,
		},
	}
	_, err := s.c.cs.BatchV1().Jobs(soakNS).Create(ctx, j, metav1.CreateOptions{})
	return err
}

func (s *soak) deleteFinishedJobs(ctx context.Context) {
	list, err := s.c.cs.BatchV1().Jobs(soakNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	bg := metav1.DeletePropagationBackground
	for _, j := range list.Items {
		if j.Status.Succeeded >= 2 || j.Status.Failed > 0 {
			_ = s.c.cs.BatchV1().Jobs(soakNS).Delete(ctx, j.Name, metav1.DeleteOptions{PropagationPolicy: &bg})
		}
	}
}

// watchPods follows the soak's pods through an informer: when each appeared
// (its create time), when it was first Running, when it was deleted.
func (s *soak) watchPods(ctx context.Context) func() {
	f := informers.NewSharedInformerFactoryWithOptions(s.c.cs, 0, informers.WithNamespace(soakNS))
	inf := f.Core().V1().Pods().Informer()
	update := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if !ok {
			return
		}
		now := time.Now()
		s.mu.Lock()
		defer s.mu.Unlock()
		pt := s.pods[string(p.UID)]
		if pt == nil {
			created := now
			// Seen late (a relist after the API server was away): its
			// creation time, to the second.
			if ct := p.CreationTimestamp.Time; now.Sub(ct) > 2*time.Second {
				created = ct
			}
			pt = &podTrack{name: p.Name, uid: string(p.UID), control: p.Labels["soak"] == "control",
				slow: p.Labels["soak"] == "slow", phase: s.phase, created: created, faultTime: s.faultTime}
			for _, v := range p.Spec.Volumes {
				if v.CSI != nil {
					pt.handles = append(pt.handles, volumeHandle(pt.uid, v.Name))
				}
			}
			s.pods[pt.uid] = pt
		}
		if p.DeletionTimestamp != nil {
			pt.deleted = true
		}
		if pt.running.IsZero() && (p.Status.Phase == corev1.PodRunning || p.Status.Phase == corev1.PodSucceeded) {
			pt.running = now
			ps := s.phaseStats(pt.phase)
			switch {
			case pt.control:
				ps.control = append(ps.control, now.Sub(pt.created))
			case pt.slow:
				ps.slow = append(ps.slow, now.Sub(pt.created))
			default:
				ps.inline = append(ps.inline, now.Sub(pt.created))
			}
			if pt.waitedAfter != "" {
				wps := s.phaseStats(pt.waitedAfter)
				wps.waited++
				if w := now.Sub(pt.clearedAt); w > wps.worstWait {
					wps.worstWait = w
				}
			}
		}
		if p.Status.Phase == corev1.PodFailed {
			pt.deleted = true // a Job's failed pod: the Job makes another
		}
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    update,
		UpdateFunc: func(_, o any) { update(o) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok {
				s.mu.Lock()
				if pt := s.pods[string(p.UID)]; pt != nil {
					pt.deleted = true
				}
				s.mu.Unlock()
			}
		},
	})
	stop := make(chan struct{})
	f.Start(stop)
	cache.WaitForCacheSync(stop, inf.HasSynced)
	return func() { close(stop); f.Shutdown() }
}

// soakRoundsFor is how many rounds of the fault table a soak of this length
// runs at least: one per 6 minutes (a 30-minute soak: 5, every kind at least
// 5 times), one for a shorter one. The schedule runs on past the soak's
// length to finish them.
func soakRoundsFor(length time.Duration) int {
	return max(1, int(length/(6*time.Minute)))
}

// runSchedule alternates calm gaps with faults: rounds of the fault table
// shuffled by the seed (a kind with after right behind that one), each kind
// once per round. It runs soakRoundsFor(length) rounds, the gaps sized to end
// them at the soak's length (2-25 s, seeded jitter; shorter than 2 s never:
// the schedule then runs past the length), then more rounds while time is
// left.
func (s *soak) runSchedule(ctx context.Context, length time.Duration) {
	kinds := s.kinds
	rounds := soakRoundsFor(length)
	end := s.start.Add(length)
	s.load = append(s.load, machine.LoadAvg())
	defer func() {
		s.churned = time.Since(s.start)
		s.load = append(s.load, machine.LoadAvg())
	}()
	// A first calm: the workloads start.
	first := time.Now().Add(20 * time.Second)
	if first.After(end) {
		first = end
	}
	s.sleepUntil(first)
	done := 0
	var spent time.Duration // in faults and their settle
	for round := 0; ; round++ {
		if round >= rounds && time.Now().After(end) {
			return
		}
		order := s.roundOrder(kinds)
		for _, k := range order {
			left := rounds*len(kinds) - done
			gap := 2 * time.Second
			if left > 0 {
				// Less what a fault and its settle take: the mean so far,
				// weighed with a prior of 20 s for 5 faults (the first
				// faults alone would say little: a SIGKILL takes 3 s, the
				// outage 2 minutes).
				per := time.Until(end)/time.Duration(left) - (spent+5*20*time.Second)/time.Duration(done+5)
				gap = min(max(per, 2*time.Second), 25*time.Second)
			} else {
				gap = time.Duration(10+s.faultRNG.IntN(16)) * time.Second
				if time.Until(end) < gap+20*time.Second {
					s.sleepUntil(end)
					return
				}
			}
			// Seeded jitter: 75-125 %.
			gap = gap * time.Duration(75+s.faultRNG.IntN(51)) / 100
			s.sleepUntil(time.Now().Add(gap))
			t0 := time.Now()
			if !s.inject(ctx, k) {
				s.sleepUntil(end)
				return
			}
			done++
			spent += time.Since(t0)
		}
	}
}

// roundOrder is the fault table shuffled by the seed, each kind with after
// moved right behind that kind.
func (s *soak) roundOrder(kinds []faultKind) []faultKind {
	var order, later []faultKind
	for _, i := range s.faultRNG.Perm(len(kinds)) {
		if kinds[i].after != "" {
			later = append(later, kinds[i])
		} else {
			order = append(order, kinds[i])
		}
	}
	for _, k := range later {
		at := slices.IndexFunc(order, func(o faultKind) bool { return o.name == k.after })
		order = slices.Insert(order, at+1, k)
	}
	return order
}

// inject runs one fault: the burst, the fault, its settle; false when it did
// not clear (a violation; the schedule ends).
func (s *soak) inject(ctx context.Context, k faultKind) bool {
	s.scrapeInto("calm")
	s.mu.Lock()
	if m := s.lastScrape; m != nil {
		s.goroutines = append(s.goroutines, m.sum("go_goroutines", nil))
	}
	s.mu.Unlock()
	s.burst(ctx)
	s.mu.Lock()
	s.phase, s.faultOn, s.faultStart = k.name, true, time.Now()
	s.phaseStats(k.name).faults++
	s.mu.Unlock()
	s.logf("fault %s: inject", k.name)
	t0 := time.Now()
	fctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	err := k.inject(fctx, s)
	cancel()
	if err != nil {
		s.fail("fault %s did not clear: %v", k.name, err)
		return false
	}
	now := time.Now()
	s.mu.Lock()
	s.faultOn, s.lastClear = false, now
	s.faultTime += now.Sub(s.faultStart)
	for _, pt := range s.pods {
		if pt.running.IsZero() && !pt.deleted {
			pt.waitedAfter, pt.clearedAt = k.name, now
		}
	}
	s.mu.Unlock()
	s.logf("fault %s: cleared after %v", k.name, now.Sub(t0).Round(100*time.Millisecond))
	// The pods it held up start; then the phase ends.
	s.sleepUntil(time.Now().Add(soakSettle))
	s.scrapeInto(k.name)
	s.mu.Lock()
	s.phase = "calm"
	s.mu.Unlock()
	return true
}

func (s *soak) sleepUntil(t time.Time) {
	if d := time.Until(t); d > 0 {
		time.Sleep(d)
	}
}

// scrapeInto adds the driver's NodePublishVolume and NodeUnpublishVolume
// calls (by code) since the last scrape to phase p; a restarted driver's
// counters start again from zero.
func (s *soak) scrapeInto(p string) {
	m, err := s.d.scrapeMetrics(context.Background())
	if err != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	prev := s.lastScrape
	restarted := prev == nil || prev.sum("process_start_time_seconds", nil) != m.sum("process_start_time_seconds", nil)
	ps := s.phaseStats(p)
	for _, x := range m {
		if x.name != "ephemera_rpc_duration_seconds_count" {
			continue
		}
		meth := x.labels["method"]
		if meth != "NodePublishVolume" && meth != "NodeUnpublishVolume" {
			continue
		}
		v := x.value
		if !restarted {
			v -= prev.sum(x.name, x.labels)
		}
		if v > 0 {
			ps.rpc[meth+" "+x.labels["code"]] += v
		}
	}
	s.lastScrape = m
}

// monitor checks the invariants every soakCheckEvery.
func (s *soak) monitor(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(soakCheckEvery):
		}
		s.checkOnce(ctx)
	}
}

// kubeletPods is the UIDs of the pods the kubelet knows (its /pods).
func (s *soak) kubeletPods(ctx context.Context) (map[string]bool, error) {
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("https://127.0.0.1:%d/pods", s.c.kubeletPort), nil)
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var list corev1.PodList
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, p := range list.Items {
		out[string(p.UID)] = true
	}
	return out, nil
}

func (s *soak) checkOnce(ctx context.Context) {
	seen := map[string]bool{}
	defer func() {
		s.mu.Lock()
		for k := range s.pending {
			if !seen[k] {
				delete(s.pending, k)
			}
		}
		s.mu.Unlock()
	}()
	podsDir := filepath.Join(s.c.kubeletRoot, "pods")
	mounts := mountsUnder(podsDir)

	// 1. Never two mounts at one target (one volume).
	at := map[string]int{}
	for _, m := range mounts {
		at[m.MountPoint]++
	}
	for mp, n := range at {
		if n > 1 && s.persistent("double "+mp, soakCheckEvery, seen) {
			s.fail("%d mounts stacked at %s", n, mp)
		}
	}
	// A loop backing file bound to one device at most.
	files, _ := filepath.Glob(filepath.Join(s.d.stateDir, "loop", "*.img"))
	for _, f := range files {
		if devs := loopDevicesOf(f); len(devs) > 1 && s.persistent("loops "+f, soakCheckEvery, seen) {
			s.fail("backing file %s bound to %d loop devices: %v", f, len(devs), devs)
		}
	}

	// 2. Every mount below the pods dir belongs to a pod the API server or
	// the kubelet knows.
	known := map[string]bool{}
	if list, err := s.c.cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{}); err == nil {
		for _, p := range list.Items {
			known[string(p.UID)] = true
		}
	} else {
		known = nil // the API server is away: only the kubelet's word
	}
	kp, kerr := s.kubeletPods(ctx)
	if known != nil || kerr == nil {
		for _, m := range mounts {
			uid := s.podOfTarget(m.MountPoint)
			if (known != nil && known[uid]) || kp[uid] || (known == nil || kerr != nil) && !s.faultQuiet() {
				continue
			}
			if s.persistent("orphan "+m.MountPoint, soakPersist, seen) {
				s.fail("mount %s (%s) belongs to pod %s, which neither the API server nor the kubelet knows, for more than %v", m.MountPoint, m.FSType, uid, soakPersist)
			}
		}
	}

	// 3. Records and storage, as the running driver lists them.
	if list, err := s.d.volumeList(ctx); err == nil {
		s.checkRecords(list.Volumes, seen)
	}

	// 4. Pods that should run do, within the bound, the time spent in faults
	// since they appeared not counted.
	s.mu.Lock()
	var late []string
	if !s.faultOn {
		for _, pt := range s.pods {
			if w := s.overdue(pt); w > 0 {
				late = append(late, fmt.Sprintf("%s not Running %v after its creation (%v of it outside faults)",
					pt.name, time.Since(pt.created).Round(time.Second), w.Round(time.Second)))
				pt.deleted = true // reported once
			}
		}
	}
	s.mu.Unlock()
	for _, l := range late {
		s.fail("pod %s", l)
	}
	// Our volumes are valid: no publish may be answered with a final code.
	if m, err := s.d.scrapeMetrics(ctx); err == nil {
		for _, x := range m {
			if x.name == "ephemera_rpc_duration_seconds_count" && x.labels["method"] == "NodePublishVolume" &&
				x.labels["code"] != "OK" && !transientCodes[x.labels["code"]] && x.value > 0 &&
				s.persistent("final "+x.labels["code"], 0, seen) {
				s.fail("%v NodePublishVolume calls answered %s (a final code: the kubelet gives up on the volume); see the driver log", x.value, x.labels["code"])
			}
		}
	}

	// 5. The driver's memory.
	if s.d.p != nil && !s.d.p.exited() {
		if rss := procRSS(s.d.p.cmd.Process.Pid); rss > 0 {
			s.mu.Lock()
			ps := s.phaseStats(s.phase)
			if rss > ps.peakRSS {
				ps.peakRSS = rss
			}
			s.mu.Unlock()
			if rss > soakMemoryPlan {
				s.fail("driver RSS %d MiB over its plan of %d MiB", rss>>20, soakMemoryPlan>>20)
			}
		}
	}
}

// overdue is how long the pod (not Running, not deleted) has waited past its
// bound, outside faults; 0 when it is not overdue. s.mu is held.
func (s *soak) overdue(pt *podTrack) time.Duration {
	if pt.deleted || !pt.running.IsZero() {
		return 0
	}
	bound := soakRunningBound
	if pt.slow {
		bound += soakSlowDelay
	}
	waited := time.Since(pt.created) - (s.faultTime - pt.faultTime)
	if waited > bound {
		return waited
	}
	return 0
}

// burst deletes a pod each of the mixed, control and DaemonSet workloads as a
// fault starts: their owners make new ones while it lasts, so every fault
// has pods of its own to measure.
func (s *soak) burst(ctx context.Context) {
	for _, sel := range []string{"soak=mixed", "soak=control", "soak=ds"} {
		list, err := s.c.cs.CoreV1().Pods(soakNS).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil || len(list.Items) == 0 {
			continue
		}
		p := list.Items[s.faultRNG.IntN(len(list.Items))]
		_ = s.c.cs.CoreV1().Pods(soakNS).Delete(ctx, p.Name, metav1.DeleteOptions{})
	}
}

// waitAllRunning, at the end of the churn: every pod that should run runs,
// within its bound.
func (s *soak) waitAllRunning(ctx context.Context) {
	err := waitFor(ctx, soakRunningBound+soakSlowDelay, time.Second, "every pod of the soak Running", func() (bool, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		var late []string
		for _, pt := range s.pods {
			if w := s.overdue(pt); w > 0 {
				late = append(late, fmt.Sprintf("%s not Running after %v (outside faults)", pt.name, w.Round(time.Second)))
				pt.deleted = true
			}
		}
		if len(late) > 0 {
			return false, stop(fmt.Errorf("%s", strings.Join(late, "; ")))
		}
		for _, pt := range s.pods {
			if !pt.deleted && pt.running.IsZero() {
				return false, fmt.Errorf("%s not Running yet", pt.name)
			}
		}
		return true, nil
	})
	if err != nil {
		s.fail("at the end of the churn: %v", err)
	}
}

// faultQuiet: true when no fault is on (used to tolerate a missing view
// during one).
func (s *soak) faultQuiet() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.faultOn
}

// storageOf lists the driver's storage: the dir backend's directories and
// the loop backend's backing files, by volume ID.
func (s *soak) storageOf() map[string]string {
	out := map[string]string{}
	if es, err := os.ReadDir(filepath.Join(s.d.stateDir, "volumes")); err == nil {
		for _, e := range es {
			if e.IsDir() {
				out[e.Name()] = filepath.Join(s.d.stateDir, "volumes", e.Name())
			}
		}
	}
	files, _ := filepath.Glob(filepath.Join(s.d.stateDir, "loop", "*.img"))
	for _, f := range files {
		out[strings.TrimSuffix(filepath.Base(f), ".img")] = f
	}
	return out
}

// checkRecords: every Published record of a dir or loop volume has its
// storage (and its target mounted), and every storage its record.
func (s *soak) checkRecords(vols []api.VolumeInfo, seen map[string]bool) {
	storage := s.storageOf()
	recs := map[string]bool{}
	for _, v := range vols {
		recs[v.VolumeID] = true
		if v.Phase != "Published" {
			continue
		}
		if (v.Backend == "dir" || v.Backend == "loop") && storage[v.VolumeID] == "" && s.persistent("nostorage "+v.VolumeID, soakPersist, seen) {
			s.fail("record %s (%s, Published) has no storage", v.VolumeID, v.Backend)
		}
		if !v.Mounted && s.persistent("unmounted "+v.VolumeID, soakPersist, seen) {
			s.fail("record %s (%s, Published) whose target %s is not mounted", v.VolumeID, v.Backend, v.TargetPath)
		}
	}
	for id, path := range storage {
		if !recs[id] && s.persistent("norecord "+id, soakPersist, seen) {
			s.fail("storage %s has no record", path)
		}
	}
}

// checkRecordsStopped is the same check on the state file itself, with the
// driver stopped (driver-restart): storage without a record, a record of a
// dir or loop volume without storage.
func (s *soak) checkRecordsStopped() {
	keys, err := s.d.stateRecords()
	if err != nil {
		s.fail("read the driver's state with it stopped: %v", err)
		return
	}
	storage := s.storageOf()
	recs := map[string]bool{}
	for _, k := range keys {
		if h := handleRE.FindString(k); h != "" {
			recs[h] = true
		}
	}
	for id, path := range storage {
		if !recs[id] {
			s.fail("with the driver stopped: storage %s has no record in state.db (%d records)", path, len(keys))
		}
	}
	s.logf("driver stopped: state.db has %d records, %d dir/loop storages, all matched", len(keys), len(storage))
}

// procRSS is VmRSS of pid in bytes (0 if unknown).
func procRSS(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// teardownWorkloads deletes the Deployments, Jobs and the DaemonSet (the
// garbage collector deletes their pods) and waits until every pod is gone.
func (s *soak) teardownWorkloads(ctx context.Context) {
	c := s.c
	bg := metav1.DeletePropagationBackground
	t0 := time.Now()
	for n := range s.deployments {
		_ = c.cs.AppsV1().Deployments(soakNS).Delete(ctx, "soak-"+n, metav1.DeleteOptions{PropagationPolicy: &bg})
	}
	_ = c.cs.AppsV1().DaemonSets(soakNS).Delete(ctx, "soak-ds", metav1.DeleteOptions{PropagationPolicy: &bg})
	_ = c.cs.BatchV1().Jobs(soakNS).DeleteCollection(ctx, metav1.DeleteOptions{PropagationPolicy: &bg}, metav1.ListOptions{})
	err := waitFor(ctx, 3*time.Minute, 500*time.Millisecond, "every pod of the soak gone", func() (bool, error) {
		list, err := c.cs.CoreV1().Pods(soakNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		if len(list.Items) > 0 {
			return false, fmt.Errorf("%d left, e.g. %s", len(list.Items), list.Items[0].Name)
		}
		return true, nil
	})
	if err != nil {
		s.fail("workloads deleted: %v", err)
		return
	}
	s.logf("workloads deleted, every pod gone in %v", time.Since(t0).Round(time.Second))
}

// finalChecks: within soakCleanBound of the pods being gone, nothing of them
// is left: no mount below the pods dir, no loop device on a backing file of
// the driver, no dir or loop storage, no pod directory, no mount left by the
// slow plugin; then, with the driver stopped, no record.
func (s *soak) finalChecks(ctx context.Context) {
	podsDir := filepath.Join(s.c.kubeletRoot, "pods")
	pluginDir := filepath.Join(s.c.root, "soak")
	var left []string
	err := waitFor(ctx, soakCleanBound, time.Second, "nothing of the soak's pods left on the node", func() (bool, error) {
		left = left[:0]
		for _, m := range append(mountsUnder(podsDir), mountsUnder(pluginDir)...) {
			left = append(left, "mount "+m.MountPoint)
		}
		files, _ := filepath.Glob(filepath.Join(s.d.stateDir, "loop", "*.img"))
		for _, f := range files {
			left = append(left, "backing file "+f)
			for _, dev := range loopDevicesOf(f) {
				left = append(left, "loop device "+dev)
			}
		}
		for _, p := range s.storageOf() {
			if !strings.HasSuffix(p, ".img") {
				left = append(left, "dir "+p)
			}
		}
		s.mu.Lock()
		for _, pt := range s.pods {
			if _, err := os.Lstat(filepath.Join(podsDir, pt.uid)); err == nil {
				left = append(left, "pod directory of "+pt.name)
			}
		}
		s.mu.Unlock()
		if len(left) > 0 {
			return false, fmt.Errorf("%d left: %v", len(left), left[:min(len(left), 5)])
		}
		return true, nil
	})
	if err != nil {
		s.fail("after the workloads: %v", err)
	}
	if m, err := s.d.scrapeMetrics(ctx); err == nil {
		s.mu.Lock()
		s.goroutines = append(s.goroutines, m.sum("go_goroutines", nil))
		g := s.goroutines
		s.mu.Unlock()
		// Flat: with no volume left, the driver has about the goroutines it
		// had idle before the workloads (refreshers, informers and gRPC
		// streams of the gone volumes are gone).
		if len(g) >= 2 && g[len(g)-1] > g[0]*1.25+10 {
			s.fail("driver goroutines %v idle at the start, %v with no volume left at the end (samples %v)", g[0], g[len(g)-1], g)
		}
	}
	s.d.withDriverStopped(s.t, func() {
		keys, err := s.d.stateRecords()
		if err != nil {
			s.fail("read state.db: %v", err)
			return
		}
		mine := map[string]bool{}
		s.mu.Lock()
		for _, pt := range s.pods {
			for _, h := range pt.handles {
				mine[h] = true
			}
		}
		s.mu.Unlock()
		var ours []string
		for _, k := range keys {
			if mine[handleRE.FindString(k)] {
				ours = append(ours, k)
			}
		}
		if len(ours) > 0 {
			s.fail("%d records left in state.db after the workloads, e.g. %s", len(ours), ours[0])
		}
		s.logf("end: state.db has %d records", len(keys))
	})
}

// report is the soak's report in Markdown.
func (s *soak) report(length time.Duration) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "# Soak report\n\nseed %d, %v of churn and faults (EPHEMERA_SOAK=%v), %s, %d pods of the workloads (Deployments %v, DaemonSet soak-ds, Jobs), %d invariant violations; written %s\n\n",
		s.seed, length, length, s.c.k8sVersion, len(s.pods), s.deploymentNames(), len(s.violations), time.Now().UTC().Format(time.RFC3339))
	b.WriteString("| phase | faults | inline pods: created → Running p50 / p99 (n) | emptyDir control p50 / p99 (n) | slow-plugin pods p50 / p99 (n) | NodePublishVolume by code | NodeUnpublishVolume by code | worst wait for a volume after the fault cleared (pods that waited) | peak driver RSS |\n|---|---|---|---|---|---|---|---|---|\n")
	phases := make([]string, 0, len(s.stats))
	for p := range s.stats {
		phases = append(phases, p)
	}
	sort.Slice(phases, func(i, j int) bool {
		if (phases[i] == "calm") != (phases[j] == "calm") {
			return phases[i] == "calm"
		}
		return phases[i] < phases[j]
	})
	r := func(d time.Duration) string { return d.Round(100 * time.Millisecond).String() }
	lat := func(ds []time.Duration) string {
		if len(ds) == 0 {
			return "–"
		}
		l := summarize(ds)
		return fmt.Sprintf("%s / %s (%d)", r(l.p50), r(l.p99), l.n)
	}
	codes := func(ps *phaseStats, meth string) string {
		var out []string
		for k, v := range ps.rpc {
			if m, code, _ := strings.Cut(k, " "); m == meth {
				out = append(out, fmt.Sprintf("%s %d", code, int(v)))
			}
		}
		sort.Strings(out)
		if len(out) == 0 {
			return "–"
		}
		return strings.Join(out, ", ")
	}
	for _, p := range phases {
		ps := s.stats[p]
		wait := "–"
		if p != "calm" {
			wait = "none waited"
			if ps.waited > 0 {
				wait = fmt.Sprintf("%s (%d)", r(ps.worstWait), ps.waited)
			}
		}
		rss := "–"
		if ps.peakRSS > 0 {
			rss = fmt.Sprintf("%.1f MiB", float64(ps.peakRSS)/(1<<20))
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %s | %s | %s |\n", p, ps.faults, lat(ps.inline), lat(ps.control), lat(ps.slow),
			codes(ps, "NodePublishVolume"), codes(ps, "NodeUnpublishVolume"), wait, rss)
	}
	var counts []string
	for _, k := range s.kinds {
		n := 0
		if ps := s.stats[k.name]; ps != nil {
			n = ps.faults
		}
		counts = append(counts, fmt.Sprintf("%s %d", k.name, n))
	}
	fmt.Fprintf(&b, "\nFaults injected (%d rounds planned): %s.\n", soakRoundsFor(length), strings.Join(counts, ", "))
	load := strings.Join(s.load, " at the start, ")
	fmt.Fprintf(&b, "\nChurn and faults ran %v; load average (1, 5, 15 min): %s at the end.\n", s.churned.Round(time.Second), load)
	fmt.Fprintf(&b, "\nDriver goroutines (idle before the workloads, after each calm gap, idle at the end): %v\n", s.goroutines)
	fmt.Fprintf(&b, "\nTimeline:\n\n```\n%s\n```\n", strings.Join(s.timeline, "\n"))
	if len(s.violations) > 0 {
		fmt.Fprintf(&b, "\nViolations:\n\n```\n%s\n```\n", strings.Join(s.violations, "\n"))
	}
	return b.String()
}
