package lifecycle

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/metrics"
	"github.com/ephemera-csi/ephemera/framework/internal/words"
	"github.com/ephemera-csi/ephemera/framework/mount"
)

// static is a backend of the tests: x, with the optional interfaces its type
// implements (framework's adapter asks framework.As; these backends are not
// dynamic).
type static struct{ x any }

func (s static) Create(ctx context.Context, v *api.Volume) (api.Source, error) {
	return s.x.(interface {
		Create(context.Context, *api.Volume) (api.Source, error)
	}).Create(ctx, v)
}

func (s static) Delete(ctx context.Context, v *api.Volume) error {
	return s.x.(interface {
		Delete(context.Context, *api.Volume) error
	}).Delete(ctx, v)
}

func (s static) Lister() Lister  { l, _ := s.x.(Lister); return l }
func (s static) Finder() Finder  { f, _ := s.x.(Finder); return f }
func (s static) MountOnly() bool { _, ok := s.x.(interface{ MountOnly() }); return ok }
func (s static) LongProvisioning() bool {
	_, ok := s.x.(interface{ LongProvisioning() })
	return ok
}
func (s static) Planner() Planner                 { return nil }
func (s static) Stamper() Stamper                 { st, _ := s.x.(Stamper); return st }
func (s static) ContentProvider() ContentProvider { cp, _ := s.x.(ContentProvider); return cp }
func (s static) Authorizer() Authorizer           { a, _ := s.x.(Authorizer); return a }
func (s static) HealthChecker() HealthChecker     { hc, _ := s.x.(HealthChecker); return hc }
func (s static) Attributes() api.Attributes       { return nil }
func (s static) Unwrap() any                      { return s.x }

// funcs is a backend of two functions.
type funcs struct {
	create func(context.Context, *api.Volume) (api.Source, error)
	del    func(context.Context, *api.Volume) error
}

func (f funcs) Create(ctx context.Context, v *api.Volume) (api.Source, error) {
	return f.create(ctx, v)
}
func (f funcs) Delete(ctx context.Context, v *api.Volume) error { return f.del(ctx, v) }

// testConfig is a Config with framework.Options' defaults, for a driver of
// backends on a kubelet at root.
func testConfig(root string, backends map[string]any) Config {
	cfg := Config{
		DriverName: "lifecycle.test",
		Node:       NodeConfig{KubeletRootDir: root},
		Backends:   map[string]Backend{},
		Limits: LimitConfig{
			OperationTimeout: 90 * time.Second, MaxVolumesPerNode: 1 << 20, MaxVolumesPerPod: 16,
			MaxInFlight: 64, MaxInFlightPerBackend: 64, InFlightReservedPerBackend: 4,
		},
		Volumes:       VolumeConfig{ContentTimeout: 30 * time.Second, ContentBytesInFlight: 16 << 20, ContentCapacity: 64 << 20, RefreshConcurrency: 4},
		GC:            GCConfig{Interval: time.Minute, OrphanGracePeriod: 2 * time.Minute, MaxOrphanShare: 0.5},
		Observability: ObservabilityConfig{Logger: klog.Background()},
	}
	for name, b := range backends {
		cfg.Backends[name] = static{b}
	}
	return cfg
}

// newTestEngine builds the engine of cfg with mounter m and metrics.
func newTestEngine(t *testing.T, cfg Config, m mount.Interface) *Engine {
	t.Helper()
	var running atomic.Bool
	d, err := New(cfg, words.Words{}, m, &running)
	if err != nil {
		t.Fatal(err)
	}
	d.SetMetrics(metrics.New(metrics.Config{DriverName: cfg.DriverName, Backends: backendNames(cfg.Backends), Usage: d.Usage, Inflight: d.InFlight}))
	return d
}
