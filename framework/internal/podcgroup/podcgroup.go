package podcgroup

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strings"
	"time"
)

// Version is the cgroup version of the hierarchy that holds the memory
// controller.
type Version int

const (
	// Detect asks Open to find the version from the mount (statfs).
	Detect Version = iota
	// V1 is the legacy hierarchy: one mount per controller, the memory
	// controller's at <mount>/memory (a hybrid node's unified mount holds no
	// memory controller and is not used).
	V1
	// V2 is the unified hierarchy: every controller under one mount.
	V2
)

func (v Version) String() string {
	switch v {
	case V1:
		return "v1"
	case V2:
		return "v2"
	}
	return "detect"
}

// Driver is the kubelet's cgroup driver (--cgroup-driver), which decides how
// its cgroups are named.
type Driver string

const (
	// Cgroupfs names a pod's cgroup <root>/kubepods/[burstable|besteffort/]pod<uid>.
	Cgroupfs Driver = "cgroupfs"
	// Systemd names it as nested slices, kubepods.slice/kubepods-burstable.slice/
	// kubepods-burstable-pod<uid with "_" for "-">.slice.
	Systemd Driver = "systemd"
)

// QoS is a pod's QoS class as the kubelet's cgroup tree shows it: a
// guaranteed pod's cgroup is directly in the node-allocatable cgroup
// (kubepods), the others in a cgroup of their class.
type QoS string

const (
	Guaranteed QoS = "guaranteed"
	Burstable  QoS = "burstable"
	BestEffort QoS = "besteffort"
)

// qosClasses is the order Find looks in.
var qosClasses = []QoS{Burstable, BestEffort, Guaranteed}

// Hierarchy says where a node's kubelet keeps its pods' cgroups, as this
// process sees them.
type Hierarchy struct {
	// Mount is where the host's cgroup tree is mounted in this process's
	// mount namespace: "/sys/fs/cgroup" on the host, "/host/sys/fs/cgroup"
	// in a container given the host's tree by a hostPath volume. Default
	// "/sys/fs/cgroup".
	Mount string
	// Root is the kubelet's --cgroup-root (cgroupRoot), in the cgroupfs form
	// the kubelet takes whatever its driver: "/" (the default) or
	// "/ephemera-node-a". Default "/".
	Root string
	// Driver is the kubelet's cgroup driver. Default Cgroupfs.
	Driver Driver
	// Version is the hierarchy's version; Detect (the zero value) asks
	// Open to read it from Mount.
	Version Version
}

// DefaultMount is Hierarchy.Mount's default.
const DefaultMount = "/sys/fs/cgroup"

func (h *Hierarchy) setDefaults() {
	if h.Mount == "" {
		h.Mount = DefaultMount
	}
	if h.Root == "" {
		h.Root = "/"
	}
	if path.IsAbs(h.Root) {
		h.Root = path.Clean(h.Root)
	}
	if h.Driver == "" {
		h.Driver = Cgroupfs
	}
}

// check refuses a hierarchy whose names could not be the kubelet's.
func (h Hierarchy) check() error {
	switch h.Driver {
	case Cgroupfs, Systemd:
	default:
		return fmt.Errorf("cgroup driver %q: want %q or %q", h.Driver, Cgroupfs, Systemd)
	}
	if !path.IsAbs(h.Mount) {
		return fmt.Errorf("cgroup mount %q is not an absolute path", h.Mount)
	}
	if !path.IsAbs(h.Root) {
		return fmt.Errorf("cgroup root %q: want an absolute path such as / or /node-a (the kubelet's --cgroup-root)", h.Root)
	}
	switch h.Version {
	case Detect, V1, V2:
	default:
		return fmt.Errorf("cgroup version %d: want v1, v2 or detect", h.Version)
	}
	return nil
}

// nodeAllocatable is the cgroup the kubelet puts below its cgroup root and
// every pod's cgroup below (its "defaultNodeAllocatableCgroupName").
const nodeAllocatable = "kubepods"

// rootComponents splits a cgroupfs-form cgroup root into its names: "/" has
// none.
func rootComponents(root string) []string {
	root = strings.Trim(root, "/")
	if root == "" {
		return nil
	}
	return strings.Split(root, "/")
}

