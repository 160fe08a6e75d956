package framework_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/ephemera-csi/ephemera/framework/events/eventstest"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/events"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/store/memstore"
)

// scrape parses a Prometheus text exposition into "name{labels}" → value, with
// the labels as printed (sorted by name).
func scrape(t *testing.T, get func() (*http.Response, error)) map[string]float64 {
	t.Helper()
	resp, err := get()
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("/metrics: %s: %s", resp.Status, b)
	}
	m := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("bad sample %q: %v", line, err)
		}
		m[line[:i]] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return m
}

func httpGet(url string) func() (*http.Response, error) {
	return func() (*http.Response, error) { return http.Get(url) }
}

func handlerGet(h http.Handler, path string) func() (*http.Response, error) {
	return func() (*http.Response, error) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Result(), nil
	}
}

func statusOf(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// allowedLabels are the only labels the framework's metrics carry: no volume,
// pod or path may become a series.
var allowedLabels = map[string]bool{"method": true, "code": true, "backend": true, "op": true, "result": true, "driver": true, "version": true, "le": true}

var labelName = regexp.MustCompile(`([a-z_]+)="`)

func TestMetricsOverHTTP(t *testing.T) {
	h, fake, _ := fakeHarness(t, func(o *framework.Options) { o.Observability.MetricsAddress = "127.0.0.1:0" })
	addr := h.Driver().MetricsAddr()
	if !strings.HasPrefix(addr, "127.0.0.1:") || strings.HasSuffix(addr, ":0") {
		t.Fatalf("MetricsAddr() = %q, want the bound 127.0.0.1 port", addr)
	}
	base := "http://" + addr

	pod := h.Kubelet.NewPod("ns", "web")
	sizes := map[string]string{"a": "1Mi", "b": "2Mi", "c": "4Mi"}
	for _, name := range []string{"a", "b", "c"} {
		vol := drivertest.InlineVolume{Name: name, Attributes: map[string]string{"size": sizes[name]}}
		if err := publishFake(t, h, fake, pod, vol); err != nil {
			t.Fatalf("publish %s: %v", name, err)
		}
	}
	// tmpfs without a size (and no default) is refused.
	err := publishFake(t, h, fake, pod, drivertest.InlineVolume{Name: "nosize"})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("publish without size: %v, want InvalidArgument", err)
	}
	c := h.Kubelet.TargetPath(pod, "c")
	if _, err := h.Node.NodeUnpublishVolume(t.Context(), &csi.NodeUnpublishVolumeRequest{
		VolumeId: h.Kubelet.PublishRequest(pod, drivertest.InlineVolume{Name: "c"}).GetVolumeId(), TargetPath: c,
	}); err != nil {
		t.Fatalf("unpublish c: %v", err)
	}

	m := scrape(t, httpGet(base+"/metrics"))
	want := map[string]float64{
		`ephemera_volumes{backend="tmpfs"}`:                                                      2,
		`ephemera_volumes{backend="dir"}`:                                                        0,
		`ephemera_volume_bytes{backend="tmpfs"}`:                                                 3 << 20,
		`ephemera_volume_bytes{backend="dir"}`:                                                   0,
		`ephemera_rpc_duration_seconds_count{code="OK",method="NodePublishVolume"}`:              3,
		`ephemera_rpc_duration_seconds_count{code="InvalidArgument",method="NodePublishVolume"}`: 1,
		`ephemera_rpc_duration_seconds_count{code="OK",method="NodeUnpublishVolume"}`:            1,
		`csi_plugin_operations_seconds_count{driver_name="test.csi.ephemera.dev",grpc_status_code="InvalidArgument",method_name="/csi.v1.Node/NodePublishVolume"}`: 1,
		`ephemera_backend_operation_duration_seconds_count{backend="tmpfs",op="create",result="ok"}`:                                                               3,
		`ephemera_backend_operation_duration_seconds_count{backend="tmpfs",op="delete",result="ok"}`:                                                               1,
		`ephemera_inflight_operations`:                                                                          0,
		`ephemera_reconcile_total{result="rolled_back"}`:                                                        0,
		`ephemera_reconcile_total{result="orphan_deleted"}`:                                                     0,
		`ephemera_reconcile_total{result="failed"}`:                                                             0,
		`ephemera_gc_total{result="removed"}`:                                                                   0,
		`ephemera_refresh_total{result="ok"}`:                                                                   0,
		`ephemera_build_info{driver="test.csi.ephemera.dev",version="dev"}`:                                     1,
		`ephemera_rpc_duration_seconds_bucket{code="OK",method="NodePublishVolume",le="+Inf"}`:                  3,
		`ephemera_rpc_duration_seconds_bucket{code="InvalidArgument",method="NodePublishVolume",le="+Inf"}`:     1,
		`ephemera_backend_operation_duration_seconds_bucket{backend="tmpfs",op="create",result="ok",le="+Inf"}`: 3,
	}
	for k, v := range want {
		got, ok := m[k]
		if !ok {
			t.Errorf("%s missing", k)
		} else if got != v {
			t.Errorf("%s = %v, want %v", k, got, v)
		}
	}
	for k := range m {
		if strings.HasPrefix(k, "ephemera_errors_total") {
			t.Errorf("%s: ephemera_errors_total duplicated ephemera_rpc_duration_seconds_count and is gone", k)
		}
		if !strings.HasPrefix(k, "ephemera_") {
			continue
		}
		for _, l := range labelName.FindAllStringSubmatch(k, -1) {
			if !allowedLabels[l[1]] {
				t.Errorf("series %s has label %q", k, l[1])
			}
		}
	}
	for _, k := range []string{"go_goroutines", "process_start_time_seconds"} {
		if _, ok := m[k]; !ok {
			t.Errorf("%s missing: Go and process collectors not registered", k)
		}
	}

	if got := statusOf(t, base+"/healthz"); got != http.StatusOK {
		t.Errorf("/healthz %d", got)
	}
	if got := statusOf(t, base+"/readyz"); got != http.StatusOK {
		t.Errorf("/readyz %d", got)
	}
	probe, err := h.Identity.Probe(t.Context(), &csi.ProbeRequest{})
	if err != nil || !probe.GetReady().GetValue() {
		t.Errorf("Probe %v, %v; want ready like /readyz", probe, err)
	}

	h.Stop()
	if got := h.Driver().MetricsAddr(); got != "" {
		t.Errorf("MetricsAddr() after stop = %q", got)
	}
	if _, err := http.Get(base + "/healthz"); err == nil {
		t.Error("metrics server still answers after Run returned")
	}
}

