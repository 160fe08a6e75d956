package plugin_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/drivers/tmpfs"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/plugin"
	"github.com/ephemera-csi/ephemera/framework/pluginserver"
	"github.com/ephemera-csi/ephemera/framework/store"
	"github.com/ephemera-csi/ephemera/framework/store/memstore"
)

// A content-only plugin's volumes are the driver's tmpfs, nothing but their
// mounts: its backend is a Finder and MountOnly like the tmpfs backend, so a
// first publish writes no intent record (and its records are relaxed). A
// plugin that creates storage (CREATE) is neither: its storage may outlive a
// crash, so the record comes before Create. A plugin whose handshake is not
// known (not running) is not claimed to be either.
func TestIntentRecordOnlyForPluginsThatCreate(t *testing.T) {
	content := framework.ContentFunc(func(_ context.Context, v *api.Volume) (map[string]api.File, error) {
		return map[string]api.File{"id": {Data: []byte(v.ID)}}, nil
	})
	mem, err := tmpfs.New(tmpfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		serve  pluginserver.Options
		intent bool
	}{
		{name: "content-only", serve: pluginserver.Options{Content: content}},
		{name: "create", serve: pluginserver.Options{Backend: mem, Content: content}, intent: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newClient(t, plugin.Options{Endpoint: serveInProcess(t, tc.serve)})
			fake, st := mount.NewFake(), memstore.New()
			h := startDriver(t, b, framework.Options{Volumes: framework.VolumeOptions{Mounter: fake, DefaultBackend: "p"}, State: framework.StateOptions{Store: st}})
			_, finds := framework.As[framework.Finder](b)
			_, mountOnly := framework.As[framework.MountOnly](b)
			if finds == tc.intent || mountOnly == tc.intent {
				t.Errorf("Finder %v, MountOnly %v; want %v", finds, mountOnly, !tc.intent)
			}
			var during []*store.Record
			fake.Fail(mount.MethodMount, func(string) error {
				during, _ = st.List(context.Background())
				return nil
			})
			pod := h.Kubelet.NewPod("ns", "p")
			vol := drivertest.InlineVolume{Name: "v", Attributes: map[string]string{"size": "1Mi"}}
			fake.AddDir(filepath.Dir(h.Kubelet.TargetPath(pod, vol.Name)))
			// The content is written through the target: a directory here.
			if err := os.MkdirAll(h.Kubelet.TargetPath(pod, vol.Name), 0o750); err != nil {
				t.Fatal(err)
			}
			req := h.Kubelet.PublishRequest(pod, vol)
			if _, err := h.Node.NodePublishVolume(t.Context(), req); err != nil {
				t.Fatal(err)
			}
			intent := len(during) == 1 && during[0].Phase == store.PhasePublishing
			if intent != tc.intent || (!tc.intent && len(during) != 0) {
				t.Errorf("records while mounting: %+v; want an intent record: %v", during, tc.intent)
			}
			if _, err := h.Node.NodeUnpublishVolume(t.Context(), &csi.NodeUnpublishVolumeRequest{VolumeId: req.VolumeId, TargetPath: req.TargetPath}); err != nil {
				t.Fatal(err)
			}
			if recs, _ := st.List(t.Context()); len(recs) != 0 {
				t.Errorf("records after the unpublish: %+v", recs)
			}
		})
	}
	t.Run("not-running", func(t *testing.T) {
		b := newClient(t, plugin.Options{Endpoint: "unix://" + filepath.Join(sockDir(t), "none.sock"), Timeout: 200e6})
		if _, ok := framework.As[framework.MountOnly](b); ok {
			t.Error("a plugin never reached is said to be MountOnly")
		}
		if _, ok := framework.As[framework.Finder](b); ok {
			t.Error("a plugin never reached is said to be a Finder")
		}
		if _, ok := framework.As[framework.ContentProvider](b); !ok {
			t.Error("a plugin never reached is not said to provide content (its calls should fail Unavailable instead)")
		}
	})
}

// A plugin that comes back after a long outage (a sidecar in
// CrashLoopBackOff) is used again within ReconnectMaxDelay, not after gRPC's
// default backoff, which has grown to several seconds (up to 2 minutes) by
// then.
func TestPluginBackAfterLongOutage(t *testing.T) {
	ep := "unix://" + filepath.Join(sockDir(t), "p.sock")
	b := newClient(t, plugin.Options{Endpoint: ep, ReconnectMaxDelay: 300 * time.Millisecond})
	v := &api.Volume{ID: "csi-" + strings.Repeat("a", 64), Params: api.Params{}}
	// Six seconds of failed attempts: gRPC's default backoff would wait
	// about 4 s (±20%) before the attempt after the last of them.
	for end := time.Now().Add(6 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if _, err := b.Content(t.Context(), v); !errors.Is(err, api.ErrUnavailable) {
			t.Fatalf("Content while the plugin is down: %v, want Unavailable", err)
		}
	}
	serveInProcess(t, pluginserver.Options{Endpoint: ep, Content: framework.ContentFunc(func(context.Context, *api.Volume) (map[string]api.File, error) {
		return map[string]api.File{"back": {Data: []byte("yes")}}, nil
	})})
	back := time.Now()
	for {
		files, err := b.Content(t.Context(), v)
		if err == nil {
			if string(files["back"].Data) != "yes" {
				t.Fatalf("content %v", files)
			}
			break
		}
		if since := time.Since(back); since > 2*time.Second {
			t.Fatalf("the plugin has served for %v and calls still fail: %v", since.Round(time.Millisecond), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("used again %v after it came back", time.Since(back).Round(time.Millisecond))
}
