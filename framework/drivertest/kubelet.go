package drivertest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"io/fs"
	"maps"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/api"
)

// Layout of the kubelet root directory, as the kubelet builds it.
const (
	kubeletPodsDir       = "pods"
	kubeletVolumesDir    = "volumes"
	kubeletPluginsDir    = "plugins"
	kubeletCSIPluginDir  = "kubernetes.io~csi" // EscapeQualifiedName("kubernetes.io/csi")
	kubeletMountDir      = "mount"
	kubeletVolDataFile   = "vol_data.json"
	kubeletEphemeralMode = "Ephemeral"
	kubeletDefaultNode   = "node-1"
	kubeletCSITimeout    = 2 * time.Minute // pkg/volume/csi csiTimeout
)

// Keys of vol_data.json.
const (
	volDataSpecVolID     = "specVolID"
	volDataVolumeHandle  = "volumeHandle"
	volDataDriverName    = "driverName"
	volDataNodeName      = "nodeName"
	volDataAttachmentID  = "attachmentID"
	volDataLifecycleMode = "volumeLifecycleMode"
)

// KubeletOptions configures a [Kubelet].
type KubeletOptions struct {
	// Root is the kubelet root directory (--root-dir). Required.
	Root string
	// Endpoint is the driver's CSI endpoint: "unix:///abs/path" or an absolute
	// socket path.
	Endpoint string
	// DriverName is the CSI driver name, written to vol_data.json.
	DriverName string
	// NodeName is the node name written to vol_data.json. Defaults to "node-1".
	NodeName string
	// PodInfoOnMount models CSIDriver.spec.podInfoOnMount. Defaults to true;
	// false means no pod keys and no csi.storage.k8s.io/ephemeral key in
	// volume_context.
	PodInfoOnMount *bool
	// Timeout bounds each kubelet operation (one publish sequence, one
	// unpublish), like the kubelet's csiTimeout. Defaults to 2 minutes.
	Timeout time.Duration
}

// Pod is a pod as far as the kubelet's CSI code cares.
type Pod struct {
	Namespace      string
	Name           string
	UID            string
	ServiceAccount string
	// FSGroup is the pod's securityContext.fsGroup. The kubelet passes it as
	// volume_mount_group only to drivers that advertise VOLUME_MOUNT_GROUP.
	FSGroup *int64
}

// InlineVolume is one spec.volumes[i].csi entry of a pod.
type InlineVolume struct {
	// Name is the pod-spec volume name.
	Name string
	// ReadOnly is csi.readOnly.
	ReadOnly bool
	// FSType is csi.fsType ("" when unset).
	FSType string
	// Attributes are csi.volumeAttributes.
	Attributes map[string]string
	// Secrets is the content of the nodePublishSecretRef secret (nil: no ref).
	Secrets map[string]string
	// Tokens is the JSON value of csi.storage.k8s.io/serviceAccount.tokens the
	// kubelet would build from CSIDriver.spec.tokenRequests; "" means no
	// tokenRequests.
	Tokens string
	// TokensInSecrets models CSIDriver.spec.serviceAccountTokenInSecrets: the
	// tokens key goes into secrets instead of volume_context.
	TokensInSecrets bool
}

// VolumeState is the kubelet's actual state of one volume of one pod.
type VolumeState int

const (
	// StateNone means the kubelet does not consider the volume mounted at all:
	// it was never published, a publish failed with a final error, or it was
	// unpublished.
	StateNone VolumeState = iota
	// StateUncertain means a publish failed with a non-final error, or the
	// volume was reconstructed from disk after a restart. The kubelet will
	// publish it again while the pod exists, or unpublish it when it is gone.
	StateUncertain
	// StateMounted means NodePublishVolume succeeded.
	StateMounted
)

func (s VolumeState) String() string {
	switch s {
	case StateNone:
		return "none"
	case StateUncertain:
		return "uncertain"
	case StateMounted:
		return "mounted"
	}
	return "VolumeState(" + strconv.Itoa(int(s)) + ")"
}

// Kubelet simulates the parts of the kubelet that talk to a CSI node plugin
// for ephemeral inline volumes. It is safe for concurrent use; operations on
// the same volume are serialized like the kubelet's per-volume operation lock.
type Kubelet struct {
	root           string
	endpoint       string
	driverName     string
	nodeName       string
	podInfoOnMount bool
	timeout        time.Duration

	mu       sync.Mutex
	pods     map[string]*kubeletPod        // desired state, by pod UID
	actual   map[kubeletVolKey]*kubeletVol // actual state
	locks    map[kubeletVolKey]*sync.Mutex
	calls    []string
	capCalls int
}

