//go:build e2e && linux

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ephemera-csi/ephemera/test/e2e/logind"
)

// The soak's faults beyond a process restart (issue 45): a plugin stopped
// (SIGSTOP) and flapping, the driver's state directory full, a node reboot, a
// graceful node shutdown through the kubelet's logind inhibitor, and the
// driver swapped for the release of test/e2e/upgrade-from and back.

const (
	// soakStateFSSize is the filesystem the driver's state directory lives
	// on when state-dir-full is scheduled: a sparse loop ext4 (-m 0: root
	// gets no reserved blocks) that the soak mounts and removes. It holds
	// the loop backing files (preallocated: --loop-preallocate) of the
	// workloads at their largest scale, 4 × 32Mi + 2 × 300Mi, with room for
	// pods being replaced.
	soakStateFSSize = 2 << 30
	// soakFiller is the file that fills the state filesystem.
	soakFiller = "soak-filler"
)

// selectKinds is the fault table for a soak of this length: the kinds
// EPHEMERA_SOAK_FAULTS names (comma-separated, whatever their minSoak), or
// every kind whose minSoak the length reaches.
func selectKinds(length time.Duration) ([]faultKind, error) {
	all := soakFaults()
	only := os.Getenv("EPHEMERA_SOAK_FAULTS")
	if only == "" {
		var kinds []faultKind
		for _, k := range all {
			if length >= k.minSoak {
				kinds = append(kinds, k)
			}
		}
		return kinds, nil
	}
	var kinds []faultKind
	for _, n := range strings.Split(only, ",") {
		i := slices.IndexFunc(all, func(k faultKind) bool { return k.name == strings.TrimSpace(n) })
		if i < 0 {
			return nil, fmt.Errorf("EPHEMERA_SOAK_FAULTS: no fault kind %q", n)
		}
		kinds = append(kinds, all[i])
	}
	for _, k := range kinds {
		if k.after != "" && !slices.ContainsFunc(kinds, func(o faultKind) bool { return o.name == k.after }) {
			return nil, fmt.Errorf("EPHEMERA_SOAK_FAULTS: %s comes after %s, which is not named", k.name, k.after)
		}
	}
	return kinds, nil
}

func (s *soak) scheduled(name string) bool {
	return slices.ContainsFunc(s.kinds, func(k faultKind) bool { return k.name == name })
}

// setupStateFS puts the driver's state directory on a small filesystem of
// its own for state-dir-full (the driver is restarted by setup afterwards);
// the returned func puts it back (the driver stopped).
func (s *soak) setupStateFS(ctx context.Context) (func(), error) {
	c, d := s.c, s.d
	img := filepath.Join(c.root, "soak-state.img")
	// Not below the plugins' directory (c.root/soak), which must end empty.
	mp := filepath.Join(c.root, "soak-state")
	if err := os.MkdirAll(mp, 0o700); err != nil {
		return nil, err
	}
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		return nil, err
	}
	if err := os.Truncate(img, soakStateFSSize); err != nil {
		return nil, err
	}
	for _, cmd := range [][]string{{"mkfs.ext4", "-q", "-F", "-m", "0", img}, {"mount", "-o", "loop", img, mp}} {
		if out, err := exec.CommandContext(ctx, cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
			_ = os.Remove(img)
			return nil, fmt.Errorf("%s: %v: %s", strings.Join(cmd, " "), err, out)
		}
	}
	if err := os.Chmod(mp, 0o700); err != nil {
		return nil, err
	}
	orig := d.stateDir
	d.stateDir = mp
	s.stateFS = mp
	s.logf("state dir on a %d MiB loop ext4 of its own: %s", soakStateFSSize>>20, mp)
	return func() {
		d.stop()
		if out, err := exec.Command("umount", mp).CombinedOutput(); err != nil {
			s.t.Errorf("umount the soak's state filesystem %s: %v: %s", mp, err, out)
			_ = exec.Command("umount", "-l", mp).Run()
		}
		_ = os.Remove(img)
		d.stateDir = orig
	}, nil
}

