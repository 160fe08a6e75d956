package drivertest_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/drivers/dir"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/store/memstore"
)

// recordingTB is the test it wraps, except that Errorf and FailNow are
// recorded instead of failing it.
type recordingTB struct {
	testing.TB
	mu     sync.Mutex
	errors []string
	failed bool
}

func (r *recordingTB) Helper() {}

func (r *recordingTB) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

func (r *recordingTB) FailNow() {
	r.mu.Lock()
	r.failed = true
	r.mu.Unlock()
	runtime.Goexit()
}

// requireClean runs h.RequireClean on a recordingTB, in a goroutine of its own
// since FailNow ends it, and returns what it reported and whether it failed.
func requireClean(t *testing.T, h *drivertest.Harness) ([]string, bool) {
	t.Helper()
	r := &recordingTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.RequireClean(r)
	}()
	<-done
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.errors, r.failed
}

// stray is a backend whose inventory the test sets.
type stray struct {
	framework.BackendFuncs
	mu  sync.Mutex
	ids []string
}

func (s *stray) List(context.Context) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.ids), nil
}

func (s *stray) set(ids ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ids = ids
}

// noRoot starts a driver as an author would without root: the fake mounter,
// the in-memory store, the dir backend (a Lister) as the default and a stray
// backend.
func noRoot(t *testing.T) (*drivertest.Harness, *mount.Fake, *stray) {
	t.Helper()
	d, err := dir.New(dir.Options{Root: filepath.Join(t.TempDir(), "dirs")})
	if err != nil {
		t.Fatal(err)
	}
	fake, s := mount.NewFake(), &stray{}
	h := drivertest.Start(t, framework.Options{
		Backends: map[string]framework.Backend{"dir": d, "stray": s},
		Volumes: framework.VolumeOptions{
			DefaultBackend: "dir",
			Mounter:        fake,
		},
		State: framework.StateOptions{Store: memstore.New()},
		GC:    framework.GCOptions{Interval: -1},
	})
	return h, fake, s
}

// A test that deleted its pods passes; one that did not fails.
func TestRequireCleanAfterDeletePod(t *testing.T) {
	h, _, _ := noRoot(t)
	k, ctx := h.Kubelet, t.Context()
	pod := k.NewPod("ns", "web")
	if err := k.Publish(ctx, pod, drivertest.InlineVolume{Name: "data"}); err != nil {
		t.Fatalf("publish: %v", err)
	}
	if errs, failed := requireClean(t, h); !failed || len(errs) == 0 {
		t.Fatalf("RequireClean with a published volume: failed %v, %q", failed, errs)
	}
	if err := k.DeletePod(ctx, pod); err != nil {
		t.Fatalf("delete pod: %v", err)
	}
	h.RequireClean(t)
}

func TestRequireCleanReportsLeftovers(t *testing.T) {
	h, fake, s := noRoot(t)
	k, ctx := h.Kubelet, t.Context()
	published := k.NewPod("ns", "published")
	if err := k.Publish(ctx, published, drivertest.InlineVolume{Name: "data"}); err != nil {
		t.Fatalf("publish: %v", err)
	}
	idle := k.NewPod("ns", "idle") // never deleted
	// The driver cannot remove this target: unpublish fails after unmounting,
	// the record stays, the pod directory too.
	stuck := k.NewPod("ns", "stuck")
	if err := k.Publish(ctx, stuck, drivertest.InlineVolume{Name: "data"}); err != nil {
		t.Fatalf("publish: %v", err)
	}
	stuckTarget := k.TargetPath(stuck, "data")
	fake.Fail(mount.MethodRemoveTarget, func(target string) error {
		if target == stuckTarget {
			return errors.New("injected: target busy")
		}
		return nil
	})
	if err := k.DeletePod(ctx, stuck); err == nil {
		t.Fatal("deleting the pod whose target cannot be removed succeeded")
	}
	s.set("csi-stray")

	pods := filepath.Join(k.Root(), "pods")
	publishedTarget := k.TargetPath(published, "data")
	publishedID := api.VolumeHandle(published.UID, "data")
	stuckID := api.VolumeHandle(stuck.UID, "data")
	want := []string{
		"drivertest: left behind: mount at " + publishedTarget,
		"drivertest: left behind: target " + stuckTarget,
	}
	var podDirs []string
	for _, p := range []*drivertest.Pod{published, idle, stuck} {
		podDirs = append(podDirs, "drivertest: left behind: pod directory "+filepath.Join(pods, p.UID))
	}
	slices.Sort(podDirs)
	want = append(want, podDirs...)
	recs := []string{
		fmt.Sprintf("drivertest: left behind: record %s (backend %q, phase Published, target %s)", publishedID, "dir", publishedTarget),
		fmt.Sprintf("drivertest: left behind: record %s (backend %q, phase ", stuckID, "dir"), // phase: whatever the failed teardown left
	}
	if stuckID < publishedID {
		recs[0], recs[1] = recs[1], recs[0]
	}
	want = append(want, recs...)
	want = append(want, `drivertest: left behind: storage csi-stray of backend "stray" without a record`)

	got, failed := requireClean(t, h)
	if !failed {
		t.Error("RequireClean did not stop the test")
	}
	if len(got) != len(want) {
		t.Fatalf("RequireClean reported\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("report %d:\n got %s\nwant %s", i, got[i], want[i])
		}
	}

	// Cleaning up for real leaves nothing.
	fake.Fail(mount.MethodRemoveTarget, nil)
	s.set()
	for _, p := range []*drivertest.Pod{published, idle, stuck} {
		if err := k.DeletePod(ctx, p); err != nil {
			t.Fatalf("delete pod %s: %v", p.Name, err)
		}
	}
	h.RequireClean(t)
}

// RequireClean needs the driver's records: with the driver stopped it cannot
// check, and says so.
func TestRequireCleanStoppedDriver(t *testing.T) {
	h, _, _ := noRoot(t)
	h.Stop()
	got, failed := requireClean(t, h)
	if !failed || len(got) != 1 || !strings.Contains(got[0], "the driver is not running") {
		t.Errorf("RequireClean with the driver stopped: failed %v, %q", failed, got)
	}
}
