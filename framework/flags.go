package framework

import (
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/ephemera-csi/ephemera/framework/internal/words"
	"github.com/ephemera-csi/ephemera/framework/mount"
)

// BindFlags registers on fs the command-line flags every driver binary needs and
// the operator-facing knobs of Options, writing into o. Values already in o are
// the defaults shown; the others are the groups' own defaults (their
// setDefaults), written into the fields bound here only. A driver adds its own
// flags beside them.
//
//	--endpoint --nodeid (default $NODE_NAME) --kubelet-root --state-dir --state-recovery --register
//	--max-volumes-per-node --metrics-address --volumes-endpoint --gc-interval
//	--orphan-grace-period --gc-dry-run --gc-max-orphan-share --content-bytes-in-flight --content-capacity
//	--pod-cgroups --pod-cgroup-mount --kubelet-cgroup-root --kubelet-cgroup-driver --pod-cgroup-wait
//	--mount-options --stats-max-entries --stats-max-depth --stats-timeout --stats-max-walks
//	--stats-max-linked-files --stats-cache-ttl
//	--max-in-flight --max-in-flight-per-backend --in-flight-reserved-per-backend --max-volumes-per-pod
//	--operation-timeout --provision-timeout --content-timeout --memory-limit --keep-binary-pages
func BindFlags(fs *flag.FlagSet, o *Options) {
	if o.Node.ID == "" {
		o.Node.ID = os.Getenv("NODE_NAME")
	}
	// The defaults, on copies: a field no flag binds keeps its zero value
	// until New (the Logger, say, which follows a klog logger set after the
	// flags are parsed). Without a driver name the node's Endpoint and
	// StateDir stay empty: New derives them from --kubelet-root.
	node, volumes, limits, state, gc, obs := o.Node, o.Volumes, o.Limits, o.State, o.GC, o.Observability
	node.setDefaults("")
	volumes.setDefaults(nil)
	limits.setDefaults()
	state.setDefaults()
	gc.setDefaults()
	obs.setDefaults()

	fs.StringVar(&o.Node.Endpoint, "endpoint", node.Endpoint, "CSI endpoint, unix:///path/csi.sock. Default unix://<kubelet-root>/plugins/<driver-name>/csi.sock.")
	fs.StringVar(&o.Node.ID, "nodeid", node.ID, "Node ID: the Kubernetes node name (default $NODE_NAME).")
	fs.StringVar(&o.Node.KubeletRootDir, "kubelet-root", node.KubeletRootDir, "The kubelet's --root-dir.")
	fs.StringVar(&o.Node.StateDir, "state-dir", node.StateDir, "Directory for the driver's state (state.db) and backend data. Default "+defaultStateRoot+"/<driver-name>; never under /tmp on a node.")
	fs.StringVar(&o.State.Recovery, "state-recovery", state.Recovery, "What startup does with a damaged state file: rebuild (move it aside, never delete it, and rebuild the state from the node) or refuse (fail, to inspect it first).")
	fs.BoolVar(&o.Node.RegisterWithKubelet, "register", node.RegisterWithKubelet, "Register with the kubelet through <kubelet-root>/plugins_registry (no node-driver-registrar sidecar needed).")
	fs.Int64Var(&o.Limits.MaxVolumesPerNode, "max-volumes-per-node", limits.MaxVolumesPerNode, "Volumes this driver serves per node, reported to the scheduler. 0: no limit.")
	fs.StringVar(&o.Observability.MetricsAddress, "metrics-address", obs.MetricsAddress, "Serve /metrics, /healthz, /readyz and /volumes over HTTP on this address, e.g. :9809. Empty: off.")
	o.Observability.VolumesEndpoint = obs.VolumesEndpoint
	fs.BoolVar(o.Observability.VolumesEndpoint, "volumes-endpoint", *obs.VolumesEndpoint, "Serve GET /volumes on --metrics-address: the pods (namespace, name, UID), targets, backends, sizes and usage of this node's volumes, for ephemera-scratch volumes and kubectl ephemera volumes. false: 404.")
	fs.DurationVar(&o.GC.Interval, "gc-interval", gc.Interval, "How often the orphan GC looks for volumes whose pod directory is gone. Negative: off.")
	fs.DurationVar(&o.GC.OrphanGracePeriod, "orphan-grace-period", gc.OrphanGracePeriod, "How long a volume must look orphaned before the GC removes it.")
	fs.BoolVar(&o.GC.DryRun, "gc-dry-run", gc.DryRun, "Only log what the orphan GC would remove.")
	o.Volumes.ContentBytesInFlight = volumes.ContentBytesInFlight
	fs.Var(bytesFlag{&o.Volumes.ContentBytesInFlight, false}, "content-bytes-in-flight", "Memory content answers of plugins may take at once, e.g. 48Mi: each call reserves its plugin's bound (the default, 48Mi, is three answers of 16Mi, a plugin's default bound) until its files are written; at its peak an answer takes about three times its bound, so keep three times this under the container's memory limit.")
	o.Volumes.ContentCapacity = volumes.ContentCapacity
	fs.Var(capacityFlag{&o.Volumes.ContentCapacity}, "content-capacity", "Node memory the content the driver writes into tmpfs volumes may take while they exist where the driver pays for it (a node without pod cgroups, see --pod-cgroups): each such volume counts at its tmpfs's size and 1Ki per inode of it, from its first write until it is gone. A publish past it is refused (ResourceExhausted). Part of the memory plan: keep the container's memory limit at least this plus what --content-bytes-in-flight and --stats-max-walks need (docs/operations.md, \"The memory plan\"). -1: no bound.")
	o.Volumes.PodCgroups = volumes.PodCgroups
	pc := &o.Volumes.PodCgroups
	fs.StringVar(&pc.Mode, "pod-cgroups", pc.Mode, "Who pays for the content the driver writes into tmpfs volumes: auto (each pod, from a writer in its own memory cgroup, where the node has pod cgroups; else the driver, each volume reserved against --content-capacity at its tmpfs's size), off (always the driver) or required (refuse to start without pod cgroups). See docs/operations.md, \"Who pays for content in memory\".")
	fs.StringVar(&pc.Mount, "pod-cgroup-mount", pc.Mount, "Where the host's cgroup tree is mounted as the driver sees it (a container on cgroup v1 sees only its own part of /sys/fs/cgroup: mount the host's, e.g. at /host/sys/fs/cgroup).")
	fs.StringVar(&pc.KubeletCgroupRoot, "kubelet-cgroup-root", pc.KubeletCgroupRoot, "The kubelet's cgroupRoot (--cgroup-root), below which it keeps the pods' cgroups.")
	fs.StringVar(&pc.KubeletCgroupDriver, "kubelet-cgroup-driver", pc.KubeletCgroupDriver, "The kubelet's cgroupDriver: cgroupfs, systemd, or auto (found from its kubepods cgroup).")
	fs.DurationVar(&pc.Wait, "pod-cgroup-wait", pc.Wait, "How long a publish waits for its pod's cgroup before it is refused Unavailable (the kubelet retries).")
	fs.Var((*mountOptionsFlag)(&o.Volumes.MountOptions), "mount-options", "Mount options for every volume of a backend, BACKEND=opt[,opt...] (repeatable), from "+strings.Join(mount.SafeOptions, ", ")+"; nosuid and nodev are always set; pods cannot set mount options. Linux only.")
	fs.Float64Var(&o.GC.MaxOrphanShare, "gc-max-orphan-share", gc.MaxOrphanShare, "Share of volumes that may look orphaned in one GC pass; above it only volumes whose pods the API server confirms gone are removed (none when the driver does not ask the API server).")
	fs.Int64Var(&o.Limits.StatsWalk.MaxEntries, "stats-max-entries", limits.StatsWalk.MaxEntries, "Entries one volume-stats walk of a directory volume visits at most; past it the usage reported is a lower bound.")
	fs.IntVar(&o.Limits.StatsWalk.MaxDepth, "stats-max-depth", limits.StatsWalk.MaxDepth, "Levels below a directory volume's root one volume-stats walk enters at most; deeper entries are not counted.")
	fs.DurationVar(&o.Limits.StatsWalk.Timeout, "stats-timeout", limits.StatsWalk.Timeout, "Wall time of one volume-stats walk of a directory volume at most (up to 1m); past it the usage reported is a lower bound.")
	fs.IntVar(&o.Limits.StatsWalk.MaxConcurrent, "stats-max-walks", limits.StatsWalk.MaxConcurrent, "Volume-stats walks of directory volumes in progress on the node at most (each holds up to 8Mi); others wait for a turn.")
	fs.IntVar(&o.Limits.StatsWalk.MaxLinkedFiles, "stats-max-linked-files", limits.StatsWalk.MaxLinkedFiles, "Files with several hard links one volume-stats walk remembers to count once at most; past it the usage reported is a lower bound.")
	fs.DurationVar(&o.Limits.StatsWalk.CacheTTL, "stats-cache-ttl", limits.StatsWalk.CacheTTL, "How long the usage of a directory volume is reused before it is walked again. Negative: not reused (concurrent calls still share one walk).")
	o.Limits.MemoryLimit = limits.MemoryLimit
	fs.IntVar(&o.Limits.MaxInFlight, "max-in-flight", limits.MaxInFlight, "Volume publishes in flight on this node at most, across all backends; past it a publish gets ResourceExhausted and the kubelet retries.")
	// Derived from --max-in-flight (and the backends) when not given: bound
	// to o's own zero, not to the copy's default, so that they follow it.
	fs.IntVar(&o.Limits.MaxInFlightPerBackend, "max-in-flight-per-backend", o.Limits.MaxInFlightPerBackend, "Publishes in flight of one backend (each --plugin is one) at most, so that a backend that never answers holds at most this many of --max-in-flight; also each backend's unpublishes in flight, in a lane of their own that publishes and other backends never take. 0: max(8, --max-in-flight/2), all of --max-in-flight for a driver of one backend.")
	fs.IntVar(&o.Limits.InFlightReservedPerBackend, "in-flight-reserved-per-backend", o.Limits.InFlightReservedPerBackend, "Slots of --max-in-flight each backend has to itself, which other backends' publishes cannot take; the reserves of all backends must fit --max-in-flight. 0: min(4, --max-in-flight / backends).")
	fs.IntVar(&o.Limits.MaxVolumesPerPod, "max-volumes-per-pod", limits.MaxVolumesPerPod, "Volumes of this driver one pod may have on the node at most; past it a publish is refused (InvalidArgument). -1: no cap.")
	fs.DurationVar(&o.Limits.OperationTimeout, "operation-timeout", limits.OperationTimeout, "Wall time of one publish or unpublish at most (well under the kubelet's 2m deadline, so that a rollback still has time).")
	fs.DurationVar(&o.Limits.ProvisionTimeout, "provision-timeout", limits.ProvisionTimeout, "Wall time of one Create of a backend or plugin that declares long provisioning at most (between --operation-timeout and 1h): it goes on in the background past the kubelet's call, whose retries attach to it.")
	fs.DurationVar(&o.Volumes.ContentTimeout, "content-timeout", volumes.ContentTimeout, "Wall time of one call for a volume's content at most, waiting for the content budget included.")
	fs.Var(bytesFlag{&o.Limits.MemoryLimit, true}, "memory-limit", "The container's memory limit, e.g. 256Mi, or in bytes as the downward API gives resources.limits.memory: Go's soft memory limit is set to three quarters of it (at least 32 MiB below it) unless GOMEMLIMIT is set. 0: not set.")
	fs.BoolVar(&o.Limits.KeepBinaryPages, "keep-binary-pages", limits.KeepBinaryPages, "Keep resident the pages of the driver's binary that starting up touched, instead of giving them back to the kernel once serving (about 5 MiB of RSS with 1,000 volumes). Linux only.")
	for field, flag := range boundFlags {
		o.SetFlagName(field, "--"+flag)
	}
}