// setupShutdown gives the soak's node graceful node shutdown: a private bus
// and logind, shutdownGracePeriodByPodPriority in its kubelet's configuration
// and the bus in its environment; the kubelet restarts and takes its delay
// lock. The returned func puts the kubelet back as it was.
func (s *soak) setupShutdown(ctx context.Context) (func(), error) {
	c, n := s.c, &s.c.node
	bus, l, sock, err := c.startLogind(ctx, filepath.Join(c.root, "soak", "dbus"), "dbus-daemon-soak")
	undoBus := func() {
		if l != nil {
			l.Close()
		}
		if bus != nil {
			bus.stop(5 * time.Second)
		}
	}
	if err != nil {
		undoBus()
		return nil, err
	}
	s.logind = l
	cfg := filepath.Join(n.dir, "kubelet-config.yaml")
	set := func(extra string, env []string) error {
		n.extraKubeletConfig, n.kubeletEnv = extra, env
		if err := os.WriteFile(cfg, []byte(n.kubeletConfig()), 0o644); err != nil {
			return err
		}
		return n.restartKubelet(ctx)
	}
	savedExtra, savedEnv := n.extraKubeletConfig, n.kubeletEnv
	started := time.Now()
	if err := set(savedExtra+shutdownKubeletConfig, append(slices.Clone(savedEnv), "DBUS_SYSTEM_BUS_ADDRESS="+logind.Address(sock))); err != nil {
		undoBus()
		return nil, err
	}
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := l.WaitInhibitor(lctx, "kubelet", started); err != nil {
		undoBus()
		return nil, fmt.Errorf("the soak node's kubelet took no delay lock: %w", err)
	}
	s.logf("graceful node shutdown on for the soak's node: private logind, the kubelet holds its delay lock")
	return func() {
		if err := set(savedExtra, savedEnv); err != nil {
			s.t.Errorf("restart the kubelet without graceful node shutdown: %v", err)
		}
		undoBus()
	}, nil
}

// sleepCtx sleeps for d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// pluginHang stops a plugin (SIGSTOP) for a seeded 15-40 s: its socket
// accepts and nothing answers; then SIGCONT.
func (s *soak) pluginHang(ctx context.Context) error {
	p := s.plugins[s.faultRNG.IntN(len(s.plugins))]
	d := time.Duration(15+s.faultRNG.IntN(26)) * time.Second
	pid := p.p.cmd.Process.Pid
	s.logf("plugin-hang: SIGSTOP %s (pid %d) for %v", p.proc, pid, d)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return err
	}
	sleepCtx(ctx, d)
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		return err
	}
	if p.p.exited() {
		return fmt.Errorf("%s exited while stopped: %v", p.proc, p.p.exitErr())
	}
	return nil
}

// pluginFlap kills and restarts a plugin 3-5 times, 0.5-2 s apart.
func (s *soak) pluginFlap(ctx context.Context) error {
	p := s.plugins[s.faultRNG.IntN(len(s.plugins))]
	n := 3 + s.faultRNG.IntN(3)
	s.logf("plugin-flap: %s, %d kill/restart cycles", p.proc, n)
	for i := 0; i < n; i++ {
		p.p.kill()
		sleepCtx(ctx, time.Duration(500+s.faultRNG.IntN(1500))*time.Millisecond)
		if err := p.startWith(ctx, p.args...); err != nil {
			return err
		}
		sleepCtx(ctx, time.Duration(500+s.faultRNG.IntN(1500))*time.Millisecond)
	}
	return nil
}

// publishCodes is the driver's NodePublishVolume calls by code.
func publishCodes(m scrape) map[string]float64 {
	out := map[string]float64{}
	for _, x := range m {
		if x.name == "ephemera_rpc_duration_seconds_count" && x.labels["method"] == "NodePublishVolume" {
			out[x.labels["code"]] += x.value
		}
	}
	return out
}

