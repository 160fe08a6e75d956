package framework_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/drivers/dir"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/stamp"
)

// The Windows seam (mount.NewLink: publish by directory symlink) driven through
// the whole framework on the host's filesystem. On Linux these are POSIX
// symlinks made without privilege, so the Windows decisions (link only after
// the backing directory exists, replace an empty target, refuse a non-empty
// one, unpublish removes the link and never the data, reconcile and
// republish-repair with live and dangling links) run in every CI job.

// linkHarness starts a driver with the link mounter and a dir backend whose
// Delete can be turned off to prove the seam never deletes through a link.
func linkHarness(t *testing.T, keepData *bool) (*drivertest.Harness, string) {
	t.Helper()
	probe := t.TempDir()
	if err := os.Symlink(probe, filepath.Join(probe, "link")); err != nil {
		t.Skipf("cannot create symlinks here (Windows without SeCreateSymbolicLinkPrivilege?): %v", err)
	}
	root := filepath.Join(t.TempDir(), "dirs")
	d, err := dir.New(dir.Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	b := &keepingBackend{Backend: d, keep: keepData}
	h := drivertest.Start(t, framework.Options{
		Backends: map[string]framework.Backend{"dir": b},
		Volumes: framework.VolumeOptions{
			DefaultBackend: "dir",
			Mounter:        mount.NewLink(),
		},
	})
	return h, root
}

type keepingBackend struct {
	*dir.Backend
	keep *bool
}

func (b *keepingBackend) Delete(ctx context.Context, v *api.Volume) error {
	if b.keep != nil && *b.keep {
		return nil
	}
	return b.Backend.Delete(ctx, v)
}

// linkPublish sends the kubelet's publish after creating the target's parent.
func linkPublish(t *testing.T, h *drivertest.Harness, pod *drivertest.Pod, vol string) error {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(h.Kubelet.TargetPath(pod, vol)), 0o750); err != nil {
		t.Fatal(err)
	}
	_, err := h.Node.NodePublishVolume(t.Context(), h.Kubelet.PublishRequest(pod, dirVolume(vol)))
	return err
}

func linkUnpublish(t *testing.T, h *drivertest.Harness, pod *drivertest.Pod, vol string) error {
	t.Helper()
	_, err := h.Node.NodeUnpublishVolume(t.Context(), &csi.NodeUnpublishVolumeRequest{
		VolumeId: api.VolumeHandle(pod.UID, vol), TargetPath: h.Kubelet.TargetPath(pod, vol)})
	return err
}

// linkDest returns where the link at target points, failing if it is not a link.
func linkDest(t *testing.T, target string) string {
	t.Helper()
	fi, err := os.Lstat(target)
	if err != nil {
		t.Fatalf("target: %v", err)
	}
	if fi.Mode()&fs.ModeSymlink == 0 {
		t.Fatalf("target %s is %v, not a symlink", target, fi.Mode())
	}
	dest, err := os.Readlink(target)
	if err != nil {
		t.Fatal(err)
	}
	return dest
}