// boundFlags says which flag of BindFlags sets which field of Options: the
// driver's messages name the flag (SetFlagName). TestBindFlagsNamesFields
// checks it against the flags, and each flag against its field.
var boundFlags = map[string]string{
	"Node.Endpoint":                          "endpoint",
	"Node.ID":                                "nodeid",
	"Node.KubeletRootDir":                    "kubelet-root",
	"Node.StateDir":                          "state-dir",
	"State.Recovery":                         "state-recovery",
	"Node.RegisterWithKubelet":               "register",
	"Limits.MaxVolumesPerNode":               "max-volumes-per-node",
	"Observability.MetricsAddress":           "metrics-address",
	"Observability.VolumesEndpoint":          "volumes-endpoint",
	"GC.Interval":                            "gc-interval",
	"GC.OrphanGracePeriod":                   "orphan-grace-period",
	"GC.DryRun":                              "gc-dry-run",
	"Volumes.ContentBytesInFlight":           "content-bytes-in-flight",
	"Volumes.ContentCapacity":                "content-capacity",
	"Volumes.MountOptions":                   "mount-options",
	"Volumes.PodCgroups.Mode":                "pod-cgroups",
	"Volumes.PodCgroups.Mount":               "pod-cgroup-mount",
	"Volumes.PodCgroups.KubeletCgroupRoot":   "kubelet-cgroup-root",
	"Volumes.PodCgroups.KubeletCgroupDriver": "kubelet-cgroup-driver",
	"Volumes.PodCgroups.Wait":                "pod-cgroup-wait",
	"GC.MaxOrphanShare":                      "gc-max-orphan-share",
	"Limits.StatsWalk.MaxEntries":            "stats-max-entries",
	"Limits.StatsWalk.MaxConcurrent":         "stats-max-walks",
	"Limits.StatsWalk.MaxLinkedFiles":        "stats-max-linked-files",
	"Limits.StatsWalk.MaxDepth":              "stats-max-depth",
	"Limits.StatsWalk.Timeout":               "stats-timeout",
	"Limits.StatsWalk.CacheTTL":              "stats-cache-ttl",
	"Limits.MaxInFlight":                     "max-in-flight",
	"Limits.MaxInFlightPerBackend":           "max-in-flight-per-backend",
	"Limits.InFlightReservedPerBackend":      "in-flight-reserved-per-backend",
	"Limits.MaxVolumesPerPod":                "max-volumes-per-pod",
	"Limits.OperationTimeout":                "operation-timeout",
	"Limits.ProvisionTimeout":                "provision-timeout",
	"Volumes.ContentTimeout":                 "content-timeout",
	"Limits.MemoryLimit":                     "memory-limit",
	"Limits.KeepBinaryPages":                 "keep-binary-pages",
}

