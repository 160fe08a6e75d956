//go:build e2e && linux

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ephemera-csi/ephemera/api"
)

// longprovDriverName is the scratch driver TestLongProvisioning runs beside
// the shared one, with the slow plugin.
const longprovDriverName = "longprov.csi.ephemera.dev"

// longprovDelay is how long the slow plugin's Create takes: past the
// kubelet's 2 minute deadline for one NodePublishVolume.
const longprovDelay = 3 * time.Minute

// TestLongProvisioning: a pod whose volume takes three minutes to create (the
// slow plugin, test/e2e/slowplugin, declaring long provisioning) starts on
// the real kubelet: the driver's first publish answers Aborted ("still
// provisioning") while the Create goes on, the kubelet's retries attach to
// it, and the one that finds it done publishes. On the way, GET /volumes
// shows the volume provisioning and the pod gets one ProvisioningSlow event
// at two minutes. It runs in parallel with the other scenarios: its three
// minutes are mostly waiting.
func TestLongProvisioning(t *testing.T) {
	c := clu
	shared := requireDriver(t)
	t.Parallel()
	t0 := time.Now()
	ctx := context.Background()

	bin := filepath.Join(c.root, "bin", "slowplugin")
	if err := c.goBuildIn(ctx, c.repoRoot, bin, "./test/e2e/slowplugin"); err != nil {
		t.Fatal(err)
	}
	sp := &tokensPlugin{c: c, bin: bin, proc: "plugin-slow", endpoint: "unix://" + filepath.Join(c.root, "plugins-slow", "slow.sock")}
	if err := os.MkdirAll(filepath.Dir(strings.TrimPrefix(sp.endpoint, "unix://")), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := sp.startWith(ctx, "--delay="+longprovDelay.String()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sp.p.stop(10 * time.Second) })
	obj, err := c.csiDriverObject()
	if err != nil {
		t.Fatal(err)
	}
	obj.Name = longprovDriverName
	if _, err := c.cs.StorageV1().CSIDrivers().Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create CSIDriver %s: %v", longprovDriverName, err)
	}
	t.Cleanup(func() {
		_ = c.cs.StorageV1().CSIDrivers().Delete(context.Background(), longprovDriverName, metav1.DeleteOptions{})
	})
	d, err := c.newDriver(&c.node, longprovDriverName, shared.bin, filepath.Join(c.root, "drv-longprov"), "driver-longprov",
		"--driver-name="+longprovDriverName, "--plugin=slow="+sp.endpoint,
		"--events", "--kubeconfig="+filepath.Join(c.root, "admin.kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.stop)
	if err := d.start(ctx); err != nil {
		t.Fatal(err)
	}
	var handle string
	t.Cleanup(func() {
		if !t.Failed() {
			d.assertNoRecords(t, handle)
		}
	})
	t.Logf("slow plugin and driver ready in %v", time.Since(t0).Round(time.Millisecond))

	vol := corev1.Volume{Name: "slow", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
		Driver: longprovDriverName, VolumeAttributes: map[string]string{"backend": "slow", "size": "1Mi"},
	}}}
	p := c.createPod(t, c.newPod("default", "longprov-"+randHex(3), vol, steps(st("write", dataPath+"/f", "16"), st("pause"))))
	t.Cleanup(func() { c.deletePod(t, p, goneTimeout) })
	created := time.Now()
	handle = volumeHandle(string(p.UID), vol.Name)

	// While the Create runs: the driver's volume list says so.
	if err := waitFor(ctx, time.Minute, time.Second, "GET /volumes shows the volume provisioning", func() (bool, error) {
		list, err := d.volumeList(ctx)
		if err != nil {
			return false, err
		}
		for _, v := range list.Volumes {
			if v.VolumeID == handle && v.ProvisioningSince != nil {
				return true, nil
			}
		}
		return false, fmt.Errorf("volumes: %+v", list.Volumes)
	}); err != nil {
		t.Fatal(err)
	}

	msg := c.waitEvent(t, p, regexp.MustCompile(`^Volume slow is still being provisioned by backend slow after 2m0s`), longprovDelay)
	t.Logf("event after %v: %s", time.Since(created).Round(time.Second), msg)
	p = c.waitRunning(t, p, longprovDelay+3*time.Minute)
	took := time.Since(created)
	t.Logf("pod Running %v after its creation (Create takes %v)", took.Round(time.Second), longprovDelay)
	if took < longprovDelay {
		t.Fatalf("pod Running after %v, before the Create could finish (%v)", took, longprovDelay)
	}
	m, err := d.scrapeMetrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := m.sum("ephemera_provisions_outlived_call_total", map[string]string{"backend": "slow"}); n != 1 {
		t.Errorf("ephemera_provisions_outlived_call_total{backend=slow} = %v, want 1", n)
	}
	if n := m.sum("ephemera_provisioning_volumes", map[string]string{"backend": "slow"}); n != 0 {
		t.Errorf("ephemera_provisioning_volumes{backend=slow} = %v after the publish, want 0", n)
	}
	events := c.podEvents(p)
	if n := len(regexp.MustCompile(`ProvisioningSlow`).FindAllString(events, -1)); n != 1 {
		t.Errorf("%d ProvisioningSlow events, want one:\n%s", n, events)
	}
	t.Logf("events:\n%s", events)
}

// volumeList is the driver's GET /volumes.
func (d *driver) volumeList(ctx context.Context) (*api.VolumeList, error) {
	addr, err := d.metricsAddr()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/volumes", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var list api.VolumeList
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return nil, fmt.Errorf("GET http://%s/volumes: %s: %w", addr, resp.Status, err)
	}
	return &list, nil
}