// stateDirFull fills the driver's state filesystem to ENOSPC for a seeded
// 18-25 s, then frees it. The owners replace the pods burst deleted as the
// fault started, so publishes run into the full disk: each must fail with
// ResourceExhausted (the kubelet retries; nothing final), and nothing
// half-written may survive (the records and storage checks: a backing file
// or directory without its record, a record without storage, for longer
// than soakPersist). Afterwards every pod runs (soakRunningBound).
func (s *soak) stateDirFull(ctx context.Context) error {
	if s.stateFS == "" {
		return fmt.Errorf("the state directory is not on a filesystem of the soak's own")
	}
	hold := time.Duration(18+s.faultRNG.IntN(8)) * time.Second
	filler := filepath.Join(s.stateFS, soakFiller)
	before, err := s.d.scrapeMetrics(ctx)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(filler, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	// Everything free, then what is left in ever smaller pieces.
	var st unix.Statfs_t
	if err := unix.Statfs(s.stateFS, &st); err != nil {
		f.Close()
		return err
	}
	var off int64
	for chunk := int64(st.Bavail) * int64(st.Bsize); chunk >= 4096; {
		if err := unix.Fallocate(int(f.Fd()), 0, off, chunk); err != nil {
			chunk /= 2
			continue
		}
		off += chunk
	}
	f.Close()
	_ = unix.Statfs(s.stateFS, &st)
	s.logf("state-dir-full: %s filled with %d MiB, %d bytes free, for %v", s.stateFS, off>>20, int64(st.Bavail)*int64(st.Bsize), hold)
	sleepCtx(ctx, hold)
	after, aerr := s.d.scrapeMetrics(ctx)
	if err := os.Remove(filler); err != nil {
		return err
	}
	if aerr != nil {
		return aerr
	}
	b, a := publishCodes(before), publishCodes(after)
	var got []string
	for code, v := range a {
		if n := v - b[code]; n > 0 {
			got = append(got, fmt.Sprintf("%s %d", code, int(n)))
			// Aborted: the kubelet's retry while a publish of the volume runs.
			if code != "OK" && code != "ResourceExhausted" && code != "Aborted" {
				s.fail("state-dir-full: %d NodePublishVolume calls answered %s with the state filesystem full, want ResourceExhausted", int(n), code)
			}
		}
	}
	slices.Sort(got)
	s.logf("state-dir-full: freed; NodePublishVolume in the window: %v", got)
	return nil
}

// csiTargets are the inline volumes' targets mounted below the pods dir.
func (s *soak) csiTargets() []string {
	var out []string
	for _, m := range mountsUnder(filepath.Join(s.c.kubeletRoot, "pods")) {
		if strings.Contains(m.MountPoint, "/volumes/kubernetes.io~csi/") {
			out = append(out, m.MountPoint)
		}
	}
	return out
}

// podOfTarget is the pod UID of a target below the pods dir.
func (s *soak) podOfTarget(target string) string {
	rel, _ := filepath.Rel(filepath.Join(s.c.kubeletRoot, "pods"), target)
	return strings.SplitN(rel, "/", 2)[0]
}

// swapDriver replaces the soak's driver, a host process, by the build of
// test/e2e/upgrade-from (old) or this tree's (the upgrade back) over the same
// state dir, socket and flags (those the old release lacks left out): the
// binaries swapped as a node plugin's image is, with the volumes mounted.
// Sampled every 20 ms, no target of a pod that still runs is unmounted or
// mounted twice; the new process reads every record (no adopted, quarantined
// or failed reconcile, no state recovery) and is the version swapped in.
// Rolling the shipped DaemonSet through the controller is
// TestDriverUpgradeRollback's.
func (s *soak) swapDriver(ctx context.Context, old bool) error {
	d := s.d
	bin, drop, version, what := s.curBin, []string(nil), s.curVersion, "upgrade to this tree's driver"
	if old {
		bin, drop, version, what = s.oldBin, []string{"--kubelet-cgroup-root="}, s.oldVersion, "rollback to "+s.oldVersion
	}
	targets := s.csiTargets()
	w := watchMounts(targets)
	d.stop()
	s.checkRecordsStopped()
	d.bin, d.dropFlags = bin, drop
	if err := d.start(ctx); err != nil {
		w.stop()
		return err
	}
	// Its start-up reconcile of the records.
	sleepCtx(ctx, 3*time.Second)
	lo, hi, samples := w.stop()
	// The pods that still run: a Job's pod (it exits after 5 s), a pod deleted
	// (the burst, the churn) rightly lose their volumes meanwhile.
	pods, err := s.c.cs.CoreV1().Pods(soakNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	running := map[string]bool{}
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && p.Labels["soak"] != "job" {
			running[string(p.UID)] = true
		}
	}
	kept, ofRunning := 0, 0
	for _, tg := range targets {
		if hi[tg] > 1 {
			s.fail("driver %s: %d mounts at %s during the swap", what, hi[tg], tg)
		}
		if !running[s.podOfTarget(tg)] {
			continue
		}
		ofRunning++
		if lo[tg] == 0 {
			s.fail("driver %s: %s (a running pod's volume) unmounted during the swap", what, tg)
			continue
		}
		kept++
	}
	m, err := d.scrapeMetrics(ctx)
	if err != nil {
		return err
	}
	if v := m.sum("ephemera_build_info", map[string]string{"version": version}); v != 1 {
		s.fail("driver %s: ephemera_build_info{version=%q} = %v", what, version, v)
	}
	for _, result := range []string{"adopted", "quarantined", "failed"} {
		if got := m.sum("ephemera_reconcile_total", map[string]string{"result": result}); got != 0 {
			s.fail("driver %s: ephemera_reconcile_total{result=%q} = %v: the records of the other version not all read", what, result, got)
		}
	}
	if got := m.sum("ephemera_state_recoveries_total", nil); got != 0 {
		s.fail("driver %s: ephemera_state_recoveries_total = %v: the state file moved aside", what, got)
	}
	s.logf("driver %s: %d of the %d volumes of pods still running kept their mount through the swap (%d mounted at its start; %d samples), %v volumes counted from records",
		what, kept, ofRunning, len(targets), samples, m.sum("ephemera_volumes", nil))
	return nil
}

// downAndUp is what a reboot does to the soak's node after it went down
// (cluster.powerOff): the plugins, host processes, die with it and start
// again before the node's services (cluster.powerOn).
func (s *soak) downAndUp(ctx context.Context, down time.Duration) error {
	t0 := time.Now()
	s.c.powerOff(s.t, filepath.Join(s.d.stateDir, "loop"))
	for _, p := range s.plugins {
		p.p.kill()
	}
	s.logf("node down in %v (kubelet, driver, containerd, plugins stopped; mounts, runtime state and loop devices gone)", time.Since(t0).Round(100*time.Millisecond))
	sleepCtx(ctx, down)
	for _, p := range s.plugins {
		if err := p.startWith(ctx, p.args...); err != nil {
			return err
		}
	}
	s.c.powerOn(s.t)
	return s.waitNodeBack(ctx, t0)
}

// nodeReboot: the node powered off (as TestNodeReboot does it) for a seeded
// 3-8 s and on again; every pod that should run runs again.
func (s *soak) nodeReboot(ctx context.Context) error {
	return s.downAndUp(ctx, time.Duration(3+s.faultRNG.IntN(6))*time.Second)
}

// gracefulNodeShutdown announces a shutdown to the soak node's kubelet
// (logind's PrepareForShutdown) and waits for it to release its delay lock:
// it has killed every pod, priority group by priority group. At that moment
// no inline volume may be left mounted below the pods dir and the driver
// must still run (here a host process that the power-off stops; the order
// against a driver pod at system-node-critical is TestGracefulNodeShutdown's).
// Then the shutdown is called off (the stand-in logind's power-off is ours),
// the node reboots and the pods run again.
func (s *soak) gracefulNodeShutdown(ctx context.Context) error {
	if s.logind == nil {
		return fmt.Errorf("no logind for the soak's node")
	}
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	res, err := s.logind.Shutdown(sctx)
	if err != nil {
		return err
	}
	if res.TimedOut {
		s.fail("graceful-node-shutdown: the kubelet still held its delay lock after %v", res.Done.Sub(res.Announced))
	}
	left := s.csiTargets()
	if len(left) > 0 {
		s.fail("graceful-node-shutdown: the kubelet released its lock with %d inline volumes mounted, e.g. %s", len(left), left[0])
	}
	if s.d.p == nil || s.d.p.exited() {
		s.fail("graceful-node-shutdown: the driver stopped before the kubelet released its lock")
	}
	s.logf("graceful-node-shutdown: the kubelet released its lock %v after the announcement, no inline volume mounted, the driver running",
		res.Done.Sub(res.Announced).Round(100*time.Millisecond))
	if err := s.logind.Cancel(); err != nil {
		return err
	}
	since := time.Now()
	if err := s.downAndUp(ctx, 2*time.Second); err != nil {
		return err
	}
	lctx, lcancel := context.WithTimeout(ctx, 30*time.Second)
	defer lcancel()
	_, err = s.logind.WaitInhibitor(lctx, "kubelet", since)
	return err
}

// waitNodeBack waits until every pod of the soak that should run runs on the
// node again (after its down time: a status from before is stale) and every
// Deployment and the DaemonSet has that many: within soakRunningBound (and
// the slow plugin's delay).
func (s *soak) waitNodeBack(ctx context.Context, down time.Time) error {
	since := metav1.NewTime(down.Truncate(time.Second))
	return waitFor(ctx, soakRunningBound+soakSlowDelay, time.Second, "the soak's pods running again after the node came back", func() (bool, error) {
		pods, err := s.c.cs.CoreV1().Pods(soakNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		running := map[string]int{}
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
				continue
			}
			ok := p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) > 0
			for _, cs := range p.Status.ContainerStatuses {
				ok = ok && cs.Ready && cs.State.Running != nil && !cs.State.Running.StartedAt.Before(&since)
			}
			if !ok {
				if p.Labels["soak"] == "job" {
					continue // a Job's pod may fail instead; its Job makes another
				}
				return false, fmt.Errorf("pod %s: phase %s, not running since the node came back", p.Name, p.Status.Phase)
			}
			running[p.Labels["soak"]]++
		}
		for n := range s.deployments {
			dep, err := s.c.cs.AppsV1().Deployments(soakNS).Get(ctx, "soak-"+n, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			if want := int(*dep.Spec.Replicas); running[n] < want {
				return false, fmt.Errorf("Deployment %s: %d of %d pods running", dep.Name, running[n], want)
			}
		}
		if running["ds"] < 1 {
			return false, fmt.Errorf("the DaemonSet's pod not running")
		}
		return true, nil
	})
}

