package framework

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"time"

	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/csiserver"
	"github.com/ephemera-csi/ephemera/framework/internal/daemon"
	"github.com/ephemera-csi/ephemera/framework/internal/fill"
	"github.com/ephemera-csi/ephemera/framework/internal/lanes"
	"github.com/ephemera-csi/ephemera/framework/internal/stats"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// Options configure a Driver. Pass them by value to New; zero values take the
// documented defaults. Beside the three fields every driver sets (DriverName,
// Backends, Content), the options come in groups by subsystem, each a struct
// whose zero value means its defaults (set by its own setDefaults, which
// BindFlags reads too):
//
//   - Node: who and where the driver is (version, node, socket, directories,
//     kubelet registration).
//   - Volumes: what a volume is made of (default backend, accepted
//     attributes, mount options, authorizer, content calls and refreshes,
//     the mounter).
//   - Limits: how much the node gives (volumes, sizes, budgets, requests in
//     flight, deadlines, stats walks).
//   - State: the durable records and what startup does with a damaged file.
//   - GC: the orphan garbage collector.
//   - Observability: logs, metrics, /volumes, events and API checks.
type Options struct {
	// DriverName is the CSI driver name, which must match the CSIDriver object
	// (for example "scratch.csi.ephemera.dev"). Required: a name the API
	// server takes for a CSIDriver, at most 63 lower-case letters, digits,
	// '-' and '.' (api.ValidateDriverName).
	DriverName string
	// Backends maps backend names to implementations. Required: at least one.
	Backends map[string]Backend
	// Content, when set, fills every volume with files at publish and refreshes
	// them on republish (see ContentProvider). A backend that is itself a
	// ContentProvider (an out-of-process plugin, framework/plugin) fills its
	// own volumes instead. Its calls are tuned in Volumes.
	Content ContentProvider

	// Node says who and where the driver is.
	Node NodeOptions
	// Volumes says what a volume is made of.
	Volumes VolumeOptions
	// Limits bound what the node gives.
	Limits LimitOptions
	// State configures the durable records.
	State StateOptions
	// GC configures the orphan garbage collector.
	GC GCOptions
	// Observability configures logs, metrics, /volumes, events and the
	// CSIDriver check.
	Observability ObservabilityOptions

	// Runnables run beside the CSI server for as long as the driver: started
	// after the startup reconcile, stopped (their context canceled, then waited
	// for) after the server, the GC and the refresher have stopped. An error
	// one returns before that is logged; the driver keeps serving. Typical: the
	// events.Recorder behind Observability.Events, the kube.Pods informer
	// behind GC.Pods.
	Runnables []Runnable

	// flagNames are the flags that set fields (SetFlagName, BindFlags).
	flagNames map[string]string
}

// NodeOptions say who and where the driver is: identity and paths. The zero
// value takes the defaults.
type NodeOptions struct {
	// Version is reported by GetPluginInfo. Defaults to "dev".
	Version string
	// ID is reported by NodeGetInfo; normally the Kubernetes node name.
	// Required.
	ID string
	// Endpoint is the unix socket the CSI services listen on, as "unix:///path"
	// (or "unix://C:\path" on Windows). Defaults to
	// "unix://<KubeletRootDir>/plugins/<DriverName>/csi.sock".
	Endpoint string
	// KubeletRootDir is the kubelet's --root-dir. Target paths outside
	// <KubeletRootDir>/pods/ are refused. Defaults to /var/lib/kubelet
	// (C:\var\lib\kubelet on Windows).
	KubeletRootDir string
	// StateDir holds the driver's bbolt state (state.db) and backend data.
	// Defaults to /var/lib/ephemera/<DriverName> (C:\var\lib\ephemera\<DriverName>
	// on Windows). Must not be under /tmp on a real node: it must survive reboots
	// of the driver container.
	StateDir string
	// RegisterWithKubelet serves the kubelet plugin registration API on
	// <KubeletRootDir>/plugins_registry/<DriverName>-reg.sock so no
	// node-driver-registrar sidecar is needed. Defaults to false.
	RegisterWithKubelet bool
}