type kubeletVolKey struct{ uid, name string }

// kubeletPod is one pod of the desired state (the API server's view).
type kubeletPod struct {
	pod     Pod
	deleted bool                    // deleted in the API server
	volumes map[string]InlineVolume // desired volumes by name
}

// kubeletVol is one volume of the actual state.
type kubeletVol struct {
	state         VolumeState
	reconstructed bool
	handle        string
}

// NewKubelet returns a kubelet simulator. It panics when opts.Root is empty.
func NewKubelet(opts KubeletOptions) *Kubelet {
	if opts.Root == "" {
		panic("drivertest: KubeletOptions.Root is required")
	}
	root, err := filepath.Abs(opts.Root)
	if err != nil {
		panic("drivertest: KubeletOptions.Root: " + err.Error())
	}
	k := &Kubelet{
		root:           root,
		endpoint:       opts.Endpoint,
		driverName:     opts.DriverName,
		nodeName:       opts.NodeName,
		podInfoOnMount: opts.PodInfoOnMount == nil || *opts.PodInfoOnMount,
		timeout:        opts.Timeout,
		pods:           map[string]*kubeletPod{},
		actual:         map[kubeletVolKey]*kubeletVol{},
		locks:          map[kubeletVolKey]*sync.Mutex{},
	}
	if k.nodeName == "" {
		k.nodeName = kubeletDefaultNode
	}
	if k.timeout <= 0 {
		k.timeout = kubeletCSITimeout
	}
	return k
}

// Root returns the kubelet root directory (absolute).
func (k *Kubelet) Root() string { return k.root }

// NewPod creates a pod with a random UID and service account "default", and
// creates its directories (<root>/pods/<uid>, and the volumes and plugins
// directories in it, mode 0750) as the kubelet's makePodDataDirs does. It
// panics if the directories cannot be created.
func (k *Kubelet) NewPod(namespace, name string) *Pod {
	p := &Pod{Namespace: namespace, Name: name, UID: newUUID(), ServiceAccount: "default"}
	dir := k.podDir(p.UID)
	for _, d := range []string{dir, filepath.Join(dir, kubeletVolumesDir), filepath.Join(dir, kubeletPluginsDir)} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			panic("drivertest: creating pod directory: " + err.Error())
		}
	}
	k.mu.Lock()
	k.pods[p.UID] = &kubeletPod{pod: clonePod(p), volumes: map[string]InlineVolume{}}
	k.mu.Unlock()
	return p
}

// PodDir returns <root>/pods/<uid>.
func (k *Kubelet) PodDir(pod *Pod) string { return k.podDir(pod.UID) }

// TargetPath returns the target_path the kubelet sends for volume volName of
// pod: <root>/pods/<uid>/volumes/kubernetes.io~csi/<volName>/mount. The kubelet
// creates only its parent; creating the target is the driver's job.
func (k *Kubelet) TargetPath(pod *Pod, volName string) string {
	return k.targetPath(pod.UID, volName)
}

func (k *Kubelet) podDir(uid string) string {
	return filepath.Join(k.root, kubeletPodsDir, uid)
}

func (k *Kubelet) targetPath(uid, volName string) string {
	return filepath.Join(k.podDir(uid), kubeletVolumesDir, kubeletCSIPluginDir, volName, kubeletMountDir)
}

// State returns the kubelet's actual state of the volume.
func (k *Kubelet) State(pod *Pod, volName string) VolumeState {
	k.mu.Lock()
	defer k.mu.Unlock()
	if v := k.actual[kubeletVolKey{pod.UID, volName}]; v != nil {
		return v.state
	}
	return StateNone
}

// Calls returns the log of RPCs sent to the driver, in order:
// "NodeGetCapabilities", "NodePublishVolume <volume_id>",
// "NodeUnpublishVolume <volume_id>". A call is logged when it is sent, whether
// or not it succeeds.
func (k *Kubelet) Calls() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.calls)
}

// CapabilityCalls returns how many NodeGetCapabilities RPCs were sent.
func (k *Kubelet) CapabilityCalls() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.capCalls
}

// ResetCalls clears the RPC log and the capability counter.
func (k *Kubelet) ResetCalls() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.calls = nil
	k.capCalls = 0
}

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

