package lifecycle

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/store"
	"github.com/ephemera-csi/ephemera/framework/store/memstore"
)

type podSet map[string]bool

func (p podSet) PodExists(_ context.Context, uid string) (bool, error) {
	if uid == "api-down" {
		return false, errors.New("informer not synced")
	}
	return p[uid], nil
}

// gcDriver returns a driver (not running) with a fake mounter, a memory store
// holding one published dir-backend volume per pod UID, and those pods'
// directories for the UIDs in live.
func gcDriver(t *testing.T, gc GCConfig, uids []string, live ...string) (*Engine, *mount.Fake, store.Store) {
	t.Helper()
	root := filepath.Join(t.TempDir(), "kubelet")
	if err := os.MkdirAll(filepath.Join(root, "pods"), 0o750); err != nil {
		t.Fatal(err)
	}
	deleted := map[string]int{}
	fake, st := mount.NewFake(), memstore.New()
	cfg := testConfig(root, map[string]any{"dir": funcs{
		create: func(context.Context, *api.Volume) (api.Source, error) { return api.Source{Path: "/src"}, nil },
		del:    func(_ context.Context, v *api.Volume) error { deleted[v.ID]++; return nil },
	}})
	if gc.Interval == 0 {
		gc.Interval = cfg.GC.Interval
	}
	if gc.MaxOrphanShare == 0 {
		gc.MaxOrphanShare = cfg.GC.MaxOrphanShare
	}
	cfg.GC = gc
	d := newTestEngine(t, cfg, fake)
	d.SetStore(st)
	for _, uid := range uids {
		target := filepath.Join(root, "pods", uid, "volumes", "kubernetes.io~csi", "v", "mount")
		rec := &store.Record{VolumeID: api.VolumeHandle(uid, "v"), VolumeName: "v", TargetPath: target,
			Pod: api.Pod{Namespace: "ns", Name: "p-" + uid, UID: uid}, Backend: "dir", Size: 1, Phase: store.PhasePublished}
		if err := st.Put(t.Context(), rec); err != nil {
			t.Fatal(err)
		}
		fake.AddMount(target, api.Source{Path: "/src"})
	}
	for _, uid := range live {
		if err := os.MkdirAll(filepath.Join(root, "pods", uid), 0o750); err != nil {
			t.Fatal(err)
		}
	}
	recs, _ := st.List(t.Context())
	d.capacity.Reset(recs)
	return d, fake, st
}

func TestGCRemovesOrphansAfterGrace(t *testing.T) {
	d, fake, st := gcDriver(t, GCConfig{OrphanGracePeriod: time.Minute}, []string{"live", "gone"}, "live")
	ctx, now := t.Context(), time.Now()

	res, err := d.collectGarbage(ctx, now)
	if err != nil {
		t.Fatal(err)
	}
	if res[api.VolumeHandle("gone", "v")] != gcPending || len(res) != 1 {
		t.Fatalf("first pass: %v, want only the orphan, pending", res)
	}
	res, _ = d.collectGarbage(ctx, now.Add(61*time.Second))
	if res[api.VolumeHandle("gone", "v")] != gcRemoved {
		t.Fatalf("after the grace period: %v", res)
	}
	if _, err := st.Get(ctx, api.VolumeHandle("gone", "v")); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("orphan record kept: %v", err)
	}
	if fake.MountCount(filepath.Join(d.cfg.Node.KubeletRootDir, "pods", "gone", "volumes", "kubernetes.io~csi", "v", "mount")) != 0 {
		t.Error("orphan still mounted")
	}
	if _, err := st.Get(ctx, api.VolumeHandle("live", "v")); err != nil {
		t.Errorf("live volume touched: %v", err)
	}
	if n, _ := d.capacity.Snapshot(); n != 1 {
		t.Errorf("capacity not released: %d volumes accounted", n)
	}
}

func TestGCPodReappearingResetsGrace(t *testing.T) {
	d, _, st := gcDriver(t, GCConfig{OrphanGracePeriod: time.Minute}, []string{"flap"})
	ctx, now := t.Context(), time.Now()
	d.collectGarbage(ctx, now)
	os.MkdirAll(filepath.Join(d.cfg.Node.KubeletRootDir, "pods", "flap"), 0o750)
	d.collectGarbage(ctx, now.Add(30*time.Second))
	os.Remove(filepath.Join(d.cfg.Node.KubeletRootDir, "pods", "flap"))
	res, _ := d.collectGarbage(ctx, now.Add(70*time.Second))
	if res[api.VolumeHandle("flap", "v")] != gcPending {
		t.Fatalf("grace not restarted after the pod dir came back: %v", res)
	}
	if _, err := st.Get(ctx, api.VolumeHandle("flap", "v")); err != nil {
		t.Fatal(err)
	}
}

func TestGCDryRunAndAPIConfirmation(t *testing.T) {
	pods := podSet{"in-api": true}
	d, _, st := gcDriver(t, GCConfig{OrphanGracePeriod: time.Nanosecond, Pods: pods}, []string{"in-api", "api-down", "gone"})
	ctx, now := t.Context(), time.Now()
	d.collectGarbage(ctx, now)
	res, _ := d.collectGarbage(ctx, now.Add(time.Second))
	want := map[string]gcResult{
		api.VolumeHandle("in-api", "v"):   gcConfirmed,
		api.VolumeHandle("api-down", "v"): gcFailed,
		api.VolumeHandle("gone", "v"):     gcRemoved,
	}
	for id, r := range want {
		if res[id] != r {
			t.Errorf("%s: %s, want %s", id, res[id], r)
		}
	}
	if recs, _ := st.List(ctx); len(recs) != 2 {
		t.Errorf("%d records left, want 2", len(recs))
	}

	d2, _, st2 := gcDriver(t, GCConfig{OrphanGracePeriod: time.Nanosecond, DryRun: true}, []string{"gone"})
	d2.collectGarbage(ctx, now)
	res, _ = d2.collectGarbage(ctx, now.Add(time.Second))
	if res[api.VolumeHandle("gone", "v")] != gcWouldRm {
		t.Errorf("dry run: %v", res)
	}
	if recs, _ := st2.List(ctx); len(recs) != 1 {
		t.Error("dry run removed the volume")
	}
}

func TestGCSafety(t *testing.T) {
	d, _, st := gcDriver(t, GCConfig{OrphanGracePeriod: time.Nanosecond}, []string{"a", "b", "c", "d", "e"}, "c", "d", "e")
	ctx, now := t.Context(), time.Now()
	// A volume busy with another operation is left for the next pass.
	if !d.lanes.Locks.TryAcquire(api.VolumeHandle("a", "v")) {
		t.Fatal("lock")
	}
	d.collectGarbage(ctx, now)
	d.collectGarbage(ctx, now.Add(time.Second))
	d.lanes.Locks.Release(api.VolumeHandle("a", "v"))
	if _, err := st.Get(ctx, api.VolumeHandle("a", "v")); err != nil {
		t.Errorf("busy volume removed: %v", err)
	}
	// A wrong kubelet root (no pods directory) must not make everything orphaned.
	if err := os.RemoveAll(filepath.Join(d.cfg.Node.KubeletRootDir, "pods")); err != nil {
		t.Fatal(err)
	}
	if _, err := d.collectGarbage(ctx, now.Add(time.Hour)); err == nil {
		t.Fatal("GC ran without the kubelet's pods directory")
	}
	if recs, _ := st.List(ctx); len(recs) != 4 {
		t.Errorf("%d records left, want the busy one and the live ones kept", len(recs))
	}
}
