package reconcile

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/admission"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// podSet is a PodChecker: the pods the API server has; "api-down" fails.
type podSet map[string]bool

func (p podSet) PodExists(_ context.Context, uid string) (bool, error) {
	if uid == "api-down" {
		return false, errors.New("informer not synced")
	}
	return p[uid], nil
}

// volumes is the engine's side of a GC under test: its records, and what
// the GC removed, forgot and reported.
type volumes struct {
	mu        sync.Mutex
	recs      map[string]*store.Record
	fail      map[string]error // Remove's error by volume ID
	removed   []string
	forgotten []string
	observed  []string        // "<volume ID> <result>", "- <result>" for the pass
	deadlines []time.Duration // each Remove's deadline, from the call

	// A Remove of backend "hung" sends its volume on entered, then blocks
	// until hang is closed, or, with honourCtx, until its context ends.
	hang      chan struct{}
	entered   chan string
	honourCtx bool
}

func (v *volumes) list(context.Context) ([]*store.Record, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	var recs []*store.Record
	for _, rec := range v.recs {
		recs = append(recs, rec)
	}
	return recs, nil
}

func (v *volumes) remove(ctx context.Context, rec *store.Record) error {
	v.mu.Lock()
	if d, ok := ctx.Deadline(); ok {
		v.deadlines = append(v.deadlines, time.Until(d))
	} else {
		v.deadlines = append(v.deadlines, -1)
	}
	v.mu.Unlock()
	if rec.Backend == "hung" {
		v.entered <- rec.VolumeID
		if v.honourCtx {
			<-ctx.Done()
			return ctx.Err()
		}
		<-v.hang // a Delete that never answers, whatever its context
		return errors.New("hung backend released")
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := v.fail[rec.VolumeID]; err != nil {
		return err
	}
	delete(v.recs, rec.VolumeID)
	v.removed = append(v.removed, rec.VolumeID)
	return nil
}

func (v *volumes) observe(rec *store.Record, result string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	id := "-"
	if rec != nil {
		id = rec.VolumeID
	}
	v.observed = append(v.observed, id+" "+result)
}

func (v *volumes) forget(id string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.forgotten = append(v.forgotten, id)
}

// newTestGC returns a GC of cfg over a kubelet root with a pods directory,
// one published volume per pod UID in uids, and the pods' directories of
// live; Remove deletes the record. The volumes of pods whose UID starts with
// "hung" are of backend "hung" (see volumes), the others of "dir". cfg's
// Interval, MaxOrphanShare and OperationTimeout default to Options'.
func newTestGC(t *testing.T, cfg GCConfig, uids []string, live ...string) (*GC, *volumes, *admission.Locks) {
	t.Helper()
	root := filepath.Join(t.TempDir(), "kubelet")
	if err := os.MkdirAll(filepath.Join(root, "pods"), 0o750); err != nil {
		t.Fatal(err)
	}
	v := &volumes{recs: map[string]*store.Record{}, fail: map[string]error{}, hang: make(chan struct{}), entered: make(chan string, len(uids))}
	for _, uid := range uids {
		target := filepath.Join(root, "pods", uid, "volumes", "kubernetes.io~csi", "v", "mount")
		id := api.VolumeHandle(uid, "v")
		backend := "dir"
		if strings.HasPrefix(uid, "hung") {
			backend = "hung"
		}
		v.recs[id] = &store.Record{VolumeID: id, VolumeName: "v", TargetPath: target,
			Pod: api.Pod{Namespace: "ns", Name: "p-" + uid, UID: uid}, Backend: backend, Size: 1, Phase: store.PhasePublished}
	}
	for _, uid := range live {
		if err := os.MkdirAll(filepath.Join(root, "pods", uid), 0o750); err != nil {
			t.Fatal(err)
		}
	}
	teardowns, err := admission.NewPool(16, map[string]admission.Share{"dir": {Reserved: 4, Max: 8}, "hung": {Reserved: 4, Max: 8}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	locks := &admission.Locks{}
	if cfg.Interval == 0 {
		cfg.Interval = time.Minute
	}
	if cfg.MaxOrphanShare == 0 {
		cfg.MaxOrphanShare = 0.5
	}
	if cfg.OperationTimeout == 0 {
		cfg.OperationTimeout = 90 * time.Second
	}
	cfg.KubeletRoot, cfg.Logger = root, klog.Background()
	cfg.List, cfg.Remove, cfg.Observe, cfg.Forget = v.list, v.remove, v.observe, v.forget
	cfg.Locks, cfg.Teardowns = locks, teardowns
	return NewGC(cfg), v, locks
}

// collect is a pass of g at now, once the removals it started returned.
func collect(ctx context.Context, g *GC, now time.Time) (map[string]Result, error) {
	p, err := g.Collect(ctx, now)
	if p == nil {
		return nil, err
	}
	return p.Wait(), err
}

func TestGCRemovesOrphansAfterGrace(t *testing.T) {
	g, v, _ := newTestGC(t, GCConfig{OrphanGracePeriod: time.Minute}, []string{"live", "gone"}, "live")
	ctx, now, gone := t.Context(), time.Now(), api.VolumeHandle("gone", "v")

	res, err := collect(ctx, g, now)
	if err != nil {
		t.Fatal(err)
	}
	if res[gone] != Pending || len(res) != 1 {
		t.Fatalf("first pass: %v, want only the orphan, pending", res)
	}
	res, _ = collect(ctx, g, now.Add(59*time.Second))
	if res[gone] != Pending {
		t.Fatalf("within the grace period: %v", res)
	}
	res, _ = collect(ctx, g, now.Add(61*time.Second))
	if res[gone] != Removed {
		t.Fatalf("after the grace period: %v", res)
	}
	if !slices.Equal(v.removed, []string{gone}) || !slices.Equal(v.forgotten, []string{gone}) {
		t.Errorf("removed %v, forgot %v; want the orphan once", v.removed, v.forgotten)
	}
	want := []string{gone + " pending", gone + " pending", gone + " removed"}
	if !slices.Equal(v.observed, want) {
		t.Errorf("observed %v, want %v", v.observed, want)
	}
}

func TestGCPodReappearingResetsGrace(t *testing.T) {
	g, v, _ := newTestGC(t, GCConfig{OrphanGracePeriod: time.Minute}, []string{"flap"})
	ctx, now := t.Context(), time.Now()
	pod := filepath.Join(g.cfg.KubeletRoot, "pods", "flap")
	collect(ctx, g, now)
	if err := os.MkdirAll(pod, 0o750); err != nil {
		t.Fatal(err)
	}
	collect(ctx, g, now.Add(30*time.Second))
	if err := os.Remove(pod); err != nil {
		t.Fatal(err)
	}
	res, _ := collect(ctx, g, now.Add(70*time.Second))
	if res[api.VolumeHandle("flap", "v")] != Pending {
		t.Fatalf("grace not restarted after the pod dir came back: %v", res)
	}
	if len(v.removed) != 0 {
		t.Fatalf("removed %v", v.removed)
	}
}

func TestGCDryRunAndAPIConfirmation(t *testing.T) {
	pods := podSet{"in-api": true}
	g, v, _ := newTestGC(t, GCConfig{OrphanGracePeriod: time.Nanosecond, Pods: pods}, []string{"in-api", "api-down", "gone"})
	ctx, now := t.Context(), time.Now()
	collect(ctx, g, now)
	res, _ := collect(ctx, g, now.Add(time.Second))
	want := map[string]Result{
		api.VolumeHandle("in-api", "v"):   PodExists,
		api.VolumeHandle("api-down", "v"): Failed,
		api.VolumeHandle("gone", "v"):     Removed,
	}
	for id, r := range want {
		if res[id] != r {
			t.Errorf("%s: %s, want %s", id, res[id], r)
		}
	}
	if len(v.recs) != 2 {
		t.Errorf("%d records left, want 2", len(v.recs))
	}

	g2, v2, _ := newTestGC(t, GCConfig{OrphanGracePeriod: time.Nanosecond, DryRun: true}, []string{"gone"})
	collect(ctx, g2, now)
	res, _ = collect(ctx, g2, now.Add(time.Second))
	if res[api.VolumeHandle("gone", "v")] != WouldRemove {
		t.Errorf("dry run: %v", res)
	}
	if len(v2.removed) != 0 {
		t.Error("dry run removed the volume")
	}
}

func TestGCSafety(t *testing.T) {
	g, v, locks := newTestGC(t, GCConfig{OrphanGracePeriod: time.Nanosecond}, []string{"a", "b", "c", "d", "e"}, "c", "d", "e")
	ctx, now := t.Context(), time.Now()
	// A volume busy with another operation is left for the next pass.
	if !locks.TryAcquire(api.VolumeHandle("a", "v")) {
		t.Fatal("lock")
	}
	collect(ctx, g, now)
	collect(ctx, g, now.Add(time.Second))
	locks.Release(api.VolumeHandle("a", "v"))
	if _, ok := v.recs[api.VolumeHandle("a", "v")]; !ok {
		t.Error("busy volume removed")
	}
	if !slices.Equal(v.removed, []string{api.VolumeHandle("b", "v")}) {
		t.Errorf("removed %v, want b only", v.removed)
	}
	if locks.TryAcquire(api.VolumeHandle("b", "v")) {
		locks.Release(api.VolumeHandle("b", "v"))
	} else {
		t.Error("the removed volume's lock was kept")
	}
	// A wrong kubelet root (no pods directory) must not make everything orphaned.
	if err := os.RemoveAll(filepath.Join(g.cfg.KubeletRoot, "pods")); err != nil {
		t.Fatal(err)
	}
	v.observed = nil
	if _, err := collect(ctx, g, now.Add(time.Hour)); err == nil {
		t.Fatal("GC ran without the kubelet's pods directory")
	}
	if len(v.recs) != 4 {
		t.Errorf("%d records left, want the busy one and the live ones kept", len(v.recs))
	}
	if !slices.Equal(v.observed, []string{"- refused"}) {
		t.Errorf("observed %v, want the pass refused", v.observed)
	}
}

// A pass in which more than MaxOrphanShare of the volumes look orphaned
// removes nothing without API confirmation, and only the confirmed with it.
func TestGCRefusesWholesaleOrphaning(t *testing.T) {
	uids := []string{"a", "b", "c", "live"}
	g, v, _ := newTestGC(t, GCConfig{OrphanGracePeriod: time.Nanosecond}, uids, "live")
	ctx, now := t.Context(), time.Now()
	collect(ctx, g, now)
	res, err := collect(ctx, g, now.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for _, uid := range uids[:3] {
		if r := res[api.VolumeHandle(uid, "v")]; r != Refused {
			t.Errorf("%s: %s, want %s", uid, r, Refused)
		}
	}
	if len(v.removed) != 0 {
		t.Errorf("removed %v without API confirmation", v.removed)
	}

	g, v, _ = newTestGC(t, GCConfig{OrphanGracePeriod: time.Nanosecond, Pods: podSet{"a": true}}, uids, "live")
	collect(ctx, g, now)
	res, _ = collect(ctx, g, now.Add(time.Second))
	if res[api.VolumeHandle("a", "v")] != PodExists || res[api.VolumeHandle("b", "v")] != Removed || res[api.VolumeHandle("c", "v")] != Removed {
		t.Errorf("with API confirmation: %v", res)
	}
	if got := slices.Sorted(slices.Values(v.removed)); !slices.Equal(got, slices.Sorted(slices.Values([]string{api.VolumeHandle("b", "v"), api.VolumeHandle("c", "v")}))) {
		t.Errorf("with API confirmation removed %v, want b's and c's volumes", got)
	}
}

// A failed removal is reported and retried at the next pass.
func TestGCRetriesFailedRemoval(t *testing.T) {
	g, v, _ := newTestGC(t, GCConfig{OrphanGracePeriod: time.Nanosecond}, []string{"gone"})
	ctx, now, gone := t.Context(), time.Now(), api.VolumeHandle("gone", "v")
	v.fail[gone] = errors.New("backend down")
	collect(ctx, g, now)
	if res, _ := collect(ctx, g, now.Add(time.Second)); res[gone] != Failed {
		t.Fatalf("failed removal: %v", res)
	}
	delete(v.fail, gone)
	if res, _ := collect(ctx, g, now.Add(2*time.Second)); res[gone] != Removed {
		t.Fatalf("retry: %v", res)
	}
}

// The GC acts only on the pods directory it saw first.
func TestCheckPodsDir(t *testing.T) {
	g, _, _ := newTestGC(t, GCConfig{}, nil)
	pods := filepath.Join(g.cfg.KubeletRoot, "pods")
	if err := g.CheckPodsDir(pods); err != nil {
		t.Fatal(err)
	}
	if err := g.CheckPodsDir(pods); err != nil {
		t.Fatalf("the same directory: %v", err)
	}
	if err := os.Rename(pods, pods+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(pods, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := g.CheckPodsDir(pods); err == nil {
		t.Fatal("a replaced pods directory passed")
	}
}

// waitPass is p.Wait, failing the test if the pass's removals have not
// returned in 30 s (a pass that waits on a hung backend never would).
func waitPass(t *testing.T, p *Pass) map[string]Result {
	t.Helper()
	done := make(chan map[string]Result, 1)
	go func() { done <- p.Wait() }()
	select {
	case res := <-done:
		return res
	case <-time.After(30 * time.Second):
		t.Fatal("the pass waits on removals that never return")
		return nil
	}
}

// pods returns n pod UIDs prefix-0, prefix-1, ...
func pods(prefix string, n int) []string {
	var uids []string
	for i := range n {
		uids = append(uids, fmt.Sprint(prefix, "-", i))
	}
	return uids
}

// Issue 44, finding 3: a backend whose Delete never answers holds only its
// own removals. The pass that starts them does not wait for them; the next
// passes skip that backend (Busy) and remove another backend's orphan once
// its grace period has passed since it was first seen, not later.
func TestGCHungBackendHoldsOnlyItsOwnRemovals(t *testing.T) {
	hung := pods("hung", 16)
	g, v, _ := newTestGC(t, GCConfig{OrphanGracePeriod: time.Minute, MaxOrphanShare: 1}, append(hung, "gone"), "gone")
	ctx, t0, gone := t.Context(), time.Now(), api.VolumeHandle("gone", "v")

	if res, err := collect(ctx, g, t0); err != nil || len(res) != len(hung) {
		t.Fatalf("first pass: %v, %v; want the hung backend's orphans pending", res, err)
	}
	p, err := g.Collect(ctx, t0.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		close(v.hang)
		waitPass(t, p)
	})
	if p.Started() != len(hung) {
		t.Fatalf("the pass started %d removals, want the hung backend's %d", p.Started(), len(hung))
	}
	<-v.entered // a Delete of the hung backend runs, and never returns

	// The dir backend's pod goes away now: first seen at t1.
	if err := os.Remove(filepath.Join(g.cfg.KubeletRoot, "pods", "gone")); err != nil {
		t.Fatal(err)
	}
	t1 := t0.Add(time.Minute + time.Second)
	res := waitPass(t, mustCollect(t, g, t1))
	if res[gone] != Pending {
		t.Fatalf("the dir backend's orphan when first seen: %s, want %s", res[gone], Pending)
	}
	for _, uid := range hung {
		if r := res[api.VolumeHandle(uid, "v")]; r != Busy {
			t.Fatalf("%s while its backend's removals run: %q, want %s", uid, r, Busy)
		}
	}
	if res := waitPass(t, mustCollect(t, g, t1.Add(time.Minute-time.Second))); res[gone] != Pending {
		t.Fatalf("within its grace period: %s, want %s", res[gone], Pending)
	}
	// Its grace period has passed: the first pass from then removes it,
	// however long the hung backend's removals have run.
	if res := waitPass(t, mustCollect(t, g, t1.Add(time.Minute))); res[gone] != Removed {
		t.Fatalf("after its grace period, beside a hung backend: %s, want %s", res[gone], Removed)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if !slices.Equal(v.removed, []string{gone}) {
		t.Errorf("removed %v, want the dir backend's orphan only", v.removed)
	}
}

func mustCollect(t *testing.T, g *GC, now time.Time) *Pass {
	t.Helper()
	p, err := g.Collect(t.Context(), now)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Run makes its passes on time whatever a backend's removals do: with the
// hung backend's removals running forever, another backend's orphan is
// removed by a later pass.
func TestGCRunDoesNotWaitForAHungBackend(t *testing.T) {
	g, v, _ := newTestGC(t, GCConfig{Interval: 5 * time.Millisecond, OrphanGracePeriod: 20 * time.Millisecond, MaxOrphanShare: 1}, append(pods("hung", 4), "gone"), "gone")
	ctx, cancel := context.WithCancel(t.Context())
	stopped := make(chan struct{})
	go func() {
		g.Run(ctx)
		close(stopped)
	}()
	t.Cleanup(func() {
		close(v.hang)
		cancel()
		<-stopped
	})
	<-v.entered
	if err := os.Remove(filepath.Join(g.cfg.KubeletRoot, "pods", "gone")); err != nil {
		t.Fatal(err)
	}
	gone := api.VolumeHandle("gone", "v")
	deadline := time.Now().Add(30 * time.Second)
	for {
		v.mu.Lock()
		removed := slices.Contains(v.removed, gone)
		v.mu.Unlock()
		if removed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the dir backend's orphan was not removed while the hung backend's removals ran")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Each Remove is bounded by GCConfig.OperationTimeout through its context: a
// Delete that honours it fails at the deadline, and its backend's orphans
// are retried by the next pass.
func TestGCRemoveIsBoundedByTheOperationTimeout(t *testing.T) {
	g, v, _ := newTestGC(t, GCConfig{OrphanGracePeriod: time.Nanosecond, OperationTimeout: 50 * time.Millisecond, MaxOrphanShare: 1}, []string{"hung", "gone"})
	v.honourCtx = true
	ctx, now := t.Context(), time.Now()
	collect(ctx, g, now)
	res := waitPass(t, mustCollect(t, g, now.Add(time.Second)))
	hung, gone := api.VolumeHandle("hung", "v"), api.VolumeHandle("gone", "v")
	if res[hung] != Failed || res[gone] != Removed {
		t.Fatalf("a Delete that runs past the operation timeout: %v, want it failed and the other removed", res)
	}
	v.mu.Lock()
	for _, d := range v.deadlines {
		if d <= 0 || d > 50*time.Millisecond {
			t.Errorf("a Remove's context ends in %v, want within the operation timeout (50ms)", d)
		}
	}
	v.mu.Unlock()
	// The backend's removals returned: the next pass tries again.
	if res := waitPass(t, mustCollect(t, g, now.Add(2*time.Second))); res[hung] != Failed {
		t.Fatalf("the next pass: %v, want the timed-out volume retried (failed again)", res)
	}
	if n := len(v.entered); n != 2 {
		t.Errorf("the hung backend's Delete was called %d times, want once per pass (2)", n)
	}
}

// A backend whose removals end while a pass lists the records is skipped by
// that pass: its records may be of volumes just torn down, and a second
// teardown of one would release its capacity twice.
func TestGCSkipsABackendWhoseRemovalsEndedSinceTheList(t *testing.T) {
	g, v, _ := newTestGC(t, GCConfig{OrphanGracePeriod: time.Nanosecond, MaxOrphanShare: 1}, []string{"hung"})
	ctx, now, id := t.Context(), time.Now(), api.VolumeHandle("hung", "v")
	collect(ctx, g, now)
	first := mustCollect(t, g, now.Add(time.Second))
	<-v.entered
	// The next pass lists the record, then the removal returns (and, as a
	// real teardown would, deletes it) before the pass goes on.
	list := g.cfg.List
	g.cfg.List = func(ctx context.Context) ([]*store.Record, error) {
		recs, err := list(ctx)
		v.mu.Lock()
		delete(v.recs, id)
		v.mu.Unlock()
		close(v.hang)
		waitPass(t, first)
		return recs, err
	}
	res := waitPass(t, mustCollect(t, g, now.Add(2*time.Second)))
	if res[id] != Busy {
		t.Errorf("a volume listed before its backend's removals ended: %q, want %s", res[id], Busy)
	}
	if n := len(v.entered); n != 0 {
		t.Errorf("the volume was torn down again (%d more Removes)", n)
	}
}