// setDefaults fills the zero fields. Endpoint and StateDir derive from the
// driver name and KubeletRootDir: without a driver name (BindFlags, before
// the flags are parsed) they are left empty.
func (n *NodeOptions) setDefaults(driverName string) {
	if n.Version == "" {
		n.Version = "dev"
	}
	if n.KubeletRootDir == "" {
		n.KubeletRootDir = defaultKubeletRoot
	}
	if driverName == "" {
		return
	}
	if n.StateDir == "" {
		n.StateDir = DefaultStateDir(driverName)
	}
	if n.Endpoint == "" {
		n.Endpoint = "unix://" + filepath.Join(n.KubeletRootDir, "plugins", driverName, "csi.sock")
	}
}

// VolumeOptions say what a volume is made of: its backend, the attributes it
// accepts, its mount options, who approves it, and how its content is
// fetched and refreshed. The zero value takes the defaults.
type VolumeOptions struct {
	// DefaultBackend is used when a volume has no "backend" attribute. Defaults to
	// the only backend when there is exactly one; required otherwise.
	DefaultBackend string
	// AcceptedAttributes declares the volume attributes the driver itself
	// accepts, beside the framework's ("size", "backend") and its backends'.
	// Each publish parses them once (required keys, defaults, enums, patterns,
	// DNS labels, quantities and integers within bounds; every problem
	// reported at once, InvalidArgument), hands their values to the backend
	// and the content provider as Volume.Values, and the backend the
	// remaining attributes in Volume.Params. An attribute nobody accepts is
	// refused with the list of every accepted key. A key a backend declares
	// (AttributeDeclarer) is refused by New.
	AcceptedAttributes api.Attributes
	// MountOptions adds mount options to every volume of a backend, by backend
	// name (for example {"tmpfs": {"noexec", "noatime"}}), from the safe list
	// mount.SafeOptions; nosuid and nodev are always set. They are the
	// operator's: pods cannot set mount options. Linux only. Defaults to none.
	MountOptions map[string][]string
	// Authorizer, when set, approves every first publish (see Authorizer). A
	// backend that is itself an Authorizer approves its volumes too: both
	// must.
	Authorizer Authorizer
	// ContentTimeout bounds one Content call, well under the kubelet's 2 minute
	// deadline (and below Limits.OperationTimeout). Defaults to 30s.
	ContentTimeout time.Duration
	// ContentBytesInFlight bounds the memory content answers take at once. A
	// content provider that bounds its answers (a ContentBounder, as a plugin
	// of framework/plugin is) reserves its bound from this budget before each
	// call and holds it until the files are written, so the answers in flight
	// never exceed it, however many pods start at once; a call that cannot
	// reserve within ContentTimeout fails with ResourceExhausted and the
	// kubelet retries. At its peak an answer takes about three times its
	// bound in memory (the message received, the files decoded, the garbage
	// collector's headroom): with the default, the worst answers the default
	// plugin bounds allow stay within the DaemonSet's memory plan (see
	// MemoryNeeded; make bench, TestDriverContentMemory, measures it and
	// docs/operations.md, "Memory and CPU of the driver", has the numbers). New refuses a provider whose bound
	// exceeds the budget. Default DefaultContentBytesInFlight.
	ContentBytesInFlight int64
	// ContentCapacity bounds the node memory that the content the driver
	// writes into memory-backed volumes (tmpfs) may take while they exist
	// where the kernel charges it to the driver: on a node without pod
	// cgroups (PodCgroups; the fallback), each such volume is reserved at
	// what its tmpfs can hold (its size, and content.InodeCharge per inode
	// of its nr_inodes) at its first write, until it is gone, whatever the
	// pod keeps alive of its content. Where the pods' cgroups pay for their
	// content (PodCgroups' default on a node with pod cgroups) it counts
	// nothing. A publish past it is refused (ResourceExhausted;
	// InvalidArgument for a volume larger than its provider may ever hold),
	// and a driver restarted with volumes in place counts them again. With
	// several content providers, each has ContentCapacity/(2×providers) to
	// itself and holds at most half. It is part of the driver's memory plan
	// (docs/operations.md): keep it under the container's memory limit with
	// the rest, and Go's soft memory limit (Limits.MemoryLimit) leaves it
	// out. Content on disk (loop devices, directories) does not count.
	// Default DefaultContentCapacity; NoContentCapacity for no bound.
	ContentCapacity int64
	// PodCgroups says where the kubelet keeps the pods' cgroups, so that
	// the content the driver writes into a memory-backed volume is written
	// from the pod's own memory cgroup and charged to the pod (DESIGN 4g;
	// docs/operations.md, "Who pays for content in memory").
	PodCgroups PodCgroupOptions
	// RefreshInterval, when set, refreshes the content of every volume this often
	// (each volume at a random offset within the interval, so refreshes spread
	// out). Defaults to 0: content is refreshed on republish and on Refresh calls.
	RefreshInterval time.Duration
	// RefreshConcurrency caps content refreshes in flight across all volumes, so
	// that a RefreshAll (a CA rotation, say) does not stampede the content's
	// source. Defaults to 4.
	RefreshConcurrency int
	// Mounter is the platform seam that publishes volumes. Defaults to
	// mount.New() (mount(2) on Linux, directory symlinks on Windows); unit tests
	// pass mount.NewFake().
	Mounter mount.Interface
	// WindowsMode is how the driver reaches the host on Windows when Mounter
	// is nil: WindowsHostProcess (a HostProcess container that links
	// directories itself: mount.New()) or WindowsCSIProxy (an ordinary
	// Windows container; every change on the host is a call to csi-proxy v1
	// over its named pipe: mount.NewCSIProxy). A driver whose backends must
	// create their storage through csi-proxy too (the dir backend's Host)
	// builds the mount.CSIProxy itself and passes it as Mounter. Defaults
	// to WindowsHostProcess; WindowsCSIProxy without a Mounter is refused on
	// other systems (there are no named pipes).
	WindowsMode WindowsMode
}

