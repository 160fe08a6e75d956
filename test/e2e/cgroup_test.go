//go:build e2e && linux

package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cgroupBase is the cgroup (a cgroupfs path, the same in every hierarchy) below
// which every run's kubelets get a cgroupRoot of their own: cgroupRunDir(root)
// for the run, <that>/node<suffix> for each node with pod cgroups on.
//
// A kubelet with pod cgroups on (cgroupsPerQOS: true) creates
// <cgroupRoot>/kubepods/{,burstable/,besteffort/}pod<UID> for each pod and, in
// its housekeeping, destroys every pod cgroup below its kubepods whose pod it
// does not know, killing the processes in it first
// (pkg/kubelet/kubelet_pods.go cleanupOrphanedPodCgroups). Two kubelets on one
// cgroup root would kill each other's pods, so none of the harness's kubelets
// uses the node's "/" (another run on the machine may run its own kubelets).
const cgroupBase = "/ephemera-e2e"

// cgroupRunDir is the run root's cgroup below cgroupBase: the root's base name
// and 8 hex of its path (roots of different EPHEMERA_E2E_BASE dirs may share a
// base name).
func cgroupRunDir(root string) string {
	sum := sha256.Sum256([]byte(root))
	return cgroupBase + "/" + filepath.Base(root) + "-" + hex.EncodeToString(sum[:4])
}

// cgroupMounts returns the mount points of the cgroup hierarchies (v1, and the
// unified one where mounted) below /sys/fs/cgroup.
func cgroupMounts() ([]string, error) {
	ms, err := readMountInfo()
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []string
	for _, m := range ms {
		if (m.FSType == "cgroup" || m.FSType == "cgroup2") && strings.HasPrefix(m.MountPoint, "/sys/fs/cgroup") && !seen[m.MountPoint] {
			seen[m.MountPoint] = true
			out = append(out, m.MountPoint)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no cgroup hierarchy mounted below /sys/fs/cgroup")
	}
	return out, nil
}

// cgroupV1Mount returns the mount point of the cgroup v1 hierarchy with the
// controller (e.g. "memory"), or "" if there is none (a cgroup v2 node).
func cgroupV1Mount(controller string) string {
	ms, _ := readMountInfo()
	for _, m := range ms {
		if m.FSType != "cgroup" {
			continue
		}
		for _, o := range strings.Split(m.SuperOpts, ",") {
			if o == controller {
				return m.MountPoint
			}
		}
	}
	return ""
}

// makeCgroup creates the cgroup path (cgroupfs form, "/a/b") in every
// hierarchy, each level in turn. In the cpuset hierarchy a new level starts
// with empty cpuset.cpus and cpuset.mems, which refuse tasks: they get the
// parent's. The kubelet requires its cgroupRoot to exist in the cpu, cpuacct,
// cpuset, memory, pids and name=systemd hierarchies (cgroupV1impl.Validate);
// libcontainer creates the levels below it. Another run may remove an empty
// cgroupBase between two of our mkdirs (removeCgroupTree): retried.
func makeCgroup(path string) error {
	mounts, err := cgroupMounts()
	if err != nil {
		return err
	}
	var last error
	for attempt := 0; attempt < 5; attempt++ {
		if last = makeCgroupOnce(mounts, path); last == nil || !errors.Is(last, fs.ErrNotExist) {
			return last
		}
		time.Sleep(50 * time.Millisecond)
	}
	return last
}

func makeCgroupOnce(mounts []string, path string) error {
	for _, mnt := range mounts {
		dir := mnt
		for _, comp := range strings.Split(strings.Trim(path, "/"), "/") {
			parent := dir
			dir = filepath.Join(dir, comp)
			if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("create cgroup %s: %w", dir, err)
			}
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				cur, err := os.ReadFile(filepath.Join(dir, f))
				if err != nil || strings.TrimSpace(string(cur)) != "" {
					continue // not the cpuset hierarchy, or already set
				}
				v, err := os.ReadFile(filepath.Join(parent, f))
				if err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(dir, f), v, 0o644); err != nil {
					return fmt.Errorf("cgroup %s: write %s: %w", dir, f, err)
				}
			}
		}
	}
	return nil
}

