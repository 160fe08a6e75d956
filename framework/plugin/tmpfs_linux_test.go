package plugin_test

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/drivers/tmpfs"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/plugin"
	"github.com/ephemera-csi/ephemera/framework/pluginserver"
)

// A tmpfs crosses the protocol as its typed settings (api.Source.Tmpfs), not
// as mount options read back: the owner and mode the plugin's tmpfs backend
// chose are the target's.
func TestPluginTmpfsSettings(t *testing.T) {
	requireRoot(t)
	mem, err := tmpfs.New(tmpfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ep := serveInProcess(t, pluginserver.Options{Backend: mem})
	h := startDriver(t, newClient(t, plugin.Options{Endpoint: ep}), framework.Options{})
	k := h.Kubelet
	pod := k.NewPod("ns", "owner")
	attrs := map[string]string{"size": "4Mi", "mode": "0710", "uid": "1234", "gid": "5678"}
	if err := k.Publish(t.Context(), pod, drivertest.InlineVolume{Name: "v", Attributes: attrs}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(k.TargetPath(pod, "v"))
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if fi.Mode().Perm() != 0o710 || st.Uid != 1234 || st.Gid != 5678 {
		t.Errorf("target root: mode %v, owner %d:%d, want 0710, 1234:5678", fi.Mode(), st.Uid, st.Gid)
	}
	if err := k.DeletePod(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	h.RequireClean(t)
}

// handBuiltTmpfs returns a tmpfs source as mount options only.
type handBuiltTmpfs struct{ *tmpfs.Backend }

func (b handBuiltTmpfs) Create(ctx context.Context, v *api.Volume) (api.Source, error) {
	src, err := b.Backend.Create(ctx, v)
	src.Tmpfs = nil
	return src, err
}

// A backend behind a plugin server that returns a tmpfs without its settings
// is a bug of the plugin: Internal, naming the field, and nothing mounted.
func TestPluginTmpfsWithoutSettings(t *testing.T) {
	requireRoot(t)
	mem, err := tmpfs.New(tmpfs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ep := serveInProcess(t, pluginserver.Options{Backend: handBuiltTmpfs{mem}})
	h := startDriver(t, newClient(t, plugin.Options{Endpoint: ep}), framework.Options{})
	k := h.Kubelet
	pod := k.NewPod("ns", "hand-built")
	err = k.Publish(t.Context(), pod, drivertest.InlineVolume{Name: "v", Attributes: size})
	if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "api.Source.Tmpfs") {
		t.Fatalf("publish: %v, want Internal naming api.Source.Tmpfs", err)
	}
	if mounted, _ := isMountPoint(k.TargetPath(pod, "v")); mounted {
		t.Fatal("the target is mounted")
	}
	if err := k.DeletePod(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	h.RequireClean(t)
}
