package framework_test

import (
	"maps"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/drivers/dir"
	"github.com/ephemera-csi/ephemera/drivers/tmpfs"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/store/memstore"
)

// newTmpfs returns a tmpfs backend of opts.
func newTmpfs(t testing.TB, opts tmpfs.Options) *tmpfs.Backend {
	t.Helper()
	b, err := tmpfs.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// fakeHarness starts a driver with the fake mounter and the in-memory store: no
// root needed, nothing touches the host's mount table.
func fakeHarness(t *testing.T, mutate func(*framework.Options)) (*drivertest.Harness, *mount.Fake, *memstore.Store) {
	t.Helper()
	fake, st := mount.NewFake(), memstore.New()
	d, err := dir.New(dir.Options{Root: filepath.Join(t.TempDir(), "dirs")})
	if err != nil {
		t.Fatal(err)
	}
	opts := framework.Options{
		DriverName: "test.csi.ephemera.dev",
		Backends: map[string]framework.Backend{
			"tmpfs": newTmpfs(t, tmpfs.Options{}),
			"dir":   d,
		},
		Volumes: framework.VolumeOptions{
			DefaultBackend: "tmpfs",
			Mounter:        fake,
		},
		Limits: framework.LimitOptions{MaxVolumeSize: 1 << 30},
		State:  framework.StateOptions{Store: st},
	}
	if mutate != nil {
		mutate(&opts)
	}
	h := drivertest.Start(t, opts)
	return h, fake, st
}

func TestPublishValidation(t *testing.T) {
	h, fake, st := fakeHarness(t, nil)
	k := h.Kubelet
	pod := k.NewPod("ns1", "web")
	other := k.NewPod("ns2", "other")
	root := h.Options.Node.KubeletRootDir
	good := func() *csi.NodePublishVolumeRequest {
		return k.PublishRequest(pod, drivertest.InlineVolume{Name: "scratch", Attributes: map[string]string{"size": "1Mi"}})
	}
	withCtx := func(f func(map[string]string)) func(*csi.NodePublishVolumeRequest) {
		return func(r *csi.NodePublishVolumeRequest) {
			r.VolumeContext = maps.Clone(r.VolumeContext)
			f(r.VolumeContext)
		}
	}
	mountCap := func(m *csi.VolumeCapability_MountVolume) func(*csi.NodePublishVolumeRequest) {
		return func(r *csi.NodePublishVolumeRequest) {
			r.VolumeCapability.AccessType = &csi.VolumeCapability_Mount{Mount: m}
		}
	}
	setTarget := func(p string) func(*csi.NodePublishVolumeRequest) {
		return func(r *csi.NodePublishVolumeRequest) { r.TargetPath = p }
	}
	podDir := filepath.Join(root, "pods", pod.UID, "volumes", "kubernetes.io~csi")

	tests := []struct {
		name     string
		mutate   func(*csi.NodePublishVolumeRequest)
		wantCode codes.Code
		wantMsg  string
	}{
		{"missing volume_id", func(r *csi.NodePublishVolumeRequest) { r.VolumeId = "" }, codes.InvalidArgument, "volume_id is required"},
		{"missing target_path", setTarget(""), codes.InvalidArgument, "target_path is required"},
		{"missing capability", func(r *csi.NodePublishVolumeRequest) { r.VolumeCapability = nil }, codes.InvalidArgument, "volume_capability is required"},
		{"block access", func(r *csi.NodePublishVolumeRequest) {
			r.VolumeCapability.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
		}, codes.InvalidArgument, "block access is not supported"},
		{"no access type", func(r *csi.NodePublishVolumeRequest) { r.VolumeCapability.AccessType = nil }, codes.InvalidArgument, "access_type mount"},
		{"multi node access", func(r *csi.NodePublishVolumeRequest) {
			r.VolumeCapability.AccessMode.Mode = csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
		}, codes.InvalidArgument, "single-node"},
		{"mount flags", mountCap(&csi.VolumeCapability_MountVolume{MountFlags: []string{"exec"}}), codes.InvalidArgument, "mount_flags"},
		{"staging path", func(r *csi.NodePublishVolumeRequest) { r.StagingTargetPath = "/var/lib/kubelet/plugins/x" }, codes.InvalidArgument, "never staged"},
		{"no pod info", func(r *csi.NodePublishVolumeRequest) { r.VolumeContext = map[string]string{"size": "1Mi"} }, codes.InvalidArgument, "must set podInfoOnMount: true"},
		{"ephemeral key missing", withCtx(func(m map[string]string) { delete(m, api.KeyEphemeral) }), codes.InvalidArgument, "podInfoOnMount"},
		{"persistent volume", withCtx(func(m map[string]string) { m[api.KeyEphemeral] = "false" }), codes.InvalidArgument, "not PersistentVolumes"},
		{"pod uid missing", withCtx(func(m map[string]string) { delete(m, api.KeyPodUID) }), codes.InvalidArgument, "podInfoOnMount"},
		{"pod name empty", withCtx(func(m map[string]string) { m[api.KeyPodName] = "" }), codes.InvalidArgument, "non-empty"},
		{"pod namespace empty", withCtx(func(m map[string]string) { m[api.KeyPodNamespace] = "" }), codes.InvalidArgument, "non-empty"},
		{"forged pod uid", withCtx(func(m map[string]string) { m[api.KeyPodUID] = other.UID }), codes.InvalidArgument, "another pod's volume"},
		{"volume id of another pod", func(r *csi.NodePublishVolumeRequest) { r.VolumeId = api.VolumeHandle(other.UID, "scratch") }, codes.InvalidArgument, "does not match target path"},
		{"volume id of another volume", func(r *csi.NodePublishVolumeRequest) { r.VolumeId = api.VolumeHandle(pod.UID, "other") }, codes.InvalidArgument, "does not match"},
		{"volume id not a handle", func(r *csi.NodePublishVolumeRequest) { r.VolumeId = "my-volume" }, codes.InvalidArgument, "derived by the kubelet"},
		{"relative target", setTarget("pods/" + pod.UID + "/volumes/kubernetes.io~csi/scratch/mount"), codes.InvalidArgument, "must be absolute"},
		{"traversal in target", setTarget(filepath.Join(podDir, "scratch") + "/../../../../" + other.UID + "/volumes/kubernetes.io~csi/scratch/mount"), codes.InvalidArgument, "'..'"},
		{"target outside kubelet root", setTarget("/etc/pods/" + pod.UID + "/volumes/kubernetes.io~csi/scratch/mount"), codes.InvalidArgument, "--kubelet-root"},
		{"root prefix without separator", setTarget(root + "x/pods/" + pod.UID + "/volumes/kubernetes.io~csi/scratch/mount"), codes.InvalidArgument, "not under"},
		{"target not ending in mount", setTarget(filepath.Join(podDir, "scratch", "data")), codes.InvalidArgument, "does not have the form"},
		{"target of another plugin", setTarget(filepath.Join(root, "pods", pod.UID, "volumes", "kubernetes.io~empty-dir", "scratch", "mount")), codes.InvalidArgument, "does not have the form"},
		{"target too deep", setTarget(filepath.Join(podDir, "scratch", "mount", "x")), codes.InvalidArgument, "does not have the form"},
		{"bad volume name", setTarget(filepath.Join(podDir, "Bad_Name", "mount")), codes.InvalidArgument, "not a valid pod volume name"},
		{"bad pod uid in path", setTarget(filepath.Join(root, "pods", "uid$1", "volumes", "kubernetes.io~csi", "scratch", "mount")), codes.InvalidArgument, "not a pod UID"},
		{"unknown attribute", withCtx(func(m map[string]string) { m["sise"] = "1Mi" }), codes.InvalidArgument, `unknown attribute(s) "sise"`},
		{"reserved prefix attribute", withCtx(func(m map[string]string) { m["csi.storage.k8s.io/custom"] = "x" }), codes.InvalidArgument, "reserved prefix"},
		{"bad size", withCtx(func(m map[string]string) { m["size"] = "lots" }), codes.InvalidArgument, "not a quantity"},
		{"zero size", withCtx(func(m map[string]string) { m["size"] = "0" }), codes.InvalidArgument, "greater than zero"},
		{"negative size", withCtx(func(m map[string]string) { m["size"] = "-1Mi" }), codes.InvalidArgument, "greater than zero"},
		{"fractional size", withCtx(func(m map[string]string) { m["size"] = "0.5" }), codes.InvalidArgument, "whole number of bytes"},
		{"size over driver maximum", withCtx(func(m map[string]string) { m["size"] = "2Gi" }), codes.InvalidArgument, `invalid volume attributes: attribute "size": 2Gi is more than this driver's maximum volume size of 1Gi; ask for at most 1Gi`},
		{"tmpfs without size", withCtx(func(m map[string]string) { delete(m, "size") }), codes.InvalidArgument, "is required for tmpfs"},
		{"unknown backend", withCtx(func(m map[string]string) { m["backend"] = "nfs" }), codes.InvalidArgument, `attribute "backend": "nfs" is not one of "dir", "tmpfs"`},
		{"bad mode", withCtx(func(m map[string]string) { m["mode"] = "rwx" }), codes.InvalidArgument, "octal mode"},
		{"bad uid", withCtx(func(m map[string]string) { m["uid"] = "-5" }), codes.InvalidArgument, "not an integer"},
		{"dir backend refuses size", withCtx(func(m map[string]string) { m["backend"] = "dir" }), codes.InvalidArgument, "cannot enforce"},
		{"fsType for tmpfs", mountCap(&csi.VolumeCapability_MountVolume{FsType: "ext4"}), codes.InvalidArgument, "fsType"},
		{"bad mount group", mountCap(&csi.VolumeCapability_MountVolume{VolumeMountGroup: "staff"}), codes.InvalidArgument, "not a group ID"},
	}
	if len(tests) < 30 {
		t.Fatalf("only %d cases", len(tests))
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := good()
			tc.mutate(req)
			_, err := h.Node.NodePublishVolume(t.Context(), req)
			if got := status.Code(err); got != tc.wantCode {
				t.Fatalf("code = %v, want %v (err %v)", got, tc.wantCode, err)
			}
			if strings.Contains(status.Convert(err).Message(), "rpc error") {
				t.Errorf("message %q nests a gRPC status", status.Convert(err).Message())
			}
			if strings.Contains(status.Convert(err).Message(), "rpc error") {
				t.Errorf("message %q nests a gRPC status", status.Convert(err).Message())
			}
			if !strings.Contains(status.Convert(err).Message(), tc.wantMsg) {
				t.Errorf("message %q does not contain %q", status.Convert(err).Message(), tc.wantMsg)
			}
		})
	}
	// Nothing was touched by any refused request.
	for _, c := range fake.Calls() {
		t.Errorf("refused request reached the mounter: %s", c)
	}
	if recs, _ := st.List(t.Context()); len(recs) != 0 {
		t.Errorf("refused requests left %d records", len(recs))
	}
	// And the good request still works.
	fake.AddDir(filepath.Join(podDir, "scratch"))
	if _, err := h.Node.NodePublishVolume(t.Context(), good()); err != nil {
		t.Fatalf("valid request: %v", err)
	}
}