// blockingLister is a backend whose inventory listing (during the startup
// reconcile) waits until released, and reports one storage without a record.
type blockingLister struct {
	listing chan struct{}
	release chan struct{}
	deleted chan string
}

func (b *blockingLister) Create(context.Context, *api.Volume) (api.Source, error) {
	return api.Source{}, errors.New("not used")
}

func (b *blockingLister) Delete(_ context.Context, v *api.Volume) error {
	b.deleted <- v.ID
	return nil
}

func (b *blockingLister) List(ctx context.Context) ([]string, error) {
	close(b.listing)
	select {
	case <-b.release:
		return []string{"csi-leftover"}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func TestReadyzDuringReconcile(t *testing.T) {
	sock, err := os.MkdirTemp("", "ephemera-obs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sock) })
	root := t.TempDir()
	b := &blockingLister{listing: make(chan struct{}), release: make(chan struct{}), deleted: make(chan string, 1)}
	d, err := framework.New(framework.Options{
		DriverName: "test.csi.ephemera.dev",
		Backends:   map[string]framework.Backend{"slow": b},
		Node: framework.NodeOptions{
			ID:             "node-1",
			Endpoint:       "unix://" + filepath.Join(sock, "csi.sock"),
			KubeletRootDir: filepath.Join(root, "kubelet"),
			StateDir:       filepath.Join(root, "state"),
		},
		Volumes:       framework.VolumeOptions{Mounter: mount.NewFake()},
		State:         framework.StateOptions{Store: memstore.New()},
		Observability: framework.ObservabilityOptions{MetricsAddress: "127.0.0.1:0"},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})

	select {
	case <-b.listing:
	case err := <-done:
		t.Fatalf("Run: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("reconcile never listed the backend")
	}
	base := "http://" + d.MetricsAddr()
	if got := statusOf(t, base+"/healthz"); got != http.StatusOK {
		t.Errorf("/healthz during reconcile: %d, want 200", got)
	}
	if got := statusOf(t, base+"/readyz"); got != http.StatusServiceUnavailable {
		t.Errorf("/readyz during reconcile: %d, want 503", got)
	}
	if _, err := os.Stat(filepath.Join(sock, "csi.sock")); err == nil {
		t.Error("the CSI socket is served during the reconcile")
	}
	if m := scrape(t, httpGet(base+"/metrics")); m[`ephemera_volumes{backend="slow"}`] != 0 {
		t.Errorf("volumes during reconcile: %v", m[`ephemera_volumes{backend="slow"}`])
	}

	close(b.release)
	deadline := time.Now().Add(30 * time.Second)
	for statusOf(t, base+"/readyz") != http.StatusOK {
		if time.Now().After(deadline) {
			t.Fatal("/readyz not 200 after reconcile")
		}
		time.Sleep(5 * time.Millisecond)
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(sock, "csi.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if p, err := csi.NewIdentityClient(conn).Probe(t.Context(), &csi.ProbeRequest{}); err != nil || !p.GetReady().GetValue() {
		t.Errorf("Probe after reconcile: %v, %v; want ready like /readyz", p, err)
	}
	m := scrape(t, httpGet(base+"/metrics"))
	for k, v := range map[string]float64{
		// The backend has no stamp: the store cannot prove the storage a
		// leftover, so it is kept as unclaimed, never deleted.
		`ephemera_reconcile_total{result="unclaimed"}`:                                              1,
		`ephemera_reconcile_total{result="orphan_deleted"}`:                                         0,
		`ephemera_backend_operation_duration_seconds_count{backend="slow",op="list",result="ok"}`:   1,
		`ephemera_backend_operation_duration_seconds_count{backend="slow",op="delete",result="ok"}`: 0,
	} {
		if m[k] != v {
			t.Errorf("%s = %v, want %v", k, m[k], v)
		}
	}
}

// sink records events in memory.
type sink struct {
	mu     sync.Mutex
	events []string
}

func (s *sink) Event(pod api.Pod, eventType, reason, message string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, fmt.Sprintf("%s/%s %s %s: %s", pod.Namespace, pod.Name, eventType, reason, message))
}

func (s *sink) list() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.events...)
}

func TestRefreshFailureCountedAndReported(t *testing.T) {
	var fail sync.Mutex
	failing := false
	ev := &sink{}
	h, fake, _ := fakeHarness(t, func(o *framework.Options) {
		o.Observability.Events = ev
		o.Content = framework.ContentFunc(func(context.Context, *api.Volume) (map[string]api.File, error) {
			fail.Lock()
			defer fail.Unlock()
			if failing {
				return nil, errors.New("CA bundle source unreachable")
			}
			return map[string]api.File{"ca.crt": {Data: []byte("x")}}, nil
		})
	})
	pod := h.Kubelet.NewPod("ns", "app")
	vol := dirVolume("certs")
	// The fake mounter mounts nothing: content lands in a plain directory.
	if err := os.MkdirAll(h.Kubelet.TargetPath(pod, "certs"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := publishFake(t, h, fake, pod, vol); err != nil {
		t.Fatal(err)
	}
	fail.Lock()
	failing = true
	fail.Unlock()
	// A republish (requiresRepublish) refreshes; the failure keeps the
	// volume, and is answered with a retryable code (issue 44: never OK).
	if err := publishFake(t, h, fake, pod, vol); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "CA bundle source unreachable") {
		t.Fatalf("republish with failing refresh: %v, want Unavailable with the cause", err)
	}
	fail.Lock()
	failing = false
	fail.Unlock()
	if err := publishFake(t, h, fake, pod, vol); err != nil {
		t.Fatalf("republish: %v", err)
	}
	// The first publish fills the volume; only the republishes are refreshes
	// (plus, on a slow machine, the retry the failure scheduled, which succeeds).
	m := scrape(t, handlerGet(h.Driver().Handler(), "/metrics"))
	if m[`ephemera_refresh_total{result="ok"}`] < 1 || m[`ephemera_refresh_total{result="failed"}`] != 1 {
		t.Errorf("refresh_total ok=%v failed=%v, want >=1 and 1", m[`ephemera_refresh_total{result="ok"}`], m[`ephemera_refresh_total{result="failed"}`])
	}
	got := ev.list()
	if len(got) != 1 || !strings.HasPrefix(got[0], "ns/app Warning RefreshFailed: ") || !strings.Contains(got[0], "CA bundle source unreachable") {
		t.Errorf("events %q, want one RefreshFailed", got)
	}
}

// A failed first publish posts no event: the kubelet's FailedMount event on
// the pod already carries the message the driver returned.
func TestFailedPublishPostsNoEvent(t *testing.T) {
	client := fake.NewClientset()
	rec, err := events.New(events.Options{Client: eventstest.Client{C: client}, DriverName: "test.csi.ephemera.dev", NodeName: "node-1"})
	if err != nil {
		t.Fatal(err)
	}
	h, fm, _ := fakeHarness(t, func(o *framework.Options) {
		o.Observability.Events = rec
		o.Runnables = []framework.Runnable{rec} // the driver runs it
	})
	pod := h.Kubelet.NewPod("ns", "p")
	fm.Fail(mount.MethodMount, func(string) error { return errors.New("mount: no such device") })

	for range 20 {
		err := publishFake(t, h, fm, pod, dirVolume("v"))
		if status.Code(err) != codes.Internal || !strings.Contains(status.Convert(err).Message(), "mount: no such device") {
			t.Fatalf("publish: %v, want Internal with the cause (what the kubelet's FailedMount shows)", err)
		}
	}
	// The recorder writes in order: once an event sent afterwards is there,
	// all the publishes' events were handled.
	rec.Event(api.Pod{Namespace: "ns", Name: "sentinel", UID: "u-sentinel"}, framework.EventTypeNormal, "Sentinel", "done")
	var list *corev1.EventList
	deadline := time.Now().Add(30 * time.Second)
	for {
		var err error
		list, err = client.CoreV1().Events("ns").List(t.Context(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if hasReason(list, "Sentinel") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sentinel event never written; have %d events", len(list.Items))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(list.Items) != 1 {
		t.Errorf("events %+v, want only the sentinel", list.Items)
	}
}

func hasReason(l *corev1.EventList, reason string) bool {
	for _, e := range l.Items {
		if e.Reason == reason {
			return true
		}
	}
	return false
}