// setupUserns readies the soak's hostUsers: false workload where the node has
// user namespaces, as TestUserNamespaces finds them: containerd 2 with the
// runc-userns handler, which the Node's status.runtimeHandlers lists with
// userNamespaces (the RuntimeClass is made here and removed at the end). It
// returns why not, or "".
func (s *soak) setupUserns(ctx context.Context) string {
	c := s.c
	if c.runtime != runtimeContainerd || c.ctrd.major != containerd2 {
		return "user namespaces need containerd >= 2.0 and runc >= 1.2 (EPHEMERA_E2E_CONTAINERD=2)"
	}
	if c.ctrd.usernsRunc == "" {
		return fmt.Sprintf("no runtime handler %s: %v", usernsHandler, c.ctrd.usernsErr)
	}
	rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: usernsHandler}, Handler: usernsHandler}
	if _, err := c.cs.NodeV1().RuntimeClasses().Create(ctx, rc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Sprintf("create RuntimeClass %s: %v", usernsHandler, err)
	}
	s.t.Cleanup(func() {
		_ = c.cs.NodeV1().RuntimeClasses().Delete(context.Background(), usernsHandler, metav1.DeleteOptions{})
	})
	err := waitFor(ctx, 30*time.Second, 250*time.Millisecond, "node status lists handler "+usernsHandler+" with user namespaces", func() (bool, error) {
		n, err := c.cs.CoreV1().Nodes().Get(ctx, c.name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, h := range n.Status.RuntimeHandlers {
			if h.Name == usernsHandler && h.Features != nil && h.Features.UserNamespaces != nil && *h.Features.UserNamespaces {
				return true, nil
			}
		}
		return false, fmt.Errorf("no handler %s with user namespaces in the node's status", usernsHandler)
	})
	if err != nil {
		return err.Error()
	}
	return ""
}