// WindowsMode is VolumeOptions.WindowsMode.
type WindowsMode string

// The values of VolumeOptions.WindowsMode (and of the scratch driver's
// --windows-mode).
const (
	WindowsHostProcess WindowsMode = "hostprocess"
	WindowsCSIProxy    WindowsMode = "csi-proxy"
)

// ParseWindowsMode returns the WindowsMode s names.
func ParseWindowsMode(s string) (WindowsMode, error) {
	switch m := WindowsMode(s); m {
	case WindowsHostProcess, WindowsCSIProxy:
		return m, nil
	}
	return "", fmt.Errorf("windows mode %q is neither %q nor %q", s, WindowsHostProcess, WindowsCSIProxy)
}

// Defaults of VolumeOptions.
const (
	defaultContentTimeout     = 30 * time.Second
	defaultRefreshConcurrency = 4
)

// setDefaults fills the zero fields; DefaultBackend is the only one of
// backends when there is exactly one. Mounter is made by New.
func (v *VolumeOptions) setDefaults(backends map[string]Backend) {
	if v.DefaultBackend == "" && len(backends) == 1 {
		for name := range backends {
			v.DefaultBackend = name
		}
	}
	if v.ContentTimeout == 0 {
		v.ContentTimeout = defaultContentTimeout
	}
	if v.ContentBytesInFlight == 0 {
		v.ContentBytesInFlight = DefaultContentBytesInFlight
	}
	if v.RefreshConcurrency == 0 {
		v.RefreshConcurrency = defaultRefreshConcurrency
	}
	if v.ContentCapacity == 0 {
		v.ContentCapacity = DefaultContentCapacity
	}
	if v.WindowsMode == "" {
		v.WindowsMode = WindowsHostProcess
	}
	v.PodCgroups.setDefaults()
}