func TestUnpublishValidation(t *testing.T) {
	h, fake, _ := fakeHarness(t, nil)
	k := h.Kubelet
	pod, other := k.NewPod("ns", "a"), k.NewPod("ns", "b")
	target := k.TargetPath(pod, "v")
	tests := []struct {
		name     string
		req      *csi.NodeUnpublishVolumeRequest
		wantCode codes.Code
	}{
		{"missing volume id", &csi.NodeUnpublishVolumeRequest{TargetPath: target}, codes.InvalidArgument},
		{"missing target", &csi.NodeUnpublishVolumeRequest{VolumeId: api.VolumeHandle(pod.UID, "v")}, codes.InvalidArgument},
		{"id of another pod", &csi.NodeUnpublishVolumeRequest{VolumeId: api.VolumeHandle(other.UID, "v"), TargetPath: target}, codes.InvalidArgument},
		{"target outside root", &csi.NodeUnpublishVolumeRequest{VolumeId: api.VolumeHandle(pod.UID, "v"), TargetPath: "/etc"}, codes.InvalidArgument},
		{"traversal", &csi.NodeUnpublishVolumeRequest{VolumeId: api.VolumeHandle(pod.UID, "v"), TargetPath: target + "/../../../" + other.UID + "/volumes/kubernetes.io~csi/v/mount"}, codes.InvalidArgument},
		{"unknown volume is OK", &csi.NodeUnpublishVolumeRequest{VolumeId: api.VolumeHandle(pod.UID, "v"), TargetPath: target}, codes.OK},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := h.Node.NodeUnpublishVolume(t.Context(), tc.req)
			if got := status.Code(err); got != tc.wantCode {
				t.Fatalf("code = %v, want %v (err %v)", got, tc.wantCode, err)
			}
			if strings.Contains(status.Convert(err).Message(), "rpc error") {
				t.Errorf("message %q nests a gRPC status", status.Convert(err).Message())
			}
		})
	}
	for _, c := range fake.Calls() {
		if !strings.HasSuffix(c, target) {
			t.Errorf("mounter touched a path outside the request's own target: %s", c)
		}
	}
}
