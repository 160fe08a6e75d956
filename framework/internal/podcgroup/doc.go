// Package podcgroup charges the pages the driver writes into a pod's
// memory-backed volume to the pod's own memory cgroup.
//
// The kernel charges a tmpfs page to the memory cgroup of the task that
// first allocates it, and the charge stays there as long as the page
// lives: whoever keeps it alive (a hard link, an open descriptor, a renamed
// file), it counts against the cgroup that wrote it. Content the driver
// writes itself is the driver's to pay for; content a process of the pod's
// memory cgroup writes is the pod's, against its limit, as a
// memory-backed emptyDir is (and the kubelet keeps a pod's cgroup until
// its memory-backed volumes are gone, so the charge does not move to the
// parent while the pages can still be reached).
//
// A [Tree] is the node's cgroup hierarchy as the kubelet lays its pods out
// in it ([Hierarchy]: where the host's tree is mounted, the kubelet's
// --cgroup-root and --cgroup-driver, v1 or v2 read from the mount).
// [Tree.Find] locates a pod's [Cgroup] by its UID, in each QoS class's
// place; [Tree.Wait] waits for it a bounded time, since the kubelet may
// publish a volume before it has made the pod's cgroup. A pod without a
// cgroup is a [NotFoundError]: [ErrNotFound] (not yet), or also
// [ErrNoPodCgroups] (the kubelet makes none where the Hierarchy says:
// fall back). Off Linux everything is [ErrUnsupported].
//
// [Cgroup.Write] writes a set of [File]s into a directory from a writer
// process in the pod's memory cgroup: the driver's own binary, run again
// (/proc/self/exe) with argv[0] "ephemera-pod-writer" and a marker in its
// environment, which this package's init recognises before main runs, so
// that any binary linking the package is its own writer. On cgroup v2 the
// writer is born (clone3 CLONE_INTO_CGROUP) in a leaf cgroup of its own
// made below the pod's, since the pod's cgroup, whose controllers are
// enabled for its children, takes no process itself (the leaf is a plain
// directory, "ephemera-writer-<random>", with either cgroup driver: no
// ".scope" suffix, so systemd counts the writer as the pod slice's, and no
// D-Bus call to PID 1 per write); on v1 it is moved
// into the pod's memory cgroup before it is sent the files. The files
// reach it on a pipe, the directory as a descriptor; it writes them
// beneath that descriptor without following links, exits with its
// status, and never outlives the Write that started it. Its [Result] and
// error say what happened ([ErrNoSpace], [ErrPodOutOfMemory], ...),
// never what the files hold.
//
// What the driver's container needs: on cgroup v2, a privileged container
// runs in the host's cgroup namespace with the host's cgroup2 mounted at
// /sys/fs/cgroup (containerd and CRI-O do so for privileged containers),
// which is Hierarchy's default; an unprivileged one cannot move a process
// out of its own cgroup namespace where cgroup2 is mounted with nsdelegate
// (systemd's default), so the writer's start fails. On v1 a container
// sees only its own subtree of each controller: mount the host's
// /sys/fs/cgroup (hostPath) and give its place as Hierarchy.Mount.
package podcgroup