// PodCgroupOptions is VolumeOptions.PodCgroups. The kernel charges a tmpfs
// page to the memory cgroup of the process that first writes it, for as
// long as anything keeps it alive: content the driver wrote itself would
// be the driver's to pay for, whatever the pod keeps of it (hard links,
// open descriptors, renamed files). So where the node has pod cgroups the
// driver writes the content of memory-backed volumes from a short-lived
// writer in the pod's memory cgroup (its own binary, run again; it never
// outlives the write): the pages count against the pod's limit, as a
// memory-backed emptyDir's do, and not against ContentCapacity. Where it
// has none (Windows, a kubelet with cgroupsPerQOS: false, Mode
// PodCgroupsOff), each memory-backed volume with content is reserved
// against ContentCapacity at what the kernel lets its tmpfs hold (size=
// and nr_inodes) until it is gone. The driver logs which at start
// ("Charging content in memory-backed volumes") and exports it
// (ephemera_content_charging{mode}).
type PodCgroupOptions struct {
	// Mode is PodCgroupsAuto (the default: the pods are charged where the
	// node has pod cgroups), PodCgroupsOff or PodCgroupsRequired (New
	// fails where the node has none).
	Mode string
	// Mount is where the host's cgroup tree is mounted as the driver sees
	// it: "/sys/fs/cgroup" (the default) on the host or in a privileged
	// container on cgroup v2; a container on cgroup v1 sees only its own
	// part there, so the manifests mount the host's at /host/sys/fs/cgroup.
	Mount string
	// KubeletCgroupRoot is the kubelet's cgroupRoot (--cgroup-root).
	// Default "/".
	KubeletCgroupRoot string
	// KubeletCgroupDriver is the kubelet's cgroupDriver, "cgroupfs" or
	// "systemd"; "auto" (the default) finds it from the kubelet's kubepods
	// cgroup.
	KubeletCgroupDriver string
	// Wait bounds how long a publish or refresh waits for its pod's cgroup
	// (the kubelet may publish a volume before it made the pod's cgroup);
	// past it the call is refused Unavailable and the kubelet retries.
	// Default 10s.
	Wait time.Duration
}

// Modes of PodCgroupOptions.Mode.
const (
	PodCgroupsAuto     = fill.PodCgroupsAuto
	PodCgroupsOff      = fill.PodCgroupsOff
	PodCgroupsRequired = fill.PodCgroupsRequired
)

func (p *PodCgroupOptions) setDefaults() {
	if p.Mode == "" {
		p.Mode = PodCgroupsAuto
	}
	if p.Mount == "" {
		p.Mount = "/sys/fs/cgroup"
	}
	if p.KubeletCgroupRoot == "" {
		p.KubeletCgroupRoot = "/"
	}
	if p.KubeletCgroupDriver == "" {
		p.KubeletCgroupDriver = "auto"
	}
	if p.Wait == 0 {
		p.Wait = fill.DefaultPodCgroupWait
	}
}

