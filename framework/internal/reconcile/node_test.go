package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/metrics"
	"github.com/ephemera-csi/ephemera/framework/internal/volume"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/store"
)

const testDriver = "reconcile.test"

// fakeMounts is the fake mount table, with targets opened on disk.
type fakeMounts struct{ *mount.Fake }

func (fakeMounts) OpenTarget(_, target string) (*os.Root, error) { return os.OpenRoot(target) }

// backendStorage is a Storage of backends by name.
type backendStorage struct {
	storeID  string
	sources  map[string]map[string]api.Source // backend → volume ID → source
	lists    map[string][]string              // backend → inventory; absent: not a Lister
	listErr  error
	stampers map[string]*stamper
}

func (s *backendStorage) Find(_ context.Context, backend string, v *api.Volume) (api.Source, bool, error) {
	src, ok := s.sources[backend][v.ID]
	return src, ok, nil
}

func (s *backendStorage) List(_ context.Context, backend string) ([]string, bool, error) {
	ids, ok := s.lists[backend]
	if !ok {
		return nil, false, nil
	}
	return ids, true, s.listErr
}

func (s *backendStorage) Stamper(backend string) Stamper {
	if st, ok := s.stampers[backend]; ok {
		return st
	}
	return nil
}

func (s *backendStorage) StoreID() string { return s.storeID }

// stamper is a storage area's stamp.
type stamper struct{ id string }

func (s *stamper) Stamp(context.Context) (string, error)       { return s.id, nil }
func (s *stamper) SetStamp(_ context.Context, id string) error { s.id = id; return nil }

// uid returns a pod UID of the kubelet's shape, n its last digit.
func uid(n int) string { return "00000000-0000-0000-0000-00000000000" + string(rune('0'+n)) }

