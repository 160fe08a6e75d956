package framework_test

import (
	"context"
	"errors"
	"maps"
	"sync"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/drivers/tmpfs"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// planner is a tmpfs whose plan says mountOnly while, asked as a
// DynamicBackend, it claims the opposite (as a plugin restarted as another
// version would): the plan must decide.
type planner struct {
	*tmpfs.Backend
	mountOnly bool
	createErr error // Create fails with it, after recording "created: nothing"

	mu      sync.Mutex
	deleted []map[string]string // the State each Delete received
}

func (p *planner) Plan(_ context.Context, v *api.Volume) (framework.Plan, error) {
	v.State = map[string]string{"plan": "made"}
	return framework.Plan{MountOnly: p.mountOnly}, nil
}

func (p *planner) Implements(iface any) bool {
	switch iface.(type) {
	case *framework.MountOnly, *framework.Finder:
		return !p.mountOnly
	}
	return true
}

func (p *planner) Create(ctx context.Context, v *api.Volume) (api.Source, error) {
	if v.State["plan"] != "made" {
		return api.Source{}, errors.New("create without the plan in v.State")
	}
	if p.createErr != nil {
		v.State = map[string]string{"plan": "made", "created": "nothing"}
		return api.Source{}, p.createErr
	}
	return p.Backend.Create(ctx, v)
}

func (p *planner) Delete(_ context.Context, v *api.Volume) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.deleted = append(p.deleted, maps.Clone(v.State))
	return nil
}

// A Planner decides at a first publish what Create will do, in v.State: the
// intent record (written only when the plan is not mount-only, whatever the
// backend claims as a DynamicBackend then) carries it, Create gets it, and
// the rollback's Delete gets what a failed Create left in v.State; the failed
// publish leaves no record and no capacity taken.
func TestPlannerDecidesTheIntent(t *testing.T) {
	for _, tc := range []struct {
		name      string
		mountOnly bool
		createErr error
	}{
		{name: "mount-only", mountOnly: true},
		{name: "storage", mountOnly: false},
		{name: "failed-create", mountOnly: false, createErr: api.ErrUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &planner{Backend: newTmpfs(t, tmpfs.Options{}), mountOnly: tc.mountOnly, createErr: tc.createErr}
			h, fake, st := fakeHarness(t, func(o *framework.Options) {
				o.Backends["planned"] = p
				o.Limits.Capacity = map[string]int64{"planned": 1 << 20}
			})
			var during []*store.Record
			fake.Fail(mount.MethodMount, func(string) error {
				during, _ = st.List(context.Background())
				return nil
			})
			pod := h.Kubelet.NewPod("ns", "p")
			vol := drivertest.InlineVolume{Name: "v", Attributes: map[string]string{"backend": "planned", "size": "1Mi"}}
			err := publishFake(t, h, fake, pod, vol)
			if tc.createErr != nil {
				if status.Code(err) != codes.Unavailable {
					t.Fatalf("publish with a failing Create: %v, want Unavailable", err)
				}
				if len(p.deleted) != 1 || p.deleted[0]["created"] != "nothing" {
					t.Errorf("the rollback's Delete got %v, want the State the failed Create left", p.deleted)
				}
				if recs, _ := st.List(t.Context()); len(recs) != 0 {
					t.Errorf("records after the failed publish: %+v", recs)
				}
				// The budget holds one volume: the failed one's is released.
				p.createErr = nil
				if err := publishFake(t, h, fake, h.Kubelet.NewPod("ns", "next"), vol); err != nil {
					t.Fatalf("publish after the failed one: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			intent := len(during) == 1 && during[0].Phase == store.PhasePublishing
			if intent == tc.mountOnly || (tc.mountOnly && len(during) != 0) {
				t.Errorf("records while mounting: %+v; want an intent record: %v", during, !tc.mountOnly)
			}
			if intent && during[0].State["plan"] != "made" {
				t.Errorf("the intent record's State %v lacks the plan", during[0].State)
			}
			recs, _ := st.List(t.Context())
			if len(recs) != 1 || recs[0].State["plan"] != "made" {
				t.Fatalf("records after the publish: %+v, want one with the plan in its State", recs)
			}
			req := h.Kubelet.PublishRequest(pod, vol)
			if _, err := h.Node.NodeUnpublishVolume(t.Context(), &csi.NodeUnpublishVolumeRequest{VolumeId: req.VolumeId, TargetPath: req.TargetPath}); err != nil {
				t.Fatal(err)
			}
			if len(p.deleted) != 1 || p.deleted[0]["plan"] != "made" {
				t.Errorf("Delete got %v, want the plan", p.deleted)
			}
		})
	}
}