// LimitOptions bound what the node gives: volumes, sizes, capacity, requests
// in flight, deadlines and the stats walk. The zero value takes the defaults.
type LimitOptions struct {
	// MaxVolumesPerNode is reported in NodeGetInfo (the kubelet puts it in the
	// CSINode object as the driver's allocatable count) and enforced at publish
	// (ResourceExhausted; the kubelet retries). The scheduler does not count
	// inline CSI volumes against it: kube-scheduler's NodeVolumeLimits (v1.34)
	// counts volumes of PVCs, generic ephemeral volumes and migrated in-tree
	// volumes only, so a pod beyond the limit is still placed on the node and
	// waits there until one of its volumes ends. Defaults to 0: no limit.
	MaxVolumesPerNode int64
	// MaxVolumeSize caps the "size" attribute, and the size a backend makes of
	// it, in bytes: a pod chooses its size, and an unbounded one is a pod
	// taking the node's memory or disk. Defaults to DefaultMaxVolumeSize (1Gi);
	// NoMaxVolumeSize (-1) lifts the cap, leaving only the backends' own and
	// the Capacity budgets.
	MaxVolumeSize int64
	// Capacity is a per-backend budget in bytes for the sizes of all volumes on
	// this node (for example {"tmpfs": 4 << 30}); a publish that would exceed it
	// gets ResourceExhausted with the numbers, and the kubelet retries. A volume
	// larger than the whole budget never fits: it gets InvalidArgument, saying
	// that retrying does not help (the kubelet retries every error, so the code
	// changes only what its event says).
	// Usage is derived from the durable records, so it survives restarts. Sizes
	// are summed without overflow. Backends not listed are unlimited. Defaults to
	// no budgets.
	Capacity map[string]int64
	// MaxInFlight caps concurrent NodePublishVolume calls on the node, all
	// backends together; a publish past it gets ResourceExhausted and the
	// kubelet retries. Unpublishes have a lane of their own (see
	// MaxInFlightPerBackend). Defaults to 64.
	MaxInFlight int
	// MaxInFlightPerBackend caps the publishes in flight of one backend (each
	// plugin is a backend), so that a backend or plugin that never answers
	// holds at most this many of MaxInFlight; a publish past it fails at once
	// with ResourceExhausted naming the backend. The same number caps each
	// backend's unpublishes (with the GC's removals) in the teardown lane,
	// which publishes never use and no backend shares with another: the
	// node can always let the pods of other backends go. Defaults to
	// max(8, MaxInFlight/2), at most MaxInFlight; MaxInFlight for a driver
	// of one backend.
	MaxInFlightPerBackend int
	// InFlightReservedPerBackend is the part of MaxInFlight each backend has
	// to itself: no other backend's publishes can take it, however many of
	// them are stuck. The rest of MaxInFlight is shared, each backend taking
	// from it up to MaxInFlightPerBackend. The reserves of all backends must
	// fit MaxInFlight. Defaults to min(4, MaxInFlight / number of backends).
	InFlightReservedPerBackend int
	// MaxVolumesPerPod caps the volumes of this driver one pod may have on
	// the node; a publish past it is refused with InvalidArgument (the pod
	// never fits: retrying does not help). deploy/admission can refuse such
	// pods before they are scheduled. Defaults to 16; NoMaxVolumesPerPod for
	// no cap.
	MaxVolumesPerPod int
	// OperationTimeout bounds one publish or unpublish, well under the kubelet's
	// 2 minute deadline so rollback still has time. Defaults to 90s.
	OperationTimeout time.Duration
	// ProvisionTimeout bounds the Create of a LongProvisioner backend, which
	// runs in the background past the publish that started it (the kubelet's
	// retries attach to it): at least OperationTimeout, at most an hour.
	// Defaults to 10m.
	ProvisionTimeout time.Duration
	// StatsWalk bounds the walk NodeGetVolumeStats makes of a directory
	// volume (the dir backend, a plugin's directory source) to count its
	// usage: entries visited, depth and wall time, and how long an answer is
	// reused (see StatsWalkLimits). A walk stopped by a bound reports what it
	// counted, a lower bound. Zero fields default to 1,000,000 entries, 128
	// levels, 5s and a 1m cache.
	StatsWalk StatsWalkLimits
	// MemoryLimit is the driver container's memory limit in bytes (the
	// manifests pass resources.limits.memory through the downward API). Run
	// sets the Go runtime's soft memory limit from it (GoMemoryLimit: three
	// quarters of it, and at least 32 MiB below it for the binary's pages and
	// what Go does not allocate), unless the environment sets GOMEMLIMIT:
	// the collector then runs as often as Go's default allows while the heap
	// is small, and more often as the heap nears the limit, instead of the
	// container being OOM-killed. Defaults to 0: the runtime's limit is left
	// alone.
	MemoryLimit int64
	// KeepBinaryPages keeps resident the pages of the driver's executable
	// that starting up touched. By default, once the driver serves, it gives
	// them back to the kernel (Linux; see framework/internal/exepages), which
	// lowers the driver's RSS, and its container's memory charge, by most of
	// its binary's share. What runs afterwards reads its code back a page at a
	// time (once from the disk, then from the page cache): the first publish
	// after a start takes longer (docs/operations.md, "Memory and CPU of the
	// driver", has the numbers). Defaults to false.
	KeepBinaryPages bool
}

// LimitOptions.MaxVolumeSize's default, and its value for no cap.
const (
	DefaultMaxVolumeSize int64 = 1 << 30
	NoMaxVolumeSize      int64 = -1
)

// NoMaxVolumesPerPod is LimitOptions.MaxVolumesPerPod for no cap.
const NoMaxVolumesPerPod = -1

// Defaults of LimitOptions.
const (
	defaultMaxInFlight      = 64
	defaultMaxVolumesPerPod = 16
	defaultOperationTimeout = 90 * time.Second
	defaultProvisionTimeout = 10 * time.Minute
)