// kubeletVolume makes volume name of pod u's directory under root, with
// the vol_data.json of driver, and returns its target and handle.
func kubeletVolume(t *testing.T, root, u, name, driver string) (target, id string) {
	t.Helper()
	target, id = volume.TargetPath(root, u, name), api.VolumeHandle(u, name)
	if err := os.MkdirAll(target, 0o750); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(map[string]string{"driverName": driver, "volumeHandle": id})
	if err := os.WriteFile(filepath.Join(filepath.Dir(target), volume.VolDataFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
	return target, id
}

// newTestNode returns a Node of backends a and b over a kubelet root, and
// what it counted.
func newTestNode(t *testing.T, m Mounts, st Storage) (*Node, string, *[]string) {
	t.Helper()
	root := filepath.Join(t.TempDir(), "kubelet")
	if err := os.MkdirAll(filepath.Join(root, volume.PodsDir), 0o750); err != nil {
		t.Fatal(err)
	}
	var counted []string
	n := NewNode(NodeConfig{
		KubeletRoot: root, Driver: testDriver, Backends: []string{"a", "b"}, Logger: klog.Background(),
		Reconciled: func(r string) { counted = append(counted, r) },
	}, m, st)
	return n, root, &counted
}

func TestUnrecordedMounts(t *testing.T) {
	fake := mount.NewFake()
	st := &backendStorage{sources: map[string]map[string]api.Source{}}
	n, root, _ := newTestNode(t, fakeMounts{fake}, st)

	lost, lostID := kubeletVolume(t, root, uid(1), "lost", testDriver)
	known, knownID := kubeletVolume(t, root, uid(2), "known", testDriver)
	other, _ := kubeletVolume(t, root, uid(3), "other", "other.driver")
	src := api.Source{Path: "/dev/loop7", FSType: "ext4"}
	for _, target := range []string{lost, known, other} {
		fake.AddMount(target, src)
	}
	st.sources["b"] = map[string]api.Source{lostID: src}

	found, err := n.UnrecordedMounts(t.Context(), map[string]bool{knownID: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(found) != 1 {
		t.Fatalf("found %+v, want the lost volume only", found)
	}
	f := found[0]
	rec := f.Record
	if f.Kind != FoundMounted || f.Mounted == nil || rec.VolumeID != lostID || rec.TargetPath != lost || rec.Pod.UID != uid(1) ||
		!rec.Rebuilt || rec.Phase != store.PhasePublished || rec.Backend != "b" || rec.Source == nil || rec.Source.Path != src.Path || rec.Source.FSType != src.FSType {
		t.Errorf("finding %+v, record %+v", f, rec)
	}
}

func TestUnrecordedStorage(t *testing.T) {
	podded, proven, unproven, known := api.VolumeHandle(uid(1), "v"), "leftover", "mystery", "known"
	index := func() (map[string]string, error) { return map[string]string{podded: "target"}, nil }
	kinds := func(inv *Inventory) map[string]Kind {
		m := map[string]Kind{}
		for _, f := range inv.Found {
			m[f.Record.VolumeID] = f.Kind
		}
		return m
	}

	// The stamp proves the area the store's: storage without a pod is a leftover.
	st := &backendStorage{storeID: "store-1", lists: map[string][]string{"a": {podded, proven, known, proven}},
		stampers: map[string]*stamper{"a": {id: "store-1"}}}
	n, root, _ := newTestNode(t, fakeMounts{mount.NewFake()}, st)
	kubeletVolume(t, root, uid(1), "v", testDriver)
	inv := n.UnrecordedStorage(t.Context(), "a", map[string]bool{known: true}, n.VolDataIndexOnce())
	if got, want := kinds(inv), map[string]Kind{podded: FoundPodded, proven: FoundProven}; len(inv.Found) != 2 || !maps.Equal(got, want) {
		t.Errorf("stamped area: %v, want %v", got, want)
	}
	if inv.stamp {
		t.Error("a stamped area to stamp again")
	}
	for _, f := range inv.Found {
		if f.Kind == FoundPodded && (f.Record.Pod.UID != uid(1) || f.Record.VolumeName != "v" || f.Record.Phase != store.PhasePublished) {
			t.Errorf("podded record %+v", f.Record)
		}
	}

	// Without the stamp, storage without a pod is kept, and the area is
	// stamped once every finding has a record.
	st.lists["a"], st.stampers["a"].id = []string{podded, unproven}, ""
	inv = n.UnrecordedStorage(t.Context(), "a", map[string]bool{}, index)
	if got, want := kinds(inv), map[string]Kind{podded: FoundPodded, unproven: FoundUnproven}; !maps.Equal(got, want) {
		t.Errorf("unstamped area: %v, want %v", got, want)
	}
	for _, f := range inv.Found {
		if f.Kind == FoundUnproven && f.Record.Phase != store.PhaseUnclaimed {
			t.Errorf("unproven record %+v", f.Record)
		}
	}
	n.StampArea(t.Context(), inv)
	if st.stampers["a"].id != "store-1" {
		t.Errorf("stamp %q after StampArea, want the store's", st.stampers["a"].id)
	}

	// A backend that does not list has no inventory; a failed list and an
	// unreadable kubelet index keep everything.
	if inv := n.UnrecordedStorage(t.Context(), "b", nil, index); len(inv.Found)+len(inv.Failed) != 0 {
		t.Errorf("backend without a Lister: %+v", inv)
	}
	inv = n.UnrecordedStorage(t.Context(), "a", nil, func() (map[string]string, error) { return nil, errors.New("unreadable") })
	if len(inv.Found) != 0 || len(inv.Failed) != 2 {
		t.Errorf("unreadable index: %+v", inv)
	}
	st.listErr = errors.New("backend down")
	n, _, counted := newTestNode(t, fakeMounts{mount.NewFake()}, st)
	inv = n.UnrecordedStorage(t.Context(), "a", nil, index)
	if len(inv.Found) != 0 || len(inv.Failed) != 1 || !slices.Equal(*counted, []string{metrics.ReconcileFailed}) {
		t.Errorf("failed list: %+v, counted %v", inv, *counted)
	}
}
