package drivertest

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/ephemera-csi/ephemera/framework/internal/volume"
)

// kubeletPluginsDir is the pod directory's "plugins" subdirectory, which the
// kubelet creates beside "volumes"; the rest of the layout is
// framework/internal/volume's.
const kubeletPluginsDir = "plugins"

// Defaults of KubeletOptions.
const (
	kubeletDefaultNode = "node-1"
	kubeletCSITimeout  = 2 * time.Minute // pkg/volume/csi csiTimeout
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
	// unpublish with its retries), like the kubelet's csiTimeout. Defaults
	// to 2 minutes.
	Timeout time.Duration
	// Retry is how Unpublish, DeletePod and Restart retry a
	// NodeUnpublishVolume the driver answers Aborted or Unavailable
	// ([InProgress]: a refresh or another request holds the volume, the driver
	// or its plugin is restarting), as the kubelet retries a pod's teardown
	// until it succeeds; every other answer is returned at once. The retries
	// of one teardown stay within Timeout. Publish and Republish never retry:
	// their answer is what a test checks (retry them with [Backoff.Retry]).
	// Defaults to KubeletBackoff(1); Backoff{Attempts: 1} sends one attempt.
	// [Kubelet.SetRetry] changes it later.
	Retry *Backoff
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
	retry    Backoff                       // KubeletOptions.Retry
	pods     map[string]*kubeletPod        // desired state, by pod UID
	actual   map[kubeletVolKey]*kubeletVol // actual state
	locks    map[kubeletVolKey]*sync.Mutex
	calls    []string
	capCalls int
	targets  map[string]bool // every target_path sent in a NodePublishVolume

	// madeDir, when set, is told of every directory the kubelet creates. Start
	// sets it to the AddDir of a mount.Fake, whose directories exist only in
	// memory, so that the driver finds the parent of its targets there.
	madeDir func(dir string)
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
		targets:        map[string]bool{},
	}
	if k.nodeName == "" {
		k.nodeName = kubeletDefaultNode
	}
	if k.timeout <= 0 {
		k.timeout = kubeletCSITimeout
	}
	k.retry = KubeletBackoff(1)
	if opts.Retry != nil {
		k.retry = *opts.Retry
	}
	return k
}

// SetRetry replaces KubeletOptions.Retry, the schedule on which teardowns
// retry an Aborted or Unavailable unpublish, for the operations started
// after it: for example Backoff{Attempts: 1} in a test that checks the code
// of a teardown's first answer, on a [Harness]'s Kubelet.
func (k *Kubelet) SetRetry(b Backoff) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.retry = b
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
	for _, d := range []string{dir, filepath.Join(dir, volume.VolumesDir), filepath.Join(dir, kubeletPluginsDir)} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			panic("drivertest: creating pod directory: " + err.Error())
		}
		k.made(d)
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
	return filepath.Join(k.root, volume.PodsDir, uid)
}

func (k *Kubelet) targetPath(uid, volName string) string {
	return volume.TargetPath(k.root, uid, volName)
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

// made reports a directory the kubelet created to madeDir.
func (k *Kubelet) made(dir string) {
	if k.madeDir != nil {
		k.madeDir(dir)
	}
}

// sentTargets returns every target_path sent in a NodePublishVolume, sorted.
func (k *Kubelet) sentTargets() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Sorted(maps.Keys(k.targets))
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

// trackedVolumesLocked returns the names of the pod's volumes in the actual
// state, sorted. k.mu must be held.
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