// GoMemoryLimit is the Go runtime's soft memory limit Run sets for a
// container memory limit (LimitOptions.MemoryLimit): three quarters of it,
// and at least 32 MiB below it; 0 or less when the container limit leaves
// nothing for Go. Run gives it the container limit less
// VolumeOptions.ContentCapacity: the content in memory-backed volumes is
// charged to the container, not to Go's heap.
func GoMemoryLimit(containerLimit int64) int64 {
	return daemon.GoMemoryLimit(containerLimit)
}

// MemoryNeeded is the least container memory limit that holds the driver's
// memory plan (docs/operations.md, "The memory plan"): Go's soft limit
// (GoMemoryLimit of the container limit less contentCapacity) must hold the
// content answers in flight at their peak, three times contentBytesInFlight,
// and statsWalks walks of directory volumes at their bound; the content in
// memory-backed volumes (contentCapacity) comes on top. NoContentCapacity
// has no bound, so no limit holds it: MemoryNeeded returns -1.
func MemoryNeeded(contentBytesInFlight, contentCapacity int64, statsWalks int) int64 {
	if contentCapacity < 0 {
		return -1
	}
	goNeeds := 3*contentBytesInFlight + int64(statsWalks)*stats.WalkMemory
	return contentCapacity + max((goNeeds*4+2)/3, goNeeds+daemon.GoReserve)
}

// setDefaults fills the zero fields.
func (l *LimitOptions) setDefaults() {
	if l.MaxVolumeSize == 0 {
		l.MaxVolumeSize = DefaultMaxVolumeSize
	}
	if l.MaxInFlight == 0 {
		l.MaxInFlight = defaultMaxInFlight
	}
	if l.MaxVolumesPerPod == 0 {
		l.MaxVolumesPerPod = defaultMaxVolumesPerPod
	}
	if l.OperationTimeout == 0 {
		l.OperationTimeout = defaultOperationTimeout
	}
	if l.ProvisionTimeout == 0 {
		l.ProvisionTimeout = defaultProvisionTimeout
	}
	l.StatsWalk.setDefaults()
}

// StateOptions configure the durable records of the volumes. The zero value
// takes the defaults.
type StateOptions struct {
	// Recovery says what startup does with a damaged state file:
	// StateRecoveryRebuild (the default) keeps what can still be read, moves
	// the file aside (it is never deleted) and rebuilds the state from the node,
	// adopting every volume found there; StateRecoveryRefuse fails the startup
	// so an operator can inspect the file first. Rebuilding never deletes a
	// volume, so it is safe to leave on.
	Recovery string
	// LockTimeout is how long opening the state file waits for its lock before
	// failing with a clear error (another driver process holds it). Defaults to 5s.
	LockTimeout time.Duration
	// Store holds the per-volume state. Defaults to a bbolt file at
	// <Node.StateDir>/state.db; unit tests may pass memstore.New().
	Store store.Store
}

// defaultLockTimeout is StateOptions.LockTimeout's default.
const defaultLockTimeout = 5 * time.Second

// setDefaults fills the zero fields. Store is opened by New.
func (s *StateOptions) setDefaults() {
	if s.Recovery == "" {
		s.Recovery = StateRecoveryRebuild
	}
	if s.LockTimeout == 0 {
		s.LockTimeout = defaultLockTimeout
	}
}

// GCOptions configure the orphan garbage collector, which tears down the
// volumes of pods deleted while the node or the driver was down, that the
// kubelet will never unpublish. The zero value takes the defaults.
type GCOptions struct {
	// Interval is how often the orphan GC looks for volumes whose pod
	// directory under the kubelet root is gone. It also runs once at
	// startup. Defaults to 1m; negative disables the GC.
	Interval time.Duration
	// OrphanGracePeriod is how long a volume must look orphaned before the GC
	// tears it down: a time from the pass that first saw it so, whatever the
	// passes in between (each backend's removals run apart, each bounded by
	// Limits.OperationTimeout, and no pass waits for them). Defaults to 2m.
	OrphanGracePeriod time.Duration
	// DryRun makes the GC only log what it would remove.
	DryRun bool
	// MaxOrphanShare is the share of volumes that may look orphaned in one
	// GC pass before the pass is distrusted (a replaced or hidden pods
	// directory makes every volume look orphaned): above it, with Pods set, only
	// volumes whose pods the API server confirms gone are removed; without Pods
	// nothing is. One orphan is always allowed. Defaults to 0.5.
	MaxOrphanShare float64
	// Pods, when set, confirms with the API server that an orphan's pod is gone
	// before the GC removes its volume (see framework/kube).
	Pods PodChecker
}

