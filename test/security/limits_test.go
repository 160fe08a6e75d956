//go:build linux

package security

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
)

// TestCapacityBudgetCannotOverflow: with a 10Mi tmpfs budget and no maximum
// volume size, a size near 2^63 does not wrap the accounting: it is refused,
// nothing is mounted, and 1Gi stays refused while 1Mi fits.
func TestCapacityBudgetCannotOverflow(t *testing.T) {
	n := newNode(t, func(o *framework.Options) { o.Limits.Capacity = map[string]int64{"tmpfs": 10 << 20} })
	first := n.h.Kubelet.NewPod("default", "first")
	n.publish(first, "data", "tmpfs")
	for _, size := range []string{"9.2233720368547E18", "1Gi"} {
		pod := n.h.Kubelet.NewPod("default", "big")
		err := n.h.Kubelet.Publish(n.ctx(), pod, drivertest.InlineVolume{Name: "data", Attributes: map[string]string{"backend": "tmpfs", "size": size}})
		if c := status.Code(err); c != codes.ResourceExhausted && c != codes.InvalidArgument {
			t.Fatalf("size %s with a 10Mi budget and 1Mi used: %v, want ResourceExhausted", size, err)
		}
		if ms := mountsBelow(t, n.h.Kubelet.PodDir(pod)); len(ms) != 0 {
			t.Fatalf("size %s: mounted %+v", size, ms)
		}
	}
	n.publish(n.h.Kubelet.NewPod("default", "small"), "data", "tmpfs")
}

// TestCollidingHandlesCannotTearDownAnotherPod: the kubelet's handle is
// sha256(podUID + volumeName) without a separator, so pod "aaaa1" volume "b"
// and pod "aaaa" volume "1b" would share one. Only the pod UID shapes the
// kubelet produces are accepted (a lowercase UUID, 32 hex digits for a static
// pod), which cannot collide; and an unpublish names the target the volume
// was published at, or nothing is touched.
func TestCollidingHandlesCannotTearDownAnotherPod(t *testing.T) {
	n := newNode(t, nil)
	victim := n.h.Kubelet.NewPod("default", "victim")
	target := n.publish(victim, "data", "tmpfs")
	n.write(target, "precious", "victim's")

	for _, p := range []struct{ uid, vol string }{{"aaaa1", "b"}, {"aaaa", "1b"}, {strings.ToUpper(victim.UID), "data"}} {
		pod := &drivertest.Pod{Namespace: "default", Name: "forged", UID: p.uid}
		req := n.h.Kubelet.PublishRequest(pod, drivertest.InlineVolume{Name: p.vol, Attributes: attrs["tmpfs"]})
		if err := os.MkdirAll(filepath.Dir(req.TargetPath), 0o750); err != nil {
			t.Fatal(err)
		}
		if _, err := n.h.Node.NodePublishVolume(n.ctx(), req); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "pod UID") {
			t.Errorf("publish for pod UID %q: %v, want InvalidArgument naming the pod UID", p.uid, err)
		}
		_, err := n.h.Node.NodeUnpublishVolume(n.ctx(), &csi.NodeUnpublishVolumeRequest{VolumeId: req.VolumeId, TargetPath: req.TargetPath})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("unpublish for pod UID %q: %v, want InvalidArgument", p.uid, err)
		}
	}
	// The victim's handle with another (valid) pod's target: refused, nothing
	// touched.
	other := n.h.Kubelet.NewPod("default", "other")
	otherTarget := n.h.Kubelet.TargetPath(other, "data")
	_, err := n.h.Node.NodeUnpublishVolume(n.ctx(), &csi.NodeUnpublishVolumeRequest{VolumeId: api.VolumeHandle(victim.UID, "data"), TargetPath: otherTarget})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("unpublish of the victim's handle at another target: %v, want InvalidArgument", err)
	}
	n.wantOneMount(target)
	n.wantData(target, "precious", "victim's")
}

// TestUnpublishThroughASymlinkedComponent: with …/kubernetes.io~csi/<vol> a
// link to a directory elsewhere whose mount holds a tmpfs, NodeUnpublishVolume
// is InvalidArgument and that tmpfs (and its data) stays.
func TestUnpublishThroughASymlinkedComponent(t *testing.T) {
	n := newNode(t, nil)
	pod := n.h.Kubelet.NewPod("default", "app")
	req := n.h.Kubelet.PublishRequest(pod, drivertest.InlineVolume{Name: "v", Attributes: attrs["tmpfs"]})
	elsewhere := filepath.Join(n.outside, "v")
	if err := os.MkdirAll(filepath.Join(elsewhere, "mount"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := mountTmpfs(filepath.Join(elsewhere, "mount")); err != nil {
		t.Fatal(err)
	}
	n.write(filepath.Join(elsewhere, "mount"), "precious", "outside")
	volDir := filepath.Dir(req.TargetPath)
	if err := os.MkdirAll(filepath.Dir(volDir), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, volDir); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := n.h.Node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: req.VolumeId, TargetPath: req.TargetPath})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("unpublish through a symlinked volume directory: %v, want InvalidArgument", err)
	}
	if len(n.mountsAt(filepath.Join(elsewhere, "mount"))) != 1 {
		t.Fatal("the tmpfs outside the root was unmounted")
	}
	n.wantData(filepath.Join(elsewhere, "mount"), "precious", "outside")
	// Publish refuses the same path too, and mounts nothing there.
	if _, err := n.h.Node.NodePublishVolume(ctx, req); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("publish through a symlinked volume directory: %v, want InvalidArgument", err)
	}
	if len(n.mountsAt(filepath.Join(elsewhere, "mount"))) != 1 {
		t.Fatal("a mount was stacked outside the root")
	}
}

func mountTmpfs(dir string) error {
	return mountFS("sentinel", dir, "tmpfs", "size=64k")
}
