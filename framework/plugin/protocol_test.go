package plugin_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/ephemera-csi/ephemera/api/plugin/v1alpha1"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/plugin"
)

// rogue is a plugin that answers what a test tells it to.
type rogue struct {
	pb.UnimplementedPluginServer
	version string
	caps    []pb.Capability
	source  *pb.Source
	ids     []string
	files   []*pb.File
}

func (r *rogue) Handshake(context.Context, *pb.HandshakeRequest) (*pb.HandshakeResponse, error) {
	return &pb.HandshakeResponse{Name: "rogue", Version: "6.6.6", ProtocolVersion: r.version, Capabilities: r.caps}, nil
}

func (r *rogue) Create(context.Context, *pb.CreateRequest) (*pb.CreateResponse, error) {
	return &pb.CreateResponse{Source: r.source}, nil
}

func (r *rogue) Delete(context.Context, *pb.DeleteRequest) (*pb.DeleteResponse, error) {
	return &pb.DeleteResponse{}, nil
}

func (r *rogue) List(context.Context, *pb.ListRequest) (*pb.ListResponse, error) {
	return &pb.ListResponse{VolumeIds: r.ids}, nil
}

func (r *rogue) Content(context.Context, *pb.ContentRequest) (*pb.ContentResponse, error) {
	return &pb.ContentResponse{Files: r.files}, nil
}

func serveRogue(t *testing.T, r *rogue) string {
	if r.version == "" {
		r.version = plugin.ProtocolVersion
	}
	return grpcServer(t, func(g *grpc.Server) { pb.RegisterPluginServer(g, r) })
}

func dirSource(p string) *pb.Source {
	return &pb.Source{Kind: &pb.Source_Directory{Directory: &pb.Directory{Path: p}}}
}

var (
	create  = []pb.Capability{pb.Capability_CAPABILITY_CREATE}
	content = []pb.Capability{pb.Capability_CAPABILITY_CONTENT}
)

// A plugin cannot make the driver publish anything outside the directory it
// shares with the driver: not by "..", not by an absolute path, not by a
// symlink planted in its directory (resolved by openat2 beneath the shared
// directory, RESOLVE_NO_SYMLINKS), not by a symlinked parent. Nothing is
// mounted and the error names the plugin.
func TestPluginDirectoryEscapeRefused(t *testing.T) {
	requireRoot(t)
	shared, outside := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "host-secret"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(shared, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(shared, "real"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(shared, "real", "link")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ path, want string }{
		{"../" + filepath.Base(outside), "not a relative path beneath its directory"},
		{outside, "not a relative path beneath its directory"},
		{"link", "symbolic link"},
		{"link/.", "symbolic link"},
		{"real/link", "symbolic link"},
	} {
		t.Run(strings.ReplaceAll(tc.path, "/", "_"), func(t *testing.T) {
			r := &rogue{caps: create, source: dirSource(tc.path)}
			b := newClient(t, plugin.Options{Name: "p", Endpoint: serveRogue(t, r), Dir: shared})
			h := startDriver(t, b, framework.Options{})
			k := h.Kubelet
			pod := k.NewPod("ns", "escape")
			err := k.Publish(t.Context(), pod, drivertest.InlineVolume{Name: "v"})
			if err == nil || !strings.Contains(err.Error(), "plugin p") && !strings.Contains(err.Error(), "beneath") {
				t.Fatalf("publish of directory %q: %v, want a refusal naming the plugin", tc.path, err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("publish of directory %q: %v, want it to say %q", tc.path, err, tc.want)
			}
			target := k.TargetPath(pod, "v")
			if mounted, _ := isMountPoint(target); mounted {
				t.Fatalf("%s is mounted", target)
			}
			if _, err := os.Stat(filepath.Join(target, "host-secret")); err == nil {
				t.Fatal("the directory outside the plugin's is visible at the target")
			}
			if err := k.DeletePod(t.Context(), pod); err != nil {
				t.Fatal(err)
			}
			h.RequireClean(t)
		})
	}
}

// Answers outside the protocol get errors naming the plugin, never a panic
// or a mount.
func TestPluginGarbage(t *testing.T) {
	requireRoot(t)
	t.Run("UnknownVersion", func(t *testing.T) {
		b := newClient(t, plugin.Options{Name: "p", Endpoint: serveRogue(t, &rogue{version: "v9", caps: create})})
		h := startDriver(t, b, framework.Options{})
		k := h.Kubelet
		pod := k.NewPod("ns", "v9")
		err := k.Publish(t.Context(), pod, drivertest.InlineVolume{Name: "v"})
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), `plugin p (rogue 6.6.6)`) || !strings.Contains(err.Error(), `"v9"`) {
			t.Fatalf("publish through a plugin of protocol v9: %v, want Unavailable naming the plugin and its version", err)
		}
		if err := k.DeletePod(t.Context(), pod); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("NoSource", func(t *testing.T) {
		b := newClient(t, plugin.Options{Name: "p", Endpoint: serveRogue(t, &rogue{caps: create})})
		h := startDriver(t, b, framework.Options{})
		k := h.Kubelet
		pod := k.NewPod("ns", "nosrc")
		err := k.Publish(t.Context(), pod, drivertest.InlineVolume{Name: "v"})
		if err == nil || !strings.Contains(err.Error(), "plugin p broke protocol v1alpha1 in its Create answer") {
			t.Fatalf("publish: %v", err)
		}
		if err := k.DeletePod(t.Context(), pod); err != nil {
			t.Fatal(err)
		}
		h.RequireClean(t)
	})
	t.Run("ContentPath", func(t *testing.T) {
		for _, p := range []string{"../escape", "/etc/passwd", "a/../../b", "", `a\b`} {
			b := newClient(t, plugin.Options{Name: "p", Endpoint: serveRogue(t, &rogue{caps: content, files: []*pb.File{{Path: p, Data: []byte("x")}}})})
			if _, err := b.Content(t.Context(), plugin.FromProto(&pb.Volume{Id: "csi-x"}, "p")); err == nil || !strings.Contains(err.Error(), "plugin p broke protocol") {
				t.Errorf("content file %q: %v, want a protocol error", p, err)
			}
		}
	})
	t.Run("ListIDs", func(t *testing.T) {
		b := newClient(t, plugin.Options{Name: "p", Endpoint: serveRogue(t, &rogue{caps: []pb.Capability{pb.Capability_CAPABILITY_CREATE, pb.Capability_CAPABILITY_LIST}, ids: []string{"../../etc"}})})
		if _, err := b.List(t.Context()); err == nil || !strings.Contains(err.Error(), "is not a volume ID") {
			t.Errorf("List: %v, want a protocol error", err)
		}
	})
}