// Unpublish runs the kubelet's TearDownAt for the volume: it reads the volume
// handle from vol_data.json (as NewUnmounter does), sends NodeUnpublishVolume
// with only volume_id and target_path, then runs removeMountDir. If any step
// fails the volume stays tracked so that a retry (or Restart) unpublishes it
// again. The volume is no longer desired either way. A volume the kubelet does
// not consider mounted or uncertain gets no RPC.
func (k *Kubelet) Unpublish(ctx context.Context, pod *Pod, volName string) error {
	k.mu.Lock()
	if p := k.pods[pod.UID]; p != nil {
		delete(p.volumes, volName)
	}
	k.mu.Unlock()
	return k.tearDown(ctx, pod.UID, volName)
}

func (k *Kubelet) tearDown(ctx context.Context, uid, volName string) error {
	key := kubeletVolKey{uid, volName}
	unlock := k.lockVolume(key)
	defer unlock()

	k.mu.Lock()
	v := k.actual[key]
	k.mu.Unlock()
	if v == nil {
		return nil
	}

	ctx, cancel := context.WithTimeout(ctx, k.timeout)
	defer cancel()

	target := k.targetPath(uid, volName)
	data, err := readVolData(filepath.Dir(target))
	if err != nil {
		return fmt.Errorf("drivertest: unmounter failed to load volume data of %s: %w", target, err)
	}
	handle := data[volDataVolumeHandle]
	req := &csi.NodeUnpublishVolumeRequest{VolumeId: handle, TargetPath: target}
	if err := k.call(ctx, "NodeUnpublishVolume "+handle, func(c csi.NodeClient) error {
		_, err := c.NodeUnpublishVolume(ctx, req)
		return err
	}); err != nil {
		return err
	}
	if err := k.removeMountDir(target); err != nil {
		return err
	}
	k.mu.Lock()
	delete(k.actual, key)
	k.mu.Unlock()
	return nil
}

