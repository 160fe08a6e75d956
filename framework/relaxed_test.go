package framework_test

import (
	"context"
	"sync"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// callsStore is a store.Relaxed that notes how each record was written.
type callsStore struct {
	store.Store
	mu    sync.Mutex
	calls []string
}

func (s *callsStore) note(call string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, call)
}

func (s *callsStore) Put(ctx context.Context, r *store.Record) error {
	s.note("Put " + r.Backend + " " + string(r.Phase))
	return s.Store.Put(ctx, r)
}

func (s *callsStore) Delete(ctx context.Context, id string) error {
	s.note("Delete")
	return s.Store.Delete(ctx, id)
}

func (s *callsStore) PutRelaxed(ctx context.Context, r *store.Record) error {
	s.note("PutRelaxed " + r.Backend + " " + string(r.Phase))
	return s.Store.Put(ctx, r)
}

func (s *callsStore) DeleteRelaxed(ctx context.Context, id string) error {
	s.note("DeleteRelaxed")
	return s.Store.Delete(ctx, id)
}

func (s *callsStore) take() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.calls
	s.calls = nil
	return c
}

// The records of a MountOnly backend's volumes (tmpfs) are written relaxed,
// without waiting for the disk; every other backend's (dir: storage that
// outlives a power loss) durably.
func TestRecordsOfMountOnlyBackendsAreRelaxed(t *testing.T) {
	var cs *callsStore
	h, fake, _ := fakeHarness(t, func(o *framework.Options) {
		cs = &callsStore{Store: o.State.Store}
		o.State.Store = cs
	})
	k := h.Kubelet
	for _, tc := range []struct {
		vol        drivertest.InlineVolume
		pub, unpub string
	}{
		{drivertest.InlineVolume{Name: "mem", Attributes: map[string]string{"size": "1Mi"}}, "PutRelaxed tmpfs Published", "DeleteRelaxed"},
		{dirVolume("files"), "Put dir Published", "Delete"},
	} {
		pod := k.NewPod("ns", "p-"+tc.vol.Name)
		cs.take()
		if err := publishFake(t, h, fake, pod, tc.vol); err != nil {
			t.Fatal(err)
		}
		if got := cs.take(); len(got) != 1 || got[0] != tc.pub {
			t.Errorf("%s: publish wrote %q, want [%s]", tc.vol.Name, got, tc.pub)
		}
		req := k.PublishRequest(pod, tc.vol)
		if _, err := h.Node.NodeUnpublishVolume(t.Context(), &csi.NodeUnpublishVolumeRequest{VolumeId: req.VolumeId, TargetPath: req.TargetPath}); err != nil {
			t.Fatal(err)
		}
		if got := cs.take(); len(got) != 1 || got[0] != tc.unpub {
			t.Errorf("%s: unpublish wrote %q, want [%s]", tc.vol.Name, got, tc.unpub)
		}
	}
}
