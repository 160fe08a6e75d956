package drivertest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strconv"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/api"
)

// PublishRequest returns the NodePublishVolumeRequest the kubelet sends for vol
// of pod to a driver whose NodeGetCapabilities answer is caps (none: a driver
// without VOLUME_MOUNT_GROUP and SINGLE_NODE_MULTI_WRITER):
//   - volume_id is api.VolumeHandle(pod.UID, vol.Name), target_path is
//     TargetPath, readonly is vol.ReadOnly; no staging path, no publish_context;
//   - volume_capability is mount{fs_type, volume_mount_group} with access mode
//     SINGLE_NODE_WRITER, or SINGLE_NODE_MULTI_WRITER if caps advertise it;
//     volume_mount_group is set only if caps advertise VOLUME_MOUNT_GROUP and
//     pod.FSGroup is set;
//   - volume_context is vol.Attributes, overwritten by the pod-info keys when
//     PodInfoOnMount, then by the tokens key unless TokensInSecrets;
//   - secrets is vol.Secrets (never nil), plus the tokens key if TokensInSecrets.
func (k *Kubelet) PublishRequest(pod *Pod, vol InlineVolume, caps ...*csi.NodeServiceCapability) *csi.NodePublishVolumeRequest {
	return k.publishRequest(pod, vol, hasNodeCap(caps, csi.NodeServiceCapability_RPC_VOLUME_MOUNT_GROUP),
		hasNodeCap(caps, csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER))
}

func (k *Kubelet) publishRequest(pod *Pod, vol InlineVolume, mountGroup, multiWriter bool) *csi.NodePublishVolumeRequest {
	volCtx := maps.Clone(vol.Attributes)
	merge := func(kv map[string]string) {
		if volCtx == nil {
			volCtx = map[string]string{}
		}
		maps.Copy(volCtx, kv)
	}
	if k.podInfoOnMount {
		merge(map[string]string{
			api.KeyPodName:            pod.Name,
			api.KeyPodNamespace:       pod.Namespace,
			api.KeyPodUID:             pod.UID,
			api.KeyServiceAccountName: pod.ServiceAccount,
			api.KeyEphemeral:          "true",
		})
	}
	secrets := maps.Clone(vol.Secrets)
	if secrets == nil {
		secrets = map[string]string{}
	}
	if vol.Tokens != "" {
		if vol.TokensInSecrets {
			secrets[api.KeyServiceAccountTokens] = vol.Tokens
		} else {
			merge(map[string]string{api.KeyServiceAccountTokens: vol.Tokens})
		}
	}
	mount := &csi.VolumeCapability_MountVolume{FsType: vol.FSType}
	if mountGroup && pod.FSGroup != nil {
		mount.VolumeMountGroup = strconv.FormatInt(*pod.FSGroup, 10)
	}
	mode := csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
	if multiWriter {
		mode = csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER
	}
	return &csi.NodePublishVolumeRequest{
		VolumeId:   api.VolumeHandle(pod.UID, vol.Name),
		TargetPath: k.targetPath(pod.UID, vol.Name),
		Readonly:   vol.ReadOnly,
		VolumeCapability: &csi.VolumeCapability{
			AccessType: &csi.VolumeCapability_Mount{Mount: mount},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
		},
		VolumeContext: volCtx,
		Secrets:       secrets,
	}
}

// Publish runs the kubelet's SetUpAt sequence for vol of pod, in the order of
// pkg/volume/csi:
//
//  1. MkdirAll(parent of target, 0750) — never the target itself;
//  2. NodeGetCapabilities (VOLUME_MOUNT_GROUP). A failure is transient: the
//     state is unchanged and nothing is cleaned up;
//  3. write vol_data.json into the parent;
//  4. NodeGetCapabilities (access-mode mapper). The kubelet returns this error
//     unwrapped, so it counts as a finished (final) failure;
//  5. NodePublishVolume on a fresh connection.
//
// On a final failure (see [IsFinal]) the kubelet's removeMountDir runs and a
// volume that was not mounted is forgotten; a mounted volume (a republish)
// stays mounted, and a volume reconstructed after Restart stays uncertain. On a
// non-final failure a volume that was not mounted becomes uncertain. The error
// of a failed RPC is returned unchanged, so status.Code works on it.
//
// The pod becomes desired (if it was not created with NewPod) and vol is
// remembered as its spec for Restart and Republish.
func (k *Kubelet) Publish(ctx context.Context, pod *Pod, vol InlineVolume) error {
	if vol.Name == "" {
		return errors.New("drivertest: InlineVolume.Name is empty")
	}
	k.mu.Lock()
	p := k.pods[pod.UID]
	if p == nil || p.deleted {
		p = &kubeletPod{volumes: map[string]InlineVolume{}}
		k.pods[pod.UID] = p
	}
	p.pod = clonePod(pod)
	p.volumes[vol.Name] = cloneVolume(vol)
	k.mu.Unlock()
	return k.setUp(ctx, clonePod(pod), cloneVolume(vol))
}

