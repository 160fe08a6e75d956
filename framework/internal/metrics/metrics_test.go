package metrics_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"

	"github.com/ephemera-csi/ephemera/framework/internal/metrics"
)

func TestMetrics(t *testing.T) {
	m := metrics.New(metrics.Config{
		DriverName: "d",
		Version:    "v1",
		Backends:   []string{"tmpfs"},
		Capacity:   map[string]int64{"tmpfs": 1 << 30},
		Methods:    []string{"/csi.v1.Node/NodePublishVolume"},
		Usage:      func() map[string]metrics.Usage { return map[string]metrics.Usage{"tmpfs": {Volumes: 1, Bytes: 64}} },
		Inflight:   func() int { return 2 },
	})
	m.ObserveRPC("/csi.v1.Node/NodePublishVolume", codes.OK, time.Millisecond)
	m.ObserveRPC("/csi.v1.Identity/Probe", codes.Unavailable, time.Millisecond) // not pre-listed
	m.ObserveBackend("tmpfs", metrics.OpCreate, nil, time.Millisecond)
	m.Reconciled(metrics.ReconcileRolledBack)
	m.Refreshed(nil)
	// Authors add their own metrics to the same registry.
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "mydriver_things_total", Help: "Things."})
	m.Registry().MustRegister(c)
	c.Inc()

	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	body := rec.Body.String()
	for _, want := range []string{
		`ephemera_rpc_duration_seconds_count{code="OK",method="NodePublishVolume"} 1`,
		`ephemera_rpc_duration_seconds_count{code="Unavailable",method="Probe"} 1`,
		`csi_plugin_operations_seconds_count{driver_name="d",grpc_status_code="OK",method_name="/csi.v1.Node/NodePublishVolume"} 1`,
		`csi_plugin_operations_seconds_count{driver_name="d",grpc_status_code="Unavailable",method_name="/csi.v1.Identity/Probe"} 1`,
		`csi_plugin_operations_seconds_bucket{driver_name="d",grpc_status_code="OK",method_name="/csi.v1.Node/NodePublishVolume",le="0.1"} 1`,
		`ephemera_capacity_bytes{backend="tmpfs"} 1.073741824e+09`,
		`ephemera_backend_operation_duration_seconds_count{backend="tmpfs",op="create",result="ok"} 1`,
		`ephemera_reconcile_total{result="rolled_back"} 1`,
		`ephemera_refresh_total{result="ok"} 1`,
		`ephemera_refresh_total{result="failed"} 0`,
		`ephemera_volumes{backend="tmpfs"} 1`,
		`ephemera_volume_bytes{backend="tmpfs"} 64`,
		`ephemera_inflight_operations 2`,
		`ephemera_build_info{driver="d",version="v1"} 1`,
		`mydriver_things_total 1`,
	} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("missing %s", want)
		}
	}
	if strings.Contains(body, "ephemera_errors_total") {
		t.Error("ephemera_errors_total is back: it duplicates ephemera_rpc_duration_seconds_count")
	}
}

// Two drivers in one process have separate registries.
func TestSeparateRegistries(t *testing.T) {
	a, b := metrics.New(metrics.Config{DriverName: "a"}), metrics.New(metrics.Config{DriverName: "b"})
	a.GC(metrics.GCRemoved)
	rec := httptest.NewRecorder()
	b.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if !strings.Contains(rec.Body.String(), `ephemera_gc_total{result="removed"} 0`) {
		t.Error("driver b sees driver a's GC")
	}
}