// removeCgroupTree removes the cgroup path and every cgroup below it in every
// hierarchy, deepest first (a cgroup with children cannot be removed), as
// unmountAllUnder does for mounts; with keepTop the path itself stays. Call it
// once the pods are gone: a cgroup that still has processes (of a crashed run:
// everything in it is the run's) gets them SIGKILLed before it is removed. Then
// the run's cgroup and cgroupBase go too if nothing else is left in them.
// Returns what could not be removed.
func removeCgroupTree(path string, keepTop bool) []string {
	mounts, err := cgroupMounts()
	if err != nil {
		return []string{err.Error()}
	}
	var failed []string
	for _, mnt := range mounts {
		top := filepath.Join(mnt, path)
		if _, err := os.Stat(top); err != nil {
			continue
		}
		var dirs []string
		_ = filepath.WalkDir(top, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() && (p != top || !keepTop) {
				dirs = append(dirs, p)
			}
			return nil
		})
		sort.SliceStable(dirs, func(i, j int) bool {
			return strings.Count(dirs[i], "/") > strings.Count(dirs[j], "/")
		})
		for _, d := range dirs {
			if err := rmdirCgroup(d); err != nil {
				failed = append(failed, err.Error())
			}
		}
	}
	if !keepTop {
		// The parents up to cgroupBase, when empty (EBUSY otherwise: another
		// node's or run's cgroups).
		for p := filepath.Dir(path); p == cgroupBase || strings.HasPrefix(p, cgroupBase+"/"); p = filepath.Dir(p) {
			for _, mnt := range mounts {
				_ = syscall.Rmdir(filepath.Join(mnt, p))
			}
		}
	}
	return failed
}

// rmdirCgroup removes one cgroup directory without children, killing its
// processes first if it still has any; it retries for up to 5 s (a killed
// process leaves its cgroup when it has exited).
func rmdirCgroup(dir string) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := syscall.Rmdir(dir)
		if err == nil || err == syscall.ENOENT {
			return nil
		}
		if err != syscall.EBUSY || time.Now().After(deadline) {
			procs, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
			return fmt.Errorf("rmdir %s: %v (processes: %q)", dir, err, strings.Fields(string(procs)))
		}
		procs, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		for _, f := range strings.Fields(string(procs)) {
			if pid, err := strconv.Atoi(f); err == nil && pid > 1 && pid != os.Getpid() {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// procCgroup returns the cgroup path of the process in the cgroup v1
// hierarchy with the controller (e.g. "memory"), from /proc/<pid>/cgroup.
func procCgroup(pid int, controller string) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		// hierarchy-ID:controller-list:cgroup-path
		f := strings.SplitN(l, ":", 3)
		if len(f) != 3 {
			continue
		}
		for _, ctl := range strings.Split(f[1], ",") {
			if ctl == controller {
				return f[2], nil
			}
		}
	}
	return "", fmt.Errorf("/proc/%d/cgroup has no %s hierarchy:\n%s", pid, controller, b)
}

// moveToMemoryCgroup moves the process pid (all its threads) into the
// memory cgroup (cgroupfs path) of the cgroup v1 memory hierarchy.
func moveToMemoryCgroup(pid int, cgroup string) error {
	mnt := cgroupV1Mount("memory")
	if mnt == "" {
		return errors.New("no cgroup v1 memory hierarchy mounted")
	}
	f := filepath.Join(mnt, cgroup, "cgroup.procs")
	if err := os.WriteFile(f, []byte(strconv.Itoa(pid)), 0o644); err != nil {
		return fmt.Errorf("move process %d into memory cgroup %s: %w", pid, cgroup, err)
	}
	return nil
}
