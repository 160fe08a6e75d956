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

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/metrics"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/store"
	"github.com/ephemera-csi/ephemera/framework/store/memstore"
)

type eventFunc func(pod api.Pod, eventType, reason, message string)

func (f eventFunc) Event(pod api.Pod, eventType, reason, message string) {
	f(pod, eventType, reason, message)
}

func newObsDriver(t *testing.T, sink EventSink) *Driver {
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
		Volumes:       VolumeOptions{Mounter: mount.NewFake()},
		State:         StateOptions{Store: memstore.New()},
		Observability: ObservabilityOptions{Events: sink},
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

// The orphan GC reports through gcObserved: one count per volume and result,
// and an OrphanRemoved event for a removed volume.
func TestGCObserved(t *testing.T) {
	var got []string
	d := newObsDriver(t, eventFunc(func(pod api.Pod, eventType, reason, message string) {
		got = append(got, pod.Namespace+"/"+pod.Name+" "+eventType+" "+reason+": "+message)
	}))
	rec := &store.Record{VolumeID: "csi-1", VolumeName: "scratch", Pod: api.Pod{Namespace: "ns", Name: "gone", UID: "u1"}}
	d.gcObserved(rec, metrics.GCRemoved)
	d.gcObserved(rec, metrics.GCFailed)
	d.gcObserved(rec, "pending")

	want := []string{`ephemera_gc_total{result="failed"} 1`, `ephemera_gc_total{result="pending"} 1`, `ephemera_gc_total{result="removed"} 1`}
	if lines := metricLines(t, d, "ephemera_gc_total{"); strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("gc metrics:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	if len(got) != 1 || got[0] != `ns/gone Normal OrphanRemoved: removed volume "scratch" left behind by the deleted pod (uid u1)` {
		t.Errorf("events %q", got)
	}
}

// Recording an RPC allocates nothing once its series exist: NodeGetCapabilities
// and Probe are on the hot path.
func TestObserveRPCAllocs(t *testing.T) {
	d := newObsDriver(t, nil)
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

// The volume gauges are the capacity accounting, read at scrape time.
func TestVolumeGaugesFollowCapacity(t *testing.T) {
	d := newObsDriver(t, nil)
	if err := d.capacity.reserve("obs", "b", "p", 10); err != nil {
		t.Fatal(err)
	}
	if err := d.capacity.reserve("obs", "b", "p", 5); err != nil {
		t.Fatal(err)
	}
	d.capacity.release("b", "p", 10)
	// A record of a backend the driver no longer has still shows.
	d.capacity.reset(append(recordsOf("b", 7, 8), recordsOf("retired", 3)...))
	want := []string{`ephemera_volume_bytes{backend="b"} 15`, `ephemera_volume_bytes{backend="retired"} 3`}
	if lines := metricLines(t, d, "ephemera_volume_bytes{"); strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("bytes: %q, want %q", lines, want)
	}
	want = []string{`ephemera_volumes{backend="b"} 2`, `ephemera_volumes{backend="retired"} 1`}
	if lines := metricLines(t, d, "ephemera_volumes{"); strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("volumes: %q, want %q", lines, want)
	}
}

func recordsOf(backend string, sizes ...int64) []*store.Record {
	var recs []*store.Record
	for _, s := range sizes {
		recs = append(recs, &store.Record{Backend: backend, Size: s})
	}
	return recs
}

func TestValidateMetricsAddress(t *testing.T) {
	for addr, ok := range map[string]bool{"": true, ":9809": true, "127.0.0.1:0": true, "[::1]:9809": true, "9809": false, ":http": false, "host:99999": false} {
		if err := validateMetricsAddress(addr); (err == nil) != ok {
			t.Errorf("validateMetricsAddress(%q) = %v", addr, err)
		}
	}
}