// DeletePod models deleting the pod while the kubelet runs: the pod leaves the
// desired state, every tracked (mounted or uncertain) volume of the pod is
// unpublished (all of them; the errors are joined), and when that succeeded
// the kubelet's orphaned-pod cleanup removes the empty directories
// volumes/kubernetes.io~csi/<vol> of volumes it never mounted,
// volumes/kubernetes.io~csi, volumes, plugins and the pod directory. A
// directory that is not empty (for example a target the driver left mounted)
// makes DeletePod fail with "volume paths are still present", as the kubelet
// reports it. DeletePod can be called again to retry.
func (k *Kubelet) DeletePod(ctx context.Context, pod *Pod) error {
	k.mu.Lock()
	p := k.pods[pod.UID]
	if p == nil {
		p = &kubeletPod{pod: clonePod(pod), volumes: map[string]InlineVolume{}}
		k.pods[pod.UID] = p
	}
	p.deleted = true
	p.volumes = map[string]InlineVolume{}
	names := k.trackedVolumesLocked(pod.UID)
	k.mu.Unlock()

	var errs []error
	for _, name := range names {
		if err := k.tearDown(ctx, pod.UID, name); err != nil {
			errs = append(errs, fmt.Errorf("volume %s: %w", name, err))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if err := k.cleanupPodDirs(pod.UID); err != nil {
		return err
	}
	k.mu.Lock()
	if cur := k.pods[pod.UID]; cur == p {
		delete(k.pods, pod.UID)
	}
	k.mu.Unlock()
	return nil
}

// DeletePodOffline models deleting the pod from the API server while the
// kubelet is down: the pod leaves the desired state and nothing is sent to
// the driver and nothing on disk changes. The next Restart finds its volumes
// on disk and unpublishes them.
func (k *Kubelet) DeletePodOffline(pod *Pod) {
	k.mu.Lock()
	defer k.mu.Unlock()
	p := k.pods[pod.UID]
	if p == nil {
		p = &kubeletPod{pod: clonePod(pod)}
		k.pods[pod.UID] = p
	}
	p.deleted = true
	p.volumes = map[string]InlineVolume{}
}

// OrphanPod models a pod that was deleted while the kubelet was down and
// whose directory <root>/pods/<uid> disappeared as well (a node that lost its
// kubelet pods directory). Nothing is sent to the driver: the driver's garbage
// collection must notice that the pod's target paths are gone. The kubelet
// forgets the pod (desired and actual state).
//
// The pod directory tree is removed with os.RemoveAll when nothing is mounted
// below it. When something is mounted below it (a real driver's mount), the
// mount points and the directories leading to them are kept and everything
// else, including vol_data.json files, is removed: unmounting is left to the
// driver, and removing files through a mount would destroy volume data.
func (k *Kubelet) OrphanPod(pod *Pod) error {
	k.mu.Lock()
	delete(k.pods, pod.UID)
	for key := range k.actual {
		if key.uid == pod.UID {
			delete(k.actual, key)
		}
	}
	k.mu.Unlock()

	dir := k.podDir(pod.UID)
	mounts, err := mountPointsUnder(dir)
	if err != nil {
		return err
	}
	if len(mounts) == 0 {
		return os.RemoveAll(dir)
	}
	return removeAllExcept(dir, mounts)
}

// Restart models a kubelet restart. The actual state is forgotten and rebuilt
// from disk: every <root>/pods/*/volumes/kubernetes.io~csi/*/vol_data.json of
// this driver becomes an uncertain, reconstructed volume. Then, as the
// reconciler does, each volume of a desired pod whose spec still lists it is
// published again with the pod's original InlineVolume (the full Publish
// sequence), and every other one is unpublished with the handle from
// vol_data.json; a pod that is not desired and whose volumes were all
// unpublished has its empty directories removed as in DeletePod (best
// effort). The simulator has no retry loop: desired volumes that are not on
// disk (never published, or failed finally) are not published by Restart.
// Operations run one after another; their errors are joined.
func (k *Kubelet) Restart(ctx context.Context) error {
	found, err := k.scanVolumes()

	k.mu.Lock()
	k.actual = map[kubeletVolKey]*kubeletVol{}
	type job struct {
		key     kubeletVolKey
		publish bool
		pod     Pod
		vol     InlineVolume
	}
	var jobs []job
	for _, f := range found {
		k.actual[f.key] = &kubeletVol{state: StateUncertain, reconstructed: true, handle: f.handle}
		j := job{key: f.key}
		if p := k.pods[f.key.uid]; p != nil && !p.deleted {
			if vol, ok := p.volumes[f.key.name]; ok {
				j.publish, j.pod, j.vol = true, clonePod(&p.pod), cloneVolume(vol)
			}
		}
		jobs = append(jobs, j)
	}
	k.mu.Unlock()

	errs := []error{err}
	orphans := map[string]bool{}
	for _, j := range jobs {
		if j.publish {
			if err := k.setUp(ctx, j.pod, j.vol); err != nil {
				errs = append(errs, fmt.Errorf("republishing %s/%s: %w", j.key.uid, j.key.name, err))
			}
			continue
		}
		if _, ok := orphans[j.key.uid]; !ok {
			orphans[j.key.uid] = true
		}
		if err := k.tearDown(ctx, j.key.uid, j.key.name); err != nil {
			orphans[j.key.uid] = false
			errs = append(errs, fmt.Errorf("unpublishing %s/%s: %w", j.key.uid, j.key.name, err))
		}
	}
	for uid, clean := range orphans {
		k.mu.Lock()
		p := k.pods[uid]
		desired := p != nil && !p.deleted
		k.mu.Unlock()
		if !clean || desired {
			continue
		}
		// Best effort, like the kubelet's periodic orphan cleanup: directories
		// that are not empty (another driver's volumes) are left.
		if err := k.cleanupPodDirs(uid); err != nil {
			continue
		}
		k.mu.Lock()
		if p := k.pods[uid]; p != nil && p.deleted {
			delete(k.pods, uid)
		}
		k.mu.Unlock()
	}
	return errors.Join(errs...)
}

type foundVolume struct {
	key    kubeletVolKey
	handle string
}

// scanVolumes reads every vol_data.json of this driver under <root>/pods.
func (k *Kubelet) scanVolumes() ([]foundVolume, error) {
	pattern := filepath.Join(k.root, kubeletPodsDir, "*", kubeletVolumesDir, kubeletCSIPluginDir, "*", kubeletVolDataFile)
	files, err := filepath.Glob(pattern)
	if err != nil {
		return nil, err
	}
	var (
		out  []foundVolume
		errs []error
	)
	for _, f := range files {
		volDir := filepath.Dir(f)
		data, err := readVolData(volDir)
		if err != nil {
			errs = append(errs, fmt.Errorf("reconstructing %s: %w", volDir, err))
			continue
		}
		if data[volDataDriverName] != k.driverName {
			continue
		}
		uid := filepath.Base(filepath.Dir(filepath.Dir(filepath.Dir(volDir))))
		out = append(out, foundVolume{
			key:    kubeletVolKey{uid: uid, name: filepath.Base(volDir)},
			handle: data[volDataVolumeHandle],
		})
	}
	return out, errors.Join(errs...)
}

func (k *Kubelet) trackedVolumesLocked(uid string) []string {
	var names []string
	for key := range k.actual {
		if key.uid == uid {
			names = append(names, key.name)
		}
	}
	slices.Sort(names)
	return names
}

// cleanupPodDirs removes the pod's directories once no volume is tracked, like
// the kubelet's orphaned pod cleanup: empty volume directories first, then
// kubernetes.io~csi, volumes, plugins and the pod directory.
func (k *Kubelet) cleanupPodDirs(uid string) error {
	dir := k.podDir(uid)
	csiDir := filepath.Join(dir, kubeletVolumesDir, kubeletCSIPluginDir)
	if entries, err := os.ReadDir(csiDir); err == nil {
		for _, e := range entries {
			if e.IsDir() {
				_ = os.Remove(filepath.Join(csiDir, e.Name())) // only if empty
			}
		}
	}
	for _, d := range []string{csiDir, filepath.Join(dir, kubeletVolumesDir), filepath.Join(dir, kubeletPluginsDir), dir} {
		if err := os.Remove(d); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("drivertest: orphaned pod %q found, but volume paths are still present on disk: %w", uid, err)
		}
	}
	return nil
}

// removeMountDir is the kubelet's cleanup after an unpublish or a final publish
// failure. If target is a mount point nothing is removed and nil is returned.
// Otherwise target is removed (an error if it is not empty: the kubelet would
// retry), then vol_data.json and the parent directory.
func (k *Kubelet) removeMountDir(target string) error {
	mounted, err := isMountPoint(target)
	if err != nil {
		return err
	}
	if mounted {
		return nil
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("drivertest: failed to remove dir [%s]: %w", target, err)
	}
	parent := filepath.Dir(target)
	if err := os.Remove(filepath.Join(parent, kubeletVolDataFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("drivertest: failed to delete volume data file: %w", err)
	}
	if err := os.Remove(parent); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("drivertest: failed to delete volume path [%s]: %w", parent, err)
	}
	return nil
}

// writeVolData writes vol_data.json like the kubelet's saveVolumeData: a JSON
// object of strings followed by a newline, created with mode 0666 (before umask).
func (k *Kubelet) writeVolData(dir, specVolID, handle string) error {
	data := map[string]string{
		volDataSpecVolID:     specVolID,
		volDataVolumeHandle:  handle,
		volDataDriverName:    k.driverName,
		volDataNodeName:      k.nodeName,
		volDataAttachmentID:  attachmentID(handle, k.driverName, k.nodeName),
		volDataLifecycleMode: kubeletEphemeralMode,
	}
	b, err := json.Marshal(data)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(dir, kubeletVolDataFile), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o666)
	if err != nil {
		return err
	}
	_, err = f.Write(append(b, '\n'))
	return errors.Join(err, f.Close())
}