// Republish sends the publish sequence again for an already published volume,
// with the same pod and volume spec, as the kubelet does for CSIDriver
// requiresRepublish (and after a restart).
func (k *Kubelet) Republish(ctx context.Context, pod *Pod, volName string) error {
	k.mu.Lock()
	p := k.pods[pod.UID]
	var (
		vol InlineVolume
		ok  bool
	)
	if p != nil && !p.deleted {
		vol, ok = p.volumes[volName]
	}
	v := k.actual[kubeletVolKey{pod.UID, volName}]
	var snapshot Pod
	if ok {
		snapshot = clonePod(&p.pod)
	}
	k.mu.Unlock()
	if !ok || v == nil {
		return fmt.Errorf("drivertest: volume %q of pod %s is not published", volName, pod.UID)
	}
	return k.setUp(ctx, snapshot, cloneVolume(vol))
}

func (k *Kubelet) setUp(ctx context.Context, pod Pod, vol InlineVolume) error {
	key := kubeletVolKey{pod.UID, vol.Name}
	unlock := k.lockVolume(key)
	defer unlock()

	ctx, cancel := context.WithTimeout(ctx, k.timeout)
	defer cancel()

	target := k.targetPath(pod.UID, vol.Name)
	parent := filepath.Dir(target)
	if err := os.MkdirAll(parent, 0o750); err != nil {
		return fmt.Errorf("drivertest: creating %s: %w", parent, err)
	}
	k.made(parent)

	caps, err := k.nodeGetCapabilities(ctx)
	if err != nil {
		return err // transient
	}
	mountGroup := hasNodeCap(caps, csi.NodeServiceCapability_RPC_VOLUME_MOUNT_GROUP)

	handle := api.VolumeHandle(pod.UID, vol.Name)
	if err := k.writeVolData(parent, vol.Name, handle); err != nil {
		k.finishedError(key, target)
		return fmt.Errorf("drivertest: saving volume data: %w", err)
	}

	caps, err = k.nodeGetCapabilities(ctx)
	if err != nil {
		k.finishedError(key, target)
		return err
	}
	multiWriter := hasNodeCap(caps, csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER)

	req := k.publishRequest(&pod, vol, mountGroup, multiWriter)
	k.mu.Lock()
	k.targets[target] = true
	k.mu.Unlock()
	err = k.call(ctx, "NodePublishVolume "+handle, func(c csi.NodeClient) error {
		_, err := c.NodePublishVolume(ctx, req)
		return err
	})
	if err == nil {
		k.mu.Lock()
		k.actual[key] = &kubeletVol{state: StateMounted, handle: handle}
		k.mu.Unlock()
		return nil
	}
	if IsFinal(err) {
		k.finishedError(key, target)
		return err
	}
	k.mu.Lock()
	if k.actual[key] == nil {
		k.actual[key] = &kubeletVol{state: StateUncertain, handle: handle}
	}
	k.mu.Unlock()
	return err
}

// finishedError applies the kubelet's handling of a finished (final) SetUp
// failure: removeMountDir (errors are only logged by the kubelet), and the
// actual state drops an uncertain volume unless it was reconstructed.
func (k *Kubelet) finishedError(key kubeletVolKey, target string) {
	_ = k.removeMountDir(target)
	k.mu.Lock()
	defer k.mu.Unlock()
	if v := k.actual[key]; v != nil && v.state == StateUncertain && !v.reconstructed {
		delete(k.actual, key)
	}
}

// IsFinal reports whether err is a final error in the kubelet's sense
// (isFinalError): a gRPC status error with any code except Canceled,
// DeadlineExceeded, Unavailable, ResourceExhausted and Aborted. Non-gRPC errors
// are not final, because the operation may not even have reached the driver;
// nil is not final.
func IsFinal(err error) bool {
	if err == nil {
		return false
	}
	st, ok := status.FromError(err)
	if !ok {
		return false
	}
	switch st.Code() {
	case codes.Canceled, codes.DeadlineExceeded, codes.Unavailable, codes.ResourceExhausted, codes.Aborted:
		return false
	}
	return true
}

func hasNodeCap(caps []*csi.NodeServiceCapability, t csi.NodeServiceCapability_RPC_Type) bool {
	for _, c := range caps {
		if c.GetRpc().GetType() == t {
			return true
		}
	}
	return false
}
