package plugin_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/plugin"
)

// A content-only plugin's volumes are the driver's tmpfs: the plugin created
// nothing that only it can remove, so a plugin that is down does not keep
// their pods Terminating (docs/design.md, "Plugins"). The unpublish unmounts,
// deletes the record and releases the volume's capacity, also after a driver
// restart (the record, in bbolt, says which volumes are the driver's).
func TestContentOnlyPluginDownUnpublish(t *testing.T) {
	requireRoot(t)
	for _, restart := range []bool{false, true} {
		name := "plugin-down"
		if restart {
			name = "plugin-down-driver-restarted"
		}
		t.Run(name, func(t *testing.T) {
			p := startPlugin(t, "content", versionEnv+"=1")
			h := startDriver(t, newClient(t, plugin.Options{Name: "p", Endpoint: p.Endpoint}),
				framework.Options{Limits: framework.LimitOptions{Capacity: map[string]int64{"p": 4 << 20}}})
			k, ctx := h.Kubelet, t.Context()
			pod := k.NewPod("ns", "gone")
			if err := k.Publish(ctx, pod, drivertest.InlineVolume{Name: "v", Attributes: size}); err != nil {
				t.Fatal(err)
			}
			target := k.TargetPath(pod, "v")
			p.Kill()
			if restart {
				h.RestartDriver()
			}
			if err := k.Unpublish(ctx, pod, "v"); err != nil {
				t.Fatalf("unpublish of a content-only plugin's volume with the plugin down: %v, want OK", err)
			}
			if mounted, _ := isMountPoint(target); mounted {
				t.Error("the target is still mounted")
			}
			requireNoRecords(t, h)
			if err := k.DeletePod(ctx, pod); err != nil {
				t.Fatal(err)
			}
			// The budget holds one volume: the next one fits only when the
			// unpublished one's capacity was released.
			p.Start()
			requireBudgetFree(ctx, t, h, "publish after the unpublish released the budget")
		})
	}
}

// A plugin that created a volume's storage (CREATE) and is down: the
// unpublish unmounts, keeps the record and answers Unavailable with what to
// do (bring the plugin back); the kubelet's retry once it runs finishes the
// teardown through the plugin. Also after a driver restart.
func TestCreatingPluginDownUnpublish(t *testing.T) {
	requireRoot(t)
	for _, restart := range []bool{false, true} {
		name := "plugin-down"
		if restart {
			name = "plugin-down-driver-restarted"
		}
		t.Run(name, func(t *testing.T) {
			shared := t.TempDir()
			p := startPlugin(t, "dir", dirEnv+"="+shared)
			h := startDriver(t, newClient(t, plugin.Options{Name: "p", Endpoint: p.Endpoint, Dir: shared}), framework.Options{})
			k, ctx := h.Kubelet, t.Context()
			pod := k.NewPod("ns", "kept")
			if err := k.Publish(ctx, pod, drivertest.InlineVolume{Name: "v"}); err != nil {
				t.Fatal(err)
			}
			target := k.TargetPath(pod, "v")
			p.Kill()
			if restart {
				h.RestartDriver()
			}
			k.SetRetry(drivertest.Backoff{Attempts: 1}) // the first answer is what is checked
			err := k.Unpublish(ctx, pod, "v")
			if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "plugin p created") || !strings.Contains(err.Error(), "start plugin p again") {
				t.Fatalf("unpublish with the plugin that created the storage down: %v, want Unavailable saying the plugin created it and to start it again", err)
			}
			t.Logf("unpublish with the plugin down: %v", err)
			if mounted, _ := isMountPoint(target); mounted {
				t.Error("the target is still mounted")
			}
			if recs, err := h.Driver().Records(ctx); err != nil || len(recs) != 1 {
				t.Fatalf("records: %v, %v; want the volume's, kept for the plugin's Delete", recs, err)
			}
			p.Start()
			if err := k.DeletePod(ctx, pod); err != nil {
				t.Fatalf("unpublish once the plugin is back: %v", err)
			}
			h.RequireClean(t)
			if entries, _ := filepath.Glob(filepath.Join(shared, "volumes", "*")); len(entries) != 0 {
				t.Errorf("the plugin still holds %v", entries)
			}
		})
	}
}

// A first publish through a content-only plugin that fails while the plugin
// is down (killed in the middle of Content, or stopped before the publish)
// rolls back without the plugin: no record is left and the volume's capacity
// is released, so the pod's retry and other pods are not refused for it.
func TestContentOnlyPluginDownFailedPublishReleasesCapacity(t *testing.T) {
	requireRoot(t)
	for _, tc := range []struct {
		name string
		hang bool // killed in the middle of Content; else stopped before
	}{
		{name: "killed-mid-content", hang: true},
		{name: "stopped-before-publish"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := []string{versionEnv + "=1"}
			if tc.hang {
				env = append(env, hangEnv+"=Content")
			}
			p := startPlugin(t, "content", env...)
			h := startDriver(t, newClient(t, plugin.Options{Name: "p", Endpoint: p.Endpoint}),
				framework.Options{Limits: framework.LimitOptions{Capacity: map[string]int64{"p": 4 << 20}}})
			k, ctx := h.Kubelet, t.Context()
			pod := k.NewPod("ns", "failed")
			var err error
			if tc.hang {
				errc := make(chan error, 1)
				go func() { errc <- k.Publish(ctx, pod, drivertest.InlineVolume{Name: "v", Attributes: size}) }()
				waitHanging(t, p)
				p.Kill()
				err = <-errc
			} else {
				// A publish first, so that the driver knows the plugin for a
				// content-only one.
				warm := k.NewPod("ns", "warm")
				if err := k.Publish(ctx, warm, drivertest.InlineVolume{Name: "v", Attributes: size}); err != nil {
					t.Fatal(err)
				}
				if err := k.DeletePod(ctx, warm); err != nil {
					t.Fatal(err)
				}
				p.Stop()
				err = k.Publish(ctx, pod, drivertest.InlineVolume{Name: "v", Attributes: size})
			}
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("publish with the plugin down: %v, want Unavailable", err)
			}
			requireNoVolume(t, h, k.TargetPath(pod, "v"))
			if err := k.DeletePod(ctx, pod); err != nil {
				t.Fatal(err)
			}
			if tc.hang {
				// The same plugin, without the hang.
				drivertest.StartPlugin(t, drivertest.PluginOptions{Command: os.Args[0], Endpoint: p.Endpoint, Env: []string{modeEnv + "=content", versionEnv + "=1"}})
			} else {
				p.Start()
			}
			requireBudgetFree(ctx, t, h, "publish after the failed one (its capacity still counted?)")
		})
	}
}

// requireBudgetFree publishes and deletes another pod's volume, which fits a
// budget of one volume only when none is counted any more, and checks that
// nothing is left.
func requireBudgetFree(ctx context.Context, t *testing.T, h *drivertest.Harness, what string) {
	t.Helper()
	next := h.Kubelet.NewPod("ns", "next")
	if err := h.Kubelet.Publish(ctx, next, drivertest.InlineVolume{Name: "v", Attributes: size}); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if err := h.Kubelet.DeletePod(ctx, next); err != nil {
		t.Fatal(err)
	}
	h.RequireClean(t)
}

// requireNoRecords checks that the driver holds no record.
func requireNoRecords(t *testing.T, h *drivertest.Harness) {
	t.Helper()
	recs, err := h.Driver().Records(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		t.Errorf("record left: %s %s phase %s state %v", r.VolumeID, r.Backend, r.Phase, r.State)
	}
}