// podNames returns the kubelet's abstract name of a pod's cgroup in a QoS
// class (a list of components, as the kubelet's CgroupName): the root's
// components, kubepods, the class unless guaranteed, pod<uid>.
func podNames(root string, qos QoS, uid string) []string {
	names := append(rootComponents(root), nodeAllocatable)
	if qos != Guaranteed {
		names = append(names, string(qos))
	}
	return append(names, "pod"+uid)
}

// relPath returns the path of the cgroup of abstract name names below the
// hierarchy's root, as the driver names it: cgroupfs joins the names;
// systemd makes each prefix a slice of its own, named by the prefix's names
// joined with "-" (each name's "-" escaped as "_", since systemd reads "-"
// as a step down), so {kubepods, burstable, pod1-2} becomes
// kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1_2.slice.
func relPath(d Driver, names []string) string {
	if d != Systemd {
		return path.Join(names...)
	}
	escaped := make([]string, len(names))
	for i, n := range names {
		escaped[i] = strings.ReplaceAll(n, "-", "_")
	}
	slices := make([]string, len(names))
	for i := range names {
		slices[i] = strings.Join(escaped[:i+1], "-") + ".slice"
	}
	return path.Join(slices...)
}

// PodPath returns the path, relative to the hierarchy's root (the memory
// controller's directory on v1), of the cgroup the kubelet of driver d and
// cgroup root root gives the pod of uid in class qos. It does no I/O.
func PodPath(d Driver, root string, qos QoS, uid string) string {
	return relPath(d, podNames(root, qos, uid))
}

// KubepodsPath is PodPath's parent of every pod, the node-allocatable
// cgroup (kubepods, or kubepods.slice with systemd).
func KubepodsPath(d Driver, root string) string {
	return relPath(d, append(rootComponents(root), nodeAllocatable))
}

// checkUID refuses what cannot be a pod UID the kubelet names a cgroup by
// (a UUID, or a static pod's hash): letters, digits and "-", at most 64, so
// that no request can name a path outside the pods' cgroups.
func checkUID(uid string) error {
	if uid == "" || len(uid) > 64 {
		return fmt.Errorf("%w: pod UID %q: want 1 to 64 characters", ErrBadUID, clip(uid))
	}
	for _, r := range uid {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-') {
			return fmt.Errorf("%w: pod UID %q: want letters, digits and -", ErrBadUID, clip(uid))
		}
	}
	return nil
}

func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

var (
	// ErrNotFound is what a NotFoundError is: the node has pod cgroups but
	// none for this pod (yet: the kubelet's volume manager may publish
	// before its pod worker creates the pod's cgroup, so waiting a bounded
	// time for it is right; see Tree.Wait).
	ErrNotFound = errors.New("the pod's cgroup does not exist")
	// ErrNoPodCgroups is what a NotFoundError is when the kubelet's
	// node-allocatable cgroup (kubepods) does not exist either: the
	// kubelet runs without pod cgroups (cgroupsPerQOS: false), or with
	// another cgroup root or driver than the Hierarchy says. Waiting does
	// not help: the caller falls back.
	ErrNoPodCgroups = errors.New("the node has no pod cgroups where the kubelet would make them")
	// ErrUnsupported: no memory cgroup here (not Linux, no memory
	// controller at the mount, a pod cgroup without the memory controller).
	// The caller falls back.
	ErrUnsupported = errors.New("charging writes to a pod's memory cgroup is not supported here")
	// ErrBadUID: a pod UID that cannot name a cgroup.
	ErrBadUID = errors.New("bad pod UID")
	// ErrNoSpace: the volume's filesystem is full (ENOSPC, EDQUOT).
	ErrNoSpace = errors.New("the files do not fit the volume")
	// ErrPodOutOfMemory: the pod's memory cgroup is at its limit: the
	// writer was refused memory (ENOMEM) or killed by the pod cgroup's OOM
	// killer (the kernel's oom_kill count of the pod's cgroup went up).
	ErrPodOutOfMemory = errors.New("the pod's memory cgroup is at its limit")
	// ErrBadFiles: a file set the writer refuses before starting (a bad
	// name, too many files or bytes).
	ErrBadFiles = errors.New("bad file set")
)