func TestLinkSeamPublishUnpublish(t *testing.T) {
	keep := true
	h, root := linkHarness(t, &keep)
	pod := h.Kubelet.NewPod("ns", "p")
	target := h.Kubelet.TargetPath(pod, "v")
	backing := filepath.Join(root, api.VolumeHandle(pod.UID, "v"))

	// The kubelet left an empty target directory: it is replaced by the link.
	if err := os.MkdirAll(target, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := linkPublish(t, h, pod, "v"); err != nil {
		t.Fatalf("publish: %v", err)
	}
	if dest := linkDest(t, target); dest != backing {
		t.Fatalf("link points to %s, want the backing directory %s", dest, backing)
	}
	if fi, err := os.Stat(backing); err != nil || !fi.IsDir() {
		t.Fatalf("backing directory: %v", err)
	}
	if err := os.WriteFile(filepath.Join(target, "data"), []byte("kept"), 0o644); err != nil {
		t.Fatalf("write through the link: %v", err)
	}
	// Republish: same link, nothing changes.
	if err := linkPublish(t, h, pod, "v"); err != nil {
		t.Fatalf("republish: %v", err)
	}
	if _, err := h.Node.NodeGetVolumeStats(t.Context(), &csi.NodeGetVolumeStatsRequest{
		VolumeId: api.VolumeHandle(pod.UID, "v"), VolumePath: target}); err != nil && status.Code(err) != codes.Unimplemented {
		t.Errorf("stats: %v", err)
	}

	// Unpublish removes the link only: the data behind it is the backend's
	// to delete (here it keeps it).
	if err := linkUnpublish(t, h, pod, "v"); err != nil {
		t.Fatalf("unpublish: %v", err)
	}
	if _, err := os.Lstat(target); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("target still there after unpublish: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(backing, "data")); err != nil || string(b) != "kept" {
		t.Errorf("data behind the link touched by unpublish: %q, %v", b, err)
	}
	if err := linkUnpublish(t, h, pod, "v"); err != nil {
		t.Errorf("second unpublish: %v", err)
	}

	// With the backend deleting, nothing at all is left.
	keep = false
	if err := linkPublish(t, h, pod, "v"); err != nil {
		t.Fatal(err)
	}
	if err := linkUnpublish(t, h, pod, "v"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(backing); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("backing directory left: %v", err)
	}
}

func TestLinkSeamNonEmptyTargetRefused(t *testing.T) {
	h, root := linkHarness(t, nil)
	pod := h.Kubelet.NewPod("ns", "p")
	target := h.Kubelet.TargetPath(pod, "v")
	if err := os.MkdirAll(target, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(target, "someone-elses"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := linkPublish(t, h, pod, "v")
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("publish on a non-empty target: %v, want InvalidArgument", err)
	}
	if _, err := os.Stat(filepath.Join(target, "someone-elses")); err != nil {
		t.Errorf("content of the non-empty target touched: %v", err)
	}
	if ids := volumeDirs(t, root); len(ids) != 0 {
		t.Errorf("backing storage left after the refused publish: %v", ids)
	}
}

// A live link, a dangling link (backing directory gone, as after a reboot for a
// VHDX) and a missing link, across a driver restart: reconcile keeps all three
// records and deletes storage no record knows; republish repairs the broken two.
func TestLinkSeamReconcileAndRepair(t *testing.T) {
	h, root := linkHarness(t, nil)
	ctx := t.Context()
	pods := map[string]*drivertest.Pod{}
	for _, name := range []string{"live", "dangling", "unlinked"} {
		pods[name] = h.Kubelet.NewPod("ns", name)
		if err := linkPublish(t, h, pods[name], "v"); err != nil {
			t.Fatal(err)
		}
	}
	h.Stop()
	backing := func(name string) string { return filepath.Join(root, api.VolumeHandle(pods[name].UID, "v")) }
	target := func(name string) string { return h.Kubelet.TargetPath(pods[name], "v") }
	if err := os.WriteFile(filepath.Join(backing("live"), "f"), []byte("live"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(backing("dangling")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(target("unlinked")); err != nil {
		t.Fatal(err)
	}
	orphan := filepath.Join(root, "csi-"+fmtHex(9))
	if err := os.Mkdir(orphan, 0o700); err != nil {
		t.Fatal(err)
	}

	h.Restart()
	if _, err := os.Stat(orphan); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("orphaned backing directory not deleted by reconcile: %v", err)
	}
	health := func(name string) string {
		resp, err := h.Node.NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: api.VolumeHandle(pods[name].UID, "v")})
		if err != nil {
			t.Fatalf("health of %s: %v", name, err)
		}
		if s := resp.GetVolumeHealth().GetHealthStatuses(); len(s) > 0 {
			return s[0].GetReason()
		}
		return "ok"
	}
	for name, want := range map[string]string{"live": "ok", "dangling": "NotMounted", "unlinked": "NotMounted"} {
		if got := health(name); got != want {
			t.Errorf("%s after restart: health %s, want %s", name, got, want)
		}
	}
	for _, name := range []string{"live", "dangling", "unlinked"} {
		if err := linkPublish(t, h, pods[name], "v"); err != nil {
			t.Fatalf("republish %s: %v", name, err)
		}
		if dest := linkDest(t, target(name)); dest != backing(name) {
			t.Errorf("%s: link to %s, want %s", name, dest, backing(name))
		}
		if got := health(name); got != "ok" {
			t.Errorf("%s after republish: health %s", name, got)
		}
	}
	if b, err := os.ReadFile(filepath.Join(target("live"), "f")); err != nil || string(b) != "live" {
		t.Errorf("live volume's data after restart and republish: %q, %v", b, err)
	}
	for _, name := range []string{"live", "dangling", "unlinked"} {
		if err := linkUnpublish(t, h, pods[name], "v"); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(target(name)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s: target left: %v", name, err)
		}
	}
	if ids := volumeDirs(t, root); len(ids) != 0 {
		t.Errorf("backing storage left: %v", ids)
	}
}

// volumeDirs lists the entries of a dir backend's root other than its storage
// stamp.
func volumeDirs(t *testing.T, root string) []string {
	t.Helper()
	entries, _ := os.ReadDir(root)
	var out []string
	for _, e := range entries {
		if e.Name() != stamp.FileName {
			out = append(out, e.Name())
		}
	}
	return out
}
