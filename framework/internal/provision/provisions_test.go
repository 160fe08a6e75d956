package provision

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/errkind"
	"github.com/ephemera-csi/ephemera/framework/internal/metrics"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// TestProvisions: a Create that outlives the publish's wait is Aborted and
// IsStillProvisioning, keeps running, reports slow once, and a retry
// attaches to its result and its State; past the backend's share Start is
// ResourceExhausted; Stop cancels a running one and hands its State to the
// record; without one, Attach is Internal and Stop does nothing.
func TestProvisions(t *testing.T) {
	var mu sync.Mutex
	var slow []string
	p := NewProvisions(Config{
		OperationTimeout: 200 * time.Millisecond, ProvisionTimeout: 10 * time.Second, MaxPerBackend: 1,
		OnSlow: func(pod api.Pod, message string) {
			mu.Lock()
			defer mu.Unlock()
			slow = append(slow, pod.Name+": "+message)
		},
	})
	p.SetMetrics(metrics.New(metrics.Config{DriverName: "test", Backends: []string{"slow"}}))
	p.SetSlowAfter(50 * time.Millisecond)
	ctx := context.Background()
	release := make(chan struct{})
	create := func(ctx context.Context, v *api.Volume) (api.Source, error) {
		v.State["step"] = "made"
		select {
		case <-release:
			return api.Source{Path: "/made/" + v.ID}, nil
		case <-ctx.Done():
			v.State["step"] = "cancelled"
			return api.Source{}, ctx.Err()
		}
	}
	v := &api.Volume{ID: "v1", Name: "data", Backend: "slow", Pod: api.Pod{Name: "p", Namespace: "ns"}, State: map[string]string{}}
	_, err := p.Start(ctx, v, create)
	if !IsStillProvisioning(err) || errkind.Code(err) != codes.Aborted || !strings.Contains(err.Error(), "volume v1 is still provisioning") {
		t.Fatalf("Start of a Create that outlives the wait: %v, want Aborted, still provisioning", err)
	}
	if !p.Running("v1") || len(v.State) != 0 {
		t.Fatalf("Running = %v, State %v: want running, the caller's State untouched", p.Running("v1"), v.State)
	}
	v2 := &api.Volume{ID: "v2", Backend: "slow", State: map[string]string{}}
	if _, err := p.Start(ctx, v2, create); errkind.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "--max-in-flight-per-backend 1") {
		t.Errorf("a second Create of the backend: %v, want ResourceExhausted naming the share", err)
	}
	close(release)
	src, err := p.Attach(ctx, v)
	if err != nil || src.Path != "/made/v1" || v.State["step"] != "made" {
		t.Fatalf("Attach: %v, %v, State %v; want the Create's source and State", src, err, v.State)
	}
	if p.Running("v1") {
		t.Error("still Running after its result was taken")
	}
	mu.Lock()
	if len(slow) != 1 || !strings.HasPrefix(slow[0], "p: Volume data is still being provisioned by backend slow") {
		t.Errorf("slow reports %q, want one for pod p", slow)
	}
	mu.Unlock()

	// Stop cancels and waits; the record gets the State the Create left.
	v3 := &api.Volume{ID: "v3", Backend: "slow", State: map[string]string{}}
	block := func(ctx context.Context, v *api.Volume) (api.Source, error) {
		v.State["step"] = "half"
		<-ctx.Done()
		return api.Source{}, ctx.Err()
	}
	if _, err := p.Start(ctx, v3, block); !IsStillProvisioning(err) {
		t.Fatalf("Start: %v", err)
	}
	rec := &store.Record{VolumeID: "v3", Backend: "slow"}
	if err := p.Stop(ctx, rec); err != nil || rec.State["step"] != "half" {
		t.Errorf("Stop: %v, record State %v; want nil and the State the Create left", err, rec.State)
	}
	if p.Running("v3") {
		t.Error("Running after Stop")
	}
	if _, err := p.Attach(ctx, v3); errkind.Code(err) != codes.Internal {
		t.Errorf("Attach without a Create: %v, want Internal", err)
	}
	if err := p.Stop(ctx, &store.Record{VolumeID: "none"}); err != nil {
		t.Errorf("Stop without a Create: %v", err)
	}
	if err := p.StopAll(); err != nil {
		t.Errorf("StopAll: %v", err)
	}
}
