package framework

import (
	"context"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/errkind"
	"github.com/ephemera-csi/ephemera/framework/internal/volume"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/store/memstore"
)

// FuzzParsePublish feeds arbitrary requests to the validation that runs before any
// side effect: it never panics, refuses with InvalidArgument (never Unknown or
// Internal), and whatever it accepts is bound to the pod named by the target path.
func FuzzParsePublish(f *testing.F) {
	const root = "/var/lib/kubelet"
	uid := "0b7a4c2e-1f2d-4e5a-9c3b-7d8e9f0a1b2c"
	good := root + "/pods/" + uid + "/volumes/kubernetes.io~csi/data/mount"
	f.Add(api.VolumeHandle(uid, "data"), good, uid, "64Mi", "", "", "", `{"a":{"token":"t"}}`)
	f.Add("csi-x", good+"/../../x", uid, "1.5", "ext4", "7", "dir", "{")
	f.Add("", "", "", "", "", "", "", "")
	f.Add(api.VolumeHandle(uid, "data"), good, uid, "1Ei", "xfs", "-1", "nfs", "null")
	d, err := New(Options{
		DriverName: "fuzz.csi.ephemera.dev",
		Backends: map[string]Backend{"tmpfs": BackendFuncs{CreateFunc: func(context.Context, *api.Volume) (api.Source, error) {
			return api.Source{}, nil
		}}},
		Node: NodeOptions{
			ID:             "n",
			KubeletRootDir: root,
			StateDir:       "/var/lib/x",
		},
		Volumes: VolumeOptions{Mounter: mount.NewFake()},
		Limits:  LimitOptions{MaxVolumeSize: 1 << 30},
		State:   StateOptions{Store: memstore.New()},
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, id, target, podUID, size, fsType, group, backend, tokens string) {
		vc := map[string]string{
			api.KeyEphemeral: "true", api.KeyPodUID: podUID, api.KeyPodName: "p", api.KeyPodNamespace: "ns",
			api.KeyServiceAccountName: "sa", api.KeyServiceAccountTokens: tokens, "size": size,
		}
		if backend != "" {
			vc["backend"] = backend
		}
		req := &csi.NodePublishVolumeRequest{
			VolumeId: id, TargetPath: target, VolumeContext: vc,
			VolumeCapability: &csi.VolumeCapability{
				AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fsType, VolumeMountGroup: group}},
				AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
			},
		}
		pr, err := d.csi.Parser.Publish(req)
		if err != nil {
			if c := status.Code(errkind.Status(err)); c != codes.InvalidArgument {
				t.Fatalf("refused with %v, want InvalidArgument: %v", c, err)
			}
			if strings.Contains(err.Error(), `"token"`) {
				t.Fatalf("error quotes the tokens: %v", err)
			}
			return
		}
		tg, perr := volume.ParseTarget(root, target, false)
		if perr != nil || pr.Volume.ID != tg.Handle() || pr.Volume.Pod.UID != tg.PodUID {
			t.Fatalf("accepted a request not bound to its target: id %q target %q uid %q", id, target, podUID)
		}
		if pr.Volume.Size <= 0 || pr.Volume.Size > 1<<30 {
			t.Fatalf("accepted size %d", pr.Volume.Size)
		}
	})
}