func readVolData(dir string) (map[string]string, error) {
	b, err := os.ReadFile(filepath.Join(dir, kubeletVolDataFile))
	if err != nil {
		return nil, err
	}
	var data map[string]string
	if err := json.Unmarshal(b, &data); err != nil {
		return nil, fmt.Errorf("parsing %s: %w", kubeletVolDataFile, err)
	}
	return data, nil
}

// attachmentID is the kubelet's getAttachmentName: "csi-" + hex(sha256(handle +
// driver + node)).
func attachmentID(handle, driver, node string) string {
	sum := sha256.Sum256([]byte(handle + driver + node))
	return "csi-" + hex.EncodeToString(sum[:])
}

// nodeGetCapabilities sends one NodeGetCapabilities RPC.
func (k *Kubelet) nodeGetCapabilities(ctx context.Context) ([]*csi.NodeServiceCapability, error) {
	var caps []*csi.NodeServiceCapability
	err := k.call(ctx, "NodeGetCapabilities", func(c csi.NodeClient) error {
		resp, err := c.NodeGetCapabilities(ctx, &csi.NodeGetCapabilitiesRequest{})
		caps = resp.GetCapabilities()
		return err
	})
	return caps, err
}

// call logs the RPC and runs it on a new connection that is closed afterwards,
// as the kubelet does for every CSI call.
func (k *Kubelet) call(ctx context.Context, name string, rpc func(csi.NodeClient) error) error {
	conn, err := k.dial()
	if err != nil {
		return err
	}
	defer conn.Close()
	k.mu.Lock()
	k.calls = append(k.calls, name)
	if name == "NodeGetCapabilities" {
		k.capCalls++
	}
	k.mu.Unlock()
	return rpc(csi.NewNodeClient(conn))
}

