package framework_test

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/drivers/tmpfs"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// GET /volumes lists what the driver holds: one entry per volume, with its
// pod, backend, size and phase, whether it is mounted and, for a volume with a
// filesystem of its own, its usage; never attributes or hashes.
func TestVolumesOverHTTP(t *testing.T) {
	h, fake, _ := fakeHarness(t, func(o *framework.Options) { o.Observability.MetricsAddress = "127.0.0.1:0"; o.Node.Version = "v9" })
	pod := h.Kubelet.NewPod("ns", "web")
	tmp := drivertest.InlineVolume{Name: "scratch", Attributes: map[string]string{"size": "2Mi", "mode": "0700"}}
	if err := publishFake(t, h, fake, pod, tmp); err != nil {
		t.Fatal(err)
	}
	if err := publishFake(t, h, fake, pod, dirVolume("cache")); err != nil {
		t.Fatal(err)
	}
	// The Fake mounts nothing: give the tmpfs target a real directory to statfs.
	if err := os.MkdirAll(h.Kubelet.TargetPath(pod, "scratch"), 0o750); err != nil {
		t.Fatal(err)
	}

	resp, err := http.Get("http://" + h.Driver().MetricsAddr() + "/volumes")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET /volumes: %s %q %v\n%s", resp.Status, resp.Header.Get("Content-Type"), err, body)
	}
	for _, leak := range []string{"params", "hash", "0700", "state"} {
		if strings.Contains(string(body), leak) {
			t.Errorf("the list shows %q:\n%s", leak, body)
		}
	}
	var list api.VolumeList
	if err := json.Unmarshal(body, &list); err != nil {
		t.Fatal(err)
	}
	if list.Driver != "test.csi.ephemera.dev" || list.Node != "node-1" || list.Version != "v9" || len(list.Volumes) != 2 {
		t.Fatalf("list %+v", list)
	}
	byName := map[string]api.VolumeInfo{}
	for i, v := range list.Volumes {
		byName[v.VolumeName] = v
		if i > 0 && list.Volumes[i-1].VolumeID >= v.VolumeID {
			t.Errorf("not ordered by volume ID: %s before %s", list.Volumes[i-1].VolumeID, v.VolumeID)
		}
		if v.Pod.Namespace != "ns" || v.Pod.Name != "web" || v.Pod.UID != pod.UID || v.Phase != string(store.PhasePublished) ||
			!v.Mounted || v.Created.IsZero() || v.TargetPath != h.Kubelet.TargetPath(pod, v.VolumeName) || v.Error != "" {
			t.Errorf("volume %+v", v)
		}
	}
	if v := byName["scratch"]; v.Backend != "tmpfs" || v.Size != 2<<20 || v.Usage == nil || v.Usage.BytesTotal <= 0 {
		t.Errorf("tmpfs volume %+v (usage %+v)", v, v.Usage)
	}
	if v := byName["cache"]; v.Backend != "dir" || v.Usage != nil {
		t.Errorf("dir volume %+v: its statfs would be the host's, want no usage", v)
	}

	// Unmounted behind the driver's back: listed, not mounted, no usage.
	if err := fake.Unmount(h.Options.Node.KubeletRootDir, h.Kubelet.TargetPath(pod, "scratch")); err != nil {
		t.Fatal(err)
	}
	recs, err := h.Driver().Records(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range framework.DescribeVolumes(recs, h.Options.Node.KubeletRootDir, fake) {
		if v.VolumeName == "scratch" && (v.Mounted || v.Usage != nil) {
			t.Errorf("unmounted volume %+v", v)
		}
	}
}

// Before the driver serves, /volumes says so.
func TestVolumesBeforeRun(t *testing.T) {
	d, err := framework.New(framework.Options{DriverName: "test.csi.ephemera.dev", Backends: map[string]framework.Backend{"tmpfs": newTmpfs(t, tmpfs.Options{})}, Node: framework.NodeOptions{ID: "n"}})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := handlerGet(d.Handler(), "/volumes")()
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("GET /volumes before Run: %s, want 503", resp.Status)
	}
}

// With Options.Observability.VolumesEndpoint false, GET /volumes answers 404 (on the
// MetricsAddress server and on Handler) and nothing else changes: /metrics,
// /healthz and /readyz answer as with it on, and volumes are published.
func TestVolumesEndpointOff(t *testing.T) {
	for _, on := range []bool{true, false} {
		h, fake, _ := fakeHarness(t, func(o *framework.Options) {
			o.Observability.MetricsAddress = "127.0.0.1:0"
			if !on {
				o.Observability.VolumesEndpoint = new(false)
			}
		})
		pod := h.Kubelet.NewPod("ns", "web")
		if err := publishFake(t, h, fake, pod, dirVolume("cache")); err != nil {
			t.Fatalf("on=%v: publish: %v", on, err)
		}
		want := map[string]int{"/metrics": http.StatusOK, "/healthz": http.StatusOK, "/readyz": http.StatusOK, "/volumes": http.StatusOK}
		if !on {
			want["/volumes"] = http.StatusNotFound
		}
		for path, code := range want {
			if got := statusOf(t, "http://"+h.Driver().MetricsAddr()+path); got != code {
				t.Errorf("on=%v: GET %s over HTTP: %d, want %d", on, path, got, code)
			}
			resp, _ := handlerGet(h.Driver().Handler(), path)()
			resp.Body.Close()
			if resp.StatusCode != code {
				t.Errorf("on=%v: GET %s from Handler: %d, want %d", on, path, resp.StatusCode, code)
			}
		}
	}
}
