package reconcile

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
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
	observed  []string // "<volume ID> <result>", "- <result>" for the pass
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

func (v *volumes) remove(_ context.Context, rec *store.Record) error {
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
// live; Remove deletes the record. cfg's Interval and MaxOrphanShare default
// to Options'.
func newTestGC(t *testing.T, cfg GCConfig, uids []string, live ...string) (*GC, *volumes, *admission.Locks) {
	t.Helper()
	root := filepath.Join(t.TempDir(), "kubelet")
	if err := os.MkdirAll(filepath.Join(root, "pods"), 0o750); err != nil {
		t.Fatal(err)
	}
	v := &volumes{recs: map[string]*store.Record{}, fail: map[string]error{}}
	for _, uid := range uids {
		target := filepath.Join(root, "pods", uid, "volumes", "kubernetes.io~csi", "v", "mount")
		id := api.VolumeHandle(uid, "v")
		v.recs[id] = &store.Record{VolumeID: id, VolumeName: "v", TargetPath: target,
			Pod: api.Pod{Namespace: "ns", Name: "p-" + uid, UID: uid}, Backend: "dir", Size: 1, Phase: store.PhasePublished}
	}
	for _, uid := range live {
		if err := os.MkdirAll(filepath.Join(root, "pods", uid), 0o750); err != nil {
			t.Fatal(err)
		}
	}
	teardowns, err := admission.NewPool(8, map[string]admission.Share{"dir": {Reserved: 4, Max: 8}}, nil)
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
	cfg.KubeletRoot, cfg.Logger = root, klog.Background()
	cfg.List, cfg.Remove, cfg.Observe, cfg.Forget = v.list, v.remove, v.observe, v.forget
	cfg.Locks, cfg.Teardowns = locks, teardowns
	return NewGC(cfg), v, locks
}

func TestGCRemovesOrphansAfterGrace(t *testing.T) {
	g, v, _ := newTestGC(t, GCConfig{OrphanGracePeriod: time.Minute}, []string{"live", "gone"}, "live")
	ctx, now, gone := t.Context(), time.Now(), api.VolumeHandle("gone", "v")

	res, err := g.Collect(ctx, now)
	if err != nil {
		t.Fatal(err)
	}
	if res[gone] != Pending || len(res) != 1 {
		t.Fatalf("first pass: %v, want only the orphan, pending", res)
	}
	res, _ = g.Collect(ctx, now.Add(59*time.Second))
	if res[gone] != Pending {
		t.Fatalf("within the grace period: %v", res)
	}
	res, _ = g.Collect(ctx, now.Add(61*time.Second))
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
	g.Collect(ctx, now)
	if err := os.MkdirAll(pod, 0o750); err != nil {
		t.Fatal(err)
	}
	g.Collect(ctx, now.Add(30*time.Second))
	if err := os.Remove(pod); err != nil {
		t.Fatal(err)
	}
	res, _ := g.Collect(ctx, now.Add(70*time.Second))
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
	g.Collect(ctx, now)
	res, _ := g.Collect(ctx, now.Add(time.Second))
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
	g2.Collect(ctx, now)
	res, _ = g2.Collect(ctx, now.Add(time.Second))
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
	g.Collect(ctx, now)
	g.Collect(ctx, now.Add(time.Second))
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
	if _, err := g.Collect(ctx, now.Add(time.Hour)); err == nil {
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
	g.Collect(ctx, now)
	res, err := g.Collect(ctx, now.Add(time.Second))
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
	g.Collect(ctx, now)
	res, _ = g.Collect(ctx, now.Add(time.Second))
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
	g.Collect(ctx, now)
	if res, _ := g.Collect(ctx, now.Add(time.Second)); res[gone] != Failed {
		t.Fatalf("failed removal: %v", res)
	}
	delete(v.fail, gone)
	if res, _ := g.Collect(ctx, now.Add(2*time.Second)); res[gone] != Removed {
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