func (k *Kubelet) dial() (*grpc.ClientConn, error) {
	path := k.endpoint
	if rest, ok := strings.CutPrefix(path, "unix://"); ok {
		path = rest
	} else if rest, ok := strings.CutPrefix(path, "unix:"); ok {
		path = rest
	}
	if path == "" {
		return nil, errors.New("drivertest: KubeletOptions.Endpoint is empty")
	}
	return grpc.NewClient("passthrough:///"+path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithAuthority("localhost"),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", addr)
		}),
	)
}

// lockVolume serializes operations on one volume, like the kubelet's nested
// pending operations.
func (k *Kubelet) lockVolume(key kubeletVolKey) func() {
	k.mu.Lock()
	l := k.locks[key]
	if l == nil {
		l = &sync.Mutex{}
		k.locks[key] = l
	}
	k.mu.Unlock()
	l.Lock()
	return l.Unlock
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

func clonePod(p *Pod) Pod {
	c := *p
	if p.FSGroup != nil {
		g := *p.FSGroup
		c.FSGroup = &g
	}
	return c
}

func cloneVolume(v InlineVolume) InlineVolume {
	v.Attributes = maps.Clone(v.Attributes)
	v.Secrets = maps.Clone(v.Secrets)
	return v
}

// newUUID returns a random RFC 4122 version 4 UUID.
func newUUID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("drivertest: crypto/rand: " + err.Error())
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// isMountPoint reports whether path is a mount point, like the kubelet's
// IsLikelyNotMountPoint check: false for a missing path. On Linux it consults
// /proc/self/mountinfo, so a plain directory tree (fake mounter) is never
// mounted; elsewhere a symbolic link or irregular file (a Windows link or
// junction) counts as mounted, as in mount-utils for Windows.
func isMountPoint(path string) (bool, error) {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if runtime.GOOS != "linux" {
		return fi.Mode()&(fs.ModeSymlink|fs.ModeIrregular) != 0, nil
	}
	mounts, err := linuxMountPoints()
	if err != nil {
		return false, err
	}
	for _, p := range candidatePaths(path) {
		if mounts[p] {
			return true, nil
		}
	}
	return false, nil
}

// mountPointsUnder returns the mount points strictly below dir.
func mountPointsUnder(dir string) (map[string]bool, error) {
	out := map[string]bool{}
	if runtime.GOOS != "linux" {
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return err
			}
			if p != dir && d.Type()&(fs.ModeSymlink|fs.ModeIrregular) != 0 {
				out[p] = true
			}
			return nil
		})
		return out, err
	}
	mounts, err := linuxMountPoints()
	if err != nil {
		return nil, err
	}
	// Compare in the resolved namespace but report paths below dir.
	for _, base := range candidatePaths(dir) {
		prefix := base + string(filepath.Separator)
		for m := range mounts {
			if rel, ok := strings.CutPrefix(m, prefix); ok {
				out[filepath.Join(dir, rel)] = true
			}
		}
	}
	return out, nil
}

// removeAllExcept removes everything below dir except the paths in keep and
// the directories leading to them.
func removeAllExcept(dir string, keep map[string]bool) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if keep[p] {
			continue
		}
		if e.IsDir() && hasPathBelow(p, keep) {
			errs = append(errs, removeAllExcept(p, keep))
			continue
		}
		errs = append(errs, os.RemoveAll(p))
	}
	return errors.Join(errs...)
}

func hasPathBelow(dir string, paths map[string]bool) bool {
	prefix := dir + string(filepath.Separator)
	for p := range paths {
		if strings.HasPrefix(p, prefix) {
			return true
		}
	}
	return false
}

// candidatePaths returns path and, if different, its symlink-resolved form,
// since /proc/self/mountinfo lists resolved paths.
func candidatePaths(path string) []string {
	path = filepath.Clean(path)
	out := []string{path}
	if r, err := filepath.EvalSymlinks(path); err == nil && r != path {
		out = append(out, r)
	}
	return out
}

// linuxMountPoints returns the mount points of /proc/self/mountinfo.
func linuxMountPoints() (map[string]bool, error) {
	infos, err := mount.ReadMountInfo()
	if err != nil {
		return nil, err
	}
	out := make(map[string]bool, len(infos))
	for _, mi := range infos {
		out[mi.MountPoint] = true
	}
	return out, nil
}