// NotFoundError says where Find looked for a pod's cgroup.
type NotFoundError struct {
	UID string
	// Kubepods is the node-allocatable cgroup's directory, and whether it
	// exists (when not, Is(ErrNoPodCgroups) is true).
	Kubepods       string
	KubepodsExists bool
	// Tried are the directories of the pod's cgroup Find looked for, one
	// per QoS class.
	Tried []string
}

func (e *NotFoundError) Error() string {
	if !e.KubepodsExists {
		return fmt.Sprintf("pod %s: %v: no %s (a kubelet without pod cgroups, or another --cgroup-root or --cgroup-driver)", e.UID, ErrNoPodCgroups, e.Kubepods)
	}
	return fmt.Sprintf("pod %s: %v: none of %s", e.UID, ErrNotFound, strings.Join(e.Tried, ", "))
}

// Is makes errors.Is(err, ErrNotFound) true of every NotFoundError and
// errors.Is(err, ErrNoPodCgroups) of one whose kubepods cgroup is missing.
func (e *NotFoundError) Is(target error) bool {
	return target == ErrNotFound || target == ErrNoPodCgroups && !e.KubepodsExists
}

// Cgroup is a pod's cgroup found in a Tree: the directory of its memory
// cgroup.
type Cgroup struct {
	// UID is the pod's UID.
	UID string
	// QoS is the class whose place it was found in.
	QoS QoS
	// Dir is its directory, in the memory controller's hierarchy (v1) or
	// the unified one (v2), as this process sees it.
	Dir string
	// Version is the hierarchy's version: a v1 writer joins Dir, a v2
	// writer a leaf of its own below Dir.
	Version Version
	// Driver is the kubelet's cgroup driver.
	Driver Driver
}

// File is one file a Writer writes: the same fields as api.File (convert
// with podcgroup.File(f)), in a package that imports nothing of the module.
type File struct {
	Data []byte
	// Mode is the file's permission bits; 0 means 0644.
	Mode fs.FileMode
}

// Limits bound a write's file set: a set beyond them is refused
// (ErrBadFiles) before a writer starts.
type Limits struct {
	// MaxFiles is the most files of one write. Default 4096.
	MaxFiles int
	// MaxBytes is the most bytes of data of one write. Default 64 MiB.
	MaxBytes int64
}

const (
	defaultMaxFiles = 4096
	defaultMaxBytes = 64 << 20
	// maxName bounds a file's relative name.
	maxName = 4096
)

func (l Limits) withDefaults() Limits {
	if l.MaxFiles <= 0 {
		l.MaxFiles = defaultMaxFiles
	}
	if l.MaxBytes <= 0 {
		l.MaxBytes = defaultMaxBytes
	}
	return l
}

// checkName refuses a name the writer would not create beneath its
// directory: empty, absolute, with an empty, "." or ".." component, a NUL
// or a backslash, or longer than maxName.
func checkName(name string) error {
	if name == "" || len(name) > maxName || strings.ContainsAny(name, "\x00\\") || strings.HasPrefix(name, "/") {
		return fmt.Errorf("%w: file name %q", ErrBadFiles, clip(name))
	}
	for _, c := range strings.Split(name, "/") {
		if c == "" || c == "." || c == ".." {
			return fmt.Errorf("%w: file name %q has a %q component", ErrBadFiles, clip(name), c)
		}
	}
	return nil
}

// WriteOptions tune Cgroup.Write.
type WriteOptions struct {
	// GID, when set, is the group of every file and directory the writer
	// makes (the pod's fsGroup); nil leaves the group alone.
	GID *int64
	// DirMode is the mode of the directories the writer makes for names
	// with a "/" (parents that do not exist yet). 0 means 0755.
	DirMode fs.FileMode
	// Limits bound the file set.
	Limits Limits
}

// Result says how a write went besides its error.
type Result struct {
	// Pid is the writer's process ID (0 when none started).
	Pid int
	// Leaf is the v2 writer's leaf cgroup ("" on v1).
	Leaf string
	// LeafLeft is why Leaf could not be removed after the writer ended,
	// nil when it was (or there was none). An empty leaf left behind
	// costs nothing and goes with the pod's cgroup (the kubelet removes
	// a pod's cgroup with everything below it); it is no reason to fail
	// the write.
	LeafLeft error
	// Elapsed is the time from the writer's start to its reaping.
	Elapsed time.Duration
}
