package lifecycle

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/reconcile"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/store"
	"github.com/ephemera-csi/ephemera/framework/store/memstore"
)

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

// The orphan GC's removals are the lifecycle's gc event: New wires the GC
// (internal/reconcile, which tests its passes) to collectOrphan, whose
// teardown unmounts, deletes the storage and the record, and releases the
// capacity.
func TestGCRemovesOrphansAfterGrace(t *testing.T) {
	d, fake, st := gcDriver(t, GCConfig{OrphanGracePeriod: time.Minute}, []string{"live", "gone"}, "live")
	ctx, now := t.Context(), time.Now()

	pass, err := d.gc.Collect(ctx, now)
	if err != nil {
		t.Fatal(err)
	}
	res := pass.Wait()
	if res[api.VolumeHandle("gone", "v")] != reconcile.Pending || len(res) != 1 {
		t.Fatalf("first pass: %v, want only the orphan, pending", res)
	}
	pass, err = d.gc.Collect(ctx, now.Add(61*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	res = pass.Wait()
	if res[api.VolumeHandle("gone", "v")] != reconcile.Removed {
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

// The GC tears a volume down from the record it listed; a kubelet unpublish
// may have torn it down between that list and the GC taking the volume's
// lock. The gc event reads the record again under the lock: a volume already
// gone is left alone (its storage is not deleted twice, its capacity not
// released twice).
func TestGCStaleRecordIsNotTornDownTwice(t *testing.T) {
	d, _, st := gcDriver(t, GCConfig{}, []string{"gone", "other"})
	ctx := t.Context()
	stale, err := st.Get(ctx, api.VolumeHandle("gone", "v"))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.collectOrphan(ctx, stale); err != nil {
		t.Fatal(err)
	}
	if n, _ := d.capacity.Snapshot(); n != 1 {
		t.Fatalf("%d volumes accounted after one teardown, want 1", n)
	}
	if err := d.collectOrphan(ctx, stale); err != nil {
		t.Fatalf("gc of a volume torn down since the list: %v", err)
	}
	if n, _ := d.capacity.Snapshot(); n != 1 {
		t.Errorf("%d volumes accounted after the stale gc, want 1: the other volume's capacity was released", n)
	}
}