// Defaults of GCOptions.
const (
	defaultGCInterval        = time.Minute
	defaultOrphanGracePeriod = 2 * time.Minute
	defaultGCMaxOrphanShare  = 0.5
)

// setDefaults fills the zero fields.
func (g *GCOptions) setDefaults() {
	if g.Interval == 0 {
		g.Interval = defaultGCInterval
	}
	if g.OrphanGracePeriod == 0 {
		g.OrphanGracePeriod = defaultOrphanGracePeriod
	}
	if g.MaxOrphanShare == 0 {
		g.MaxOrphanShare = defaultGCMaxOrphanShare
	}
}

// ObservabilityOptions configure what the driver tells: its logs, the
// metrics and health server, /volumes, Kubernetes events and the check of its
// CSIDriver object. The zero value takes the defaults.
type ObservabilityOptions struct {
	// Logger is the root logger. Defaults to klog.Background() (taken in New,
	// so a klog logger set after the flags are parsed is the one used).
	Logger klog.Logger
	// MetricsAddress, when set ("host:port", e.g. ":9809" or "127.0.0.1:9809"),
	// serves /metrics, /healthz, /readyz and /volumes over plain HTTP from before the
	// startup reconcile until Run returns (see Driver.Handler to mount them in
	// a server of your own instead). Defaults to "": not served.
	MetricsAddress string
	// VolumesEndpoint says whether Handler (and so the MetricsAddress
	// server) serves GET /volumes: for every volume on this node its ID, the
	// pod's namespace, name and UID, the volume's name, target path, backend,
	// size, phase, creation time and usage, to whoever reaches the address
	// (never attributes, secrets or tokens). ephemera-scratch volumes and
	// kubectl ephemera volumes read it. False: /volumes answers 404, as any
	// unknown path, and nothing else changes. Defaults to true (nil: served).
	VolumesEndpoint *bool
	// Events, when set, receives Kubernetes events for pods whose volume failed
	// to provision or refresh, or was removed by the orphan GC (see EventSink
	// and package framework/events). Defaults to nil: no events.
	Events EventSink
	// CSIDrivers, when set, reads the driver's CSIDriver object once at
	// startup (after the reconcile) to check it: Ephemeral among its
	// volumeLifecycleModes, podInfoOnMount true, fsGroupPolicy File,
	// attachRequired false (see CheckCSIDriver). A problem is logged as an
	// error saying what to fix, exported as ephemera_csidriver_misconfigured,
	// and posted as a Warning event on the object when Events is a
	// CSIDriverEventSink; the driver serves either way. kube.Client is one;
	// its service account needs get on csidrivers.storage.k8s.io. Defaults to
	// nil: not checked (the log says so at startup).
	CSIDrivers CSIDriverGetter
	// CSIDriverCheckJitter is the longest random delay before that check's
	// first read, so that the drivers of a fleet restarting at once (a
	// rollout, the API server back from an outage) spread their reads.
	// Defaults to DefaultCSIDriverCheckJitter when zero; negative: none.
	CSIDriverCheckJitter time.Duration
	// FleetSize, when set, returns how many drivers may start at once with
	// this one: its DaemonSet's desiredNumberScheduled, kube.FleetSize's
	// Size (shared with kube.PodsOptions.FleetSize: one answer per start).
	// The startup check then asks it once, after a random fraction of
	// CSIDriverCheckJitter, and reads after the same fraction of the rest of
	// a window that grows with the fleet, 50 ms per driver
	// (about 20 reads a second fleet-wide, at most five minutes), no shorter
	// than CSIDriverCheckJitter: the same window as kube.PodsOptions.FleetSize
	// gives the pod informer's first list. An error leaves
	// CSIDriverCheckJitter (logged). Ignored when CSIDriverCheckJitter is
	// negative. Defaults to nil: CSIDriverCheckJitter.
	FleetSize func(ctx context.Context) (int, error)
}