// bytesFlag is a quantity of bytes, as 48Mi or 50331648, into n: positive,
// or also 0 with zero.
type bytesFlag struct {
	n    *int64
	zero bool
}

func (b bytesFlag) String() string {
	if b.n == nil {
		return "0"
	}
	return words.Bytes(*b.n)
}

func (b bytesFlag) Set(v string) error {
	q, err := resource.ParseQuantity(v)
	switch {
	case b.zero && (err != nil || q.Sign() < 0):
		return fmt.Errorf("%q is not a quantity of bytes like 256Mi", v)
	case !b.zero && (err != nil || q.Sign() <= 0):
		return fmt.Errorf("%q is not a positive quantity of bytes like 48Mi", v)
	}
	*b.n = q.Value()
	return nil
}

// capacityFlag is a quantity of bytes, as 64Mi, into n, or -1 for no bound.
type capacityFlag struct{ n *int64 }

func (c capacityFlag) String() string {
	if c.n == nil {
		return "0"
	}
	if *c.n < 0 {
		return "-1"
	}
	return words.Bytes(*c.n)
}

func (c capacityFlag) Set(v string) error {
	if v == "-1" {
		*c.n = NoContentCapacity
		return nil
	}
	return bytesFlag{c.n, false}.Set(v)
}

// mountOptionsFlag is the repeatable --mount-options BACKEND=opt[,opt...].
type mountOptionsFlag map[string][]string

func (m *mountOptionsFlag) String() string {
	if m == nil || *m == nil {
		return ""
	}
	var out []string
	for _, b := range slices.Sorted(maps.Keys(*m)) {
		out = append(out, b+"="+strings.Join((*m)[b], ","))
	}
	return strings.Join(out, " ")
}

func (m *mountOptionsFlag) Set(v string) error {
	backend, opts, ok := strings.Cut(v, "=")
	if !ok || backend == "" || opts == "" {
		return fmt.Errorf("%q is not BACKEND=opt[,opt...], e.g. tmpfs=noexec,noatime", v)
	}
	if _, dup := (*m)[backend]; dup {
		return fmt.Errorf("%q: the mount options of backend %s are given twice; give them in one value", v, backend)
	}
	list := strings.Split(opts, ",")
	if err := mount.CheckOptions(list); err != nil {
		return fmt.Errorf("%q: %w", v, err)
	}
	if *m == nil {
		*m = map[string][]string{}
	}
	(*m)[backend] = list
	return nil
}
