package lifecycle

import (
	"bufio"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/metrics"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/store"
)

type eventFunc func(pod api.Pod, eventType, reason, message string)

func (f eventFunc) Event(pod api.Pod, eventType, reason, message string) {
	f(pod, eventType, reason, message)
}

func newObsEngine(t *testing.T, sink EventSink) *Engine {
	t.Helper()
	cfg := testConfig(t.TempDir(), map[string]any{"b": funcs{}})
	cfg.DriverName = "obs.csi.ephemera.dev"
	if sink != nil {
		cfg.Observability.Events = sink
	}
	return newTestEngine(t, cfg, mount.NewFake())
}

// metricLines returns the exposition lines of d's metrics that start with prefix.
func metricLines(t *testing.T, d *Engine, prefix string) []string {
	t.Helper()
	rec := httptest.NewRecorder()
	d.metrics.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
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
	d := newObsEngine(t, eventFunc(func(pod api.Pod, eventType, reason, message string) {
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

// The volume gauges are the capacity accounting, read at scrape time.
func TestVolumeGaugesFollowCapacity(t *testing.T) {
	d := newObsEngine(t, nil)
	if err := d.capacity.Reserve("obs", "b", "p", 10); err != nil {
		t.Fatal(err)
	}
	if err := d.capacity.Reserve("obs", "b", "p", 5); err != nil {
		t.Fatal(err)
	}
	d.capacity.Release("b", "p", 10)
	// A record of a backend the driver no longer has still shows.
	d.capacity.Reset(append(recordsOf("b", 7, 8), recordsOf("retired", 3)...))
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