// DefaultCSIDriverCheckJitter is ObservabilityOptions.CSIDriverCheckJitter's
// default.
const DefaultCSIDriverCheckJitter = 10 * time.Second

// setDefaults fills the zero fields.
func (ob *ObservabilityOptions) setDefaults() {
	if ob.Logger.GetSink() == nil {
		ob.Logger = klog.Background()
	}
	if ob.VolumesEndpoint == nil {
		ob.VolumesEndpoint = new(true)
	}
	if ob.CSIDriverCheckJitter == 0 {
		ob.CSIDriverCheckJitter = DefaultCSIDriverCheckJitter
	}
}

// DefaultContentBytesInFlight is VolumeOptions.ContentBytesInFlight's default:
// three plugin answers of plugin.DefaultMaxContentBytes at once.
const DefaultContentBytesInFlight int64 = 48 << 20

// DefaultContentCapacity is VolumeOptions.ContentCapacity's default: room for
// the content of thousands of volumes of secrets and tokens (a few files of
// a few KiB take a few tens of KiB each), or one answer of the largest
// content the default plugin bounds allow (10,000 small files take about three
// times their bytes of tmpfs), within the DaemonSet's memory plan
// (docs/operations.md, "Capacity planning", has the numbers).
const DefaultContentCapacity int64 = 64 << 20

// NoContentCapacity is VolumeOptions.ContentCapacity for no bound.
const NoContentCapacity int64 = -1

// DefaultStateDir is NodeOptions.StateDir's default for a driver:
// /var/lib/ephemera/<driverName> (C:\var\lib\ephemera\<driverName> on Windows). A
// driver that places backend data under its state dir before New uses it too.
func DefaultStateDir(driverName string) string {
	return filepath.Join(defaultStateRoot, driverName)
}

func (o *Options) setDefaults() {
	o.Node.setDefaults(o.DriverName)
	o.Volumes.setDefaults(o.Backends)
	o.Limits.setDefaults()
	if o.Limits.MaxInFlightPerBackend == 0 {
		o.Limits.MaxInFlightPerBackend = lanes.DefaultPerBackend(o.Limits.MaxInFlight, len(o.Backends))
	}
	if o.Limits.InFlightReservedPerBackend == 0 {
		o.Limits.InFlightReservedPerBackend = lanes.DefaultReserved(o.Limits.MaxInFlight, len(o.Backends), o.Limits.MaxInFlightPerBackend)
	}
	o.State.setDefaults()
	o.GC.setDefaults()
	o.Observability.setDefaults()
}

// validate reports every problem of o after defaults: the root's own (the
// flag names, the Windows mode and the mounter), then each subsystem's
// check of the config it takes, in this order: the process
// (internal/daemon), the volumes' lifecycle (internal/lifecycle) and the
// reading of requests (internal/csiserver).
func (o *Options) validate() error {
	var errs []error
	if err := o.checkFlagNames(); err != nil {
		errs = append(errs, err)
	}
	if _, err := ParseWindowsMode(string(o.Volumes.WindowsMode)); err != nil {
		errs = append(errs, fmt.Errorf("Volumes.WindowsMode: %w", err))
	} else if o.Volumes.WindowsMode == WindowsCSIProxy && o.Volumes.Mounter == nil && !isWindows {
		errs = append(errs, errors.New("Volumes.WindowsMode csi-proxy needs Windows (csi-proxy's named pipes), or a Volumes.Mounter (mount.NewCSIProxy with a Dial)"))
	}
	dc := o.daemonConfig()
	errs = append(errs, dc.Check()...)
	errs = append(errs, o.engineConfig().Check()...)
	errs = append(errs, csiserver.Check(backendNames(o.Backends), o.Volumes.DefaultBackend, o.Limits.MaxVolumeSize)...)
	return errors.Join(errs...)
}

func backendNames(m map[string]Backend) []string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
