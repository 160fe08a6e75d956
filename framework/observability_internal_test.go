package framework

import (
	"bufio"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/store/memstore"
)

func newObsDriver(t *testing.T) *Driver {
	t.Helper()
	root := t.TempDir()
	d, err := New(Options{
		DriverName: "obs.csi.ephemera.dev",
		Backends:   map[string]Backend{"b": BackendFuncs{}},
		Node: NodeOptions{
			ID:             "n",
			KubeletRootDir: filepath.Join(root, "kubelet"),
			StateDir:       filepath.Join(root, "state"),
		},
		Volumes: VolumeOptions{Mounter: mount.NewFake()},
		State:   StateOptions{Store: memstore.New()},
	})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// metricLines returns the exposition lines of d's /metrics that start with prefix.
func metricLines(t *testing.T, d *Driver, prefix string) []string {
	t.Helper()
	rec := httptest.NewRecorder()
	d.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("/metrics %d", rec.Code)
	}
	var out []string
	sc := bufio.NewScanner(rec.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), prefix) {
			out = append(out, sc.Text())
		}
	}
	return out
}

// Recording an RPC allocates nothing once its series exist: NodeGetCapabilities
// and Probe are on the hot path.
func TestObserveRPCAllocs(t *testing.T) {
	d := newObsDriver(t)
	for _, c := range []codes.Code{codes.OK, codes.Aborted} {
		d.metrics.ObserveRPC("/csi.v1.Node/NodeGetCapabilities", c, time.Millisecond)
		if n := testing.AllocsPerRun(100, func() {
			d.metrics.ObserveRPC("/csi.v1.Node/NodeGetCapabilities", c, time.Millisecond)
		}); n != 0 {
			t.Errorf("ObserveRPC(%v) allocates %v times", c, n)
		}
	}
	if lines := metricLines(t, d, `csi_plugin_operations_seconds_count{driver_name="obs.csi.ephemera.dev",grpc_status_code="Aborted",method_name="/csi.v1.Node/NodeGetCapabilities"}`); len(lines) != 1 || !strings.HasSuffix(lines[0], " 102") { // 1 + AllocsPerRun's warm-up and 100 runs
		t.Errorf("csi_plugin_operations_seconds: %q", lines)
	}
}
