package plugin_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/drivers/tmpfs"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/plugin"
	"github.com/ephemera-csi/ephemera/framework/pluginserver"
)

// slowCreate is a backend whose Create takes delay, honouring ctx; every
// Create's result goes to returned.
type slowCreate struct {
	framework.Backend
	delay    time.Duration
	returned chan error
}

func (s *slowCreate) Create(ctx context.Context, v *api.Volume) (api.Source, error) {
	t := time.NewTimer(s.delay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		s.returned <- ctx.Err()
		return api.Source{}, ctx.Err()
	}
	src, err := s.Backend.Create(ctx, v)
	s.returned <- err
	return src, err
}

// longCreate is slowCreate declaring long provisioning.
type longCreate struct{ *slowCreate }

func (longCreate) LongProvisioning() {}

func newSlowCreate(t *testing.T, delay time.Duration) *slowCreate {
	mem, err := tmpfs.New(tmpfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return &slowCreate{Backend: mem, delay: delay, returned: make(chan error, 8)}
}

// The handshake says whether a plugin's Create may outlive the publish: a
// served LongProvisioner advertises CAPABILITY_LONG_PROVISIONING, and the
// driver's plugin backend is a LongProvisioner only then. A plugin without
// the capability (every older plugin, examples/plugin-node), a content-only
// one and one that is not running are not.
func TestPluginLongProvisioningCapability(t *testing.T) {
	content := framework.ContentFunc(func(context.Context, *api.Volume) (map[string]api.File, error) { return nil, nil })
	for _, tc := range []struct {
		name  string
		serve pluginserver.Options
		want  bool
	}{
		{"long", pluginserver.Options{Backend: longCreate{newSlowCreate(t, 0)}}, true},
		{"older", pluginserver.Options{Backend: newSlowCreate(t, 0)}, false},
		{"content-only", pluginserver.Options{Content: content}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newClient(t, plugin.Options{Endpoint: serveInProcess(t, tc.serve)})
			if _, got := framework.As[framework.LongProvisioner](b); got != tc.want {
				t.Errorf("LongProvisioner: %v, want %v", got, tc.want)
			}
		})
	}
	b := newClient(t, plugin.Options{Endpoint: "unix:///nonexistent/none.sock", Timeout: 200 * time.Millisecond})
	if _, ok := framework.As[framework.LongProvisioner](b); ok {
		t.Error("a plugin never reached is said to provision long")
	}
}

// longDriver runs a driver (fake mounts) whose backend "p" is the plugin
// serving b, with the publish bounded by 1s.
func longDriver(t *testing.T, b framework.Backend) *drivertest.Harness {
	client := newClient(t, plugin.Options{Name: "p", Endpoint: serveInProcess(t, pluginserver.Options{Backend: b})})
	return startDriver(t, client, framework.Options{
		Volumes: framework.VolumeOptions{Mounter: mount.NewFake(), DefaultBackend: "p", ContentTimeout: 500 * time.Millisecond},
		Limits:  framework.LimitOptions{OperationTimeout: time.Second, ProvisionTimeout: 20 * time.Second},
	})
}

// A long provisioning plugin's Create outlives the publish, through the
// protocol: the retry attaches to it and publishes; an unpublish while it
// runs cancels the plugin's Create. An older plugin's Create is bounded by
// the publish as it always was.
func TestPluginLongProvisioning(t *testing.T) {
	vol := drivertest.InlineVolume{Name: "v", Attributes: size}
	t.Run("published on a retry", func(t *testing.T) {
		slow := newSlowCreate(t, 1500*time.Millisecond)
		h := longDriver(t, longCreate{slow})
		pod := h.Kubelet.NewPod("ns", "p")
		attempts, err := drivertest.KubeletBackoff(1.0/100).Retry(t.Context(), func(ctx context.Context) error {
			return h.Kubelet.Publish(ctx, pod, vol)
		})
		if err != nil || len(attempts) < 2 || attempts[0].Code != codes.Aborted || !strings.Contains(attempts[0].Err.Error(), "still provisioning") {
			t.Fatalf("%d attempts, first %v, last %v; want Aborted (still provisioning), then OK", len(attempts), attempts[0].Err, err)
		}
		if err := <-slow.returned; err != nil || len(slow.returned) != 0 {
			t.Fatalf("the plugin's Create: %v (%d more); want one, OK", err, len(slow.returned))
		}
		if err := h.Kubelet.DeletePod(t.Context(), pod); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("unpublish cancels", func(t *testing.T) {
		slow := newSlowCreate(t, time.Hour)
		h := longDriver(t, longCreate{slow})
		pod := h.Kubelet.NewPod("ns", "p")
		if err := h.Kubelet.Publish(t.Context(), pod, vol); status.Code(err) != codes.Aborted {
			t.Fatalf("publish: %v, want Aborted", err)
		}
		if err := h.Kubelet.DeletePod(t.Context(), pod); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-slow.returned:
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("the plugin's Create returned %v, want it cancelled", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the plugin's Create was not cancelled")
		}
	})
	t.Run("older plugin", func(t *testing.T) {
		slow := newSlowCreate(t, 1500*time.Millisecond)
		h := longDriver(t, slow)
		pod := h.Kubelet.NewPod("ns", "p")
		err := h.Kubelet.Publish(t.Context(), pod, vol)
		if err == nil || strings.Contains(err.Error(), "still provisioning") {
			t.Fatalf("publish through an older plugin slower than the publish: %v, want its deadline", err)
		}
		if err := <-slow.returned; !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			t.Fatalf("the older plugin's Create: %v, want it cut short", err)
		}
	})
}
