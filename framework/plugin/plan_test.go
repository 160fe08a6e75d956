package plugin_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/drivers/tmpfs"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/plugin"
	"github.com/ephemera-csi/ephemera/framework/pluginserver"
)

// serveStoppable serves opts on endpoint until the returned stop is called
// (or the test ends).
func serveStoppable(t *testing.T, endpoint string, opts pluginserver.Options) (stop func()) {
	t.Helper()
	opts.Endpoint, opts.Name = endpoint, "in-process"
	s, err := pluginserver.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("plugin server: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	waitServing(t, endpoint)
	return stop
}

// countingBackend counts the Creates a plugin serves.
type countingBackend struct {
	framework.Backend
	creates atomic.Int32
}

func (c *countingBackend) Create(ctx context.Context, v *api.Volume) (api.Source, error) {
	c.creates.Add(1)
	return c.Backend.Create(ctx, v)
}

// The plan recorded at a first publish decides what Create and Delete do,
// not the plugin of the moment (a plugin may restart as another version
// between the plan and Create): a volume planned while a content-only plugin
// ran is the driver's tmpfs, and its Delete needs no plugin; one planned for
// CREATE is never turned into a tmpfs by a content-only version (Unavailable,
// nothing asked of the plugin, and then nothing of the plugin's to delete).
func TestPluginPlanDecides(t *testing.T) {
	content := framework.ContentFunc(func(context.Context, *api.Volume) (map[string]api.File, error) { return nil, nil })
	mem, err := tmpfs.New(tmpfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	newVolume := func() *api.Volume {
		return &api.Volume{ID: "csi-" + strings.Repeat("b", 64), Size: 1 << 20, Params: api.Params{}}
	}
	// reconnected waits until b handshook the plugin now serving, which
	// creates storage or not.
	reconnected := func(t *testing.T, b *plugin.Backend, creates bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if _, finds := framework.As[framework.Finder](b); finds != creates {
				return
			}
		}
		t.Fatal("the driver never handshook the restarted plugin")
	}

	t.Run("content-only-then-create", func(t *testing.T) {
		ep := "unix://" + filepath.Join(sockDir(t), "p.sock")
		stop := serveStoppable(t, ep, pluginserver.Options{Content: content})
		b := newClient(t, plugin.Options{Endpoint: ep, ReconnectMaxDelay: 100 * time.Millisecond})
		v := newVolume()
		plan, err := b.Plan(t.Context(), v)
		if err != nil || !plan.MountOnly {
			t.Fatalf("plan of a content-only plugin's volume: %+v, %v; want MountOnly", plan, err)
		}
		stop()
		counting := &countingBackend{Backend: mem}
		stop = serveStoppable(t, ep, pluginserver.Options{Backend: counting, Content: content})
		reconnected(t, b, true)
		src, err := b.Create(t.Context(), v)
		if err != nil || src.FSType != "tmpfs" {
			t.Fatalf("Create after the plugin gained CREATE: %+v, %v; want the driver's tmpfs", src, err)
		}
		if n := counting.creates.Load(); n != 0 {
			t.Errorf("the plugin got %d Creates for a volume planned as the driver's", n)
		}
		stop()
		if err := b.Delete(t.Context(), v); err != nil {
			t.Errorf("Delete of the driver's volume with the plugin down: %v, want nil", err)
		}
	})

	t.Run("create-then-content-only", func(t *testing.T) {
		ep := "unix://" + filepath.Join(sockDir(t), "p.sock")
		stop := serveStoppable(t, ep, pluginserver.Options{Backend: mem, Content: content})
		b := newClient(t, plugin.Options{Endpoint: ep, ReconnectMaxDelay: 100 * time.Millisecond})
		v := newVolume()
		plan, err := b.Plan(t.Context(), v)
		if err != nil || plan.MountOnly {
			t.Fatalf("plan of a creating plugin's volume: %+v, %v; want not MountOnly", plan, err)
		}
		stop()
		stop = serveStoppable(t, ep, pluginserver.Options{Content: content})
		reconnected(t, b, false)
		if _, err := b.Create(t.Context(), v); !errors.Is(err, api.ErrUnavailable) || !strings.Contains(err.Error(), "no longer implements CREATE") {
			t.Fatalf("Create after the plugin lost CREATE: %v, want Unavailable", err)
		}
		stop()
		if err := b.Delete(t.Context(), v); err != nil {
			t.Errorf("Delete of a volume whose Create never reached the plugin, plugin down: %v, want nil", err)
		}
	})

	t.Run("plugin-down", func(t *testing.T) {
		b := newClient(t, plugin.Options{Endpoint: "unix://" + filepath.Join(sockDir(t), "none.sock"), Timeout: time.Second})
		for _, tc := range []struct {
			name  string
			state map[string]string
			want  string // in the error; "" for nil
		}{
			{name: "driver's", state: map[string]string{"ephemera.dev/plugin-creates": "false"}},
			{name: "created", state: map[string]string{"ephemera.dev/plugin-creates": "true", "ephemera.dev/plugin-storage": "true"}, want: "created the storage"},
			{name: "create unanswered", state: map[string]string{"ephemera.dev/plugin-creates": "true"}, want: "its Create did not answer"},
			{name: "older driver's", state: map[string]string{"ephemera.dev/plugin-storage": "true"}, want: "created the storage"},
			{name: "unknown", want: "may hold storage"},
		} {
			v := newVolume()
			v.State = tc.state
			err := b.Delete(t.Context(), v)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("%s: Delete with the plugin down: %v, want nil", tc.name, err)
			case tc.want != "" && (!errors.Is(err, api.ErrUnavailable) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "start plugin backendtest again")):
				t.Errorf("%s: Delete with the plugin down: %v, want Unavailable saying %q and how to get out", tc.name, err, tc.want)
			}
		}
	})
}
