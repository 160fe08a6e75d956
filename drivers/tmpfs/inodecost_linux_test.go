//go:build linux

package tmpfs_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/drivers/tmpfs"
)

// inodeCostFiles is how many empty files TestInodeCost creates.
const inodeCostFiles = 100_000

// TestInodeCost measures the kernel memory that empty files cost in a tmpfs,
// which "size" does not limit. Opt-in (it drops the node's dentry and inode
// caches, and takes about 100MB for a few seconds), as root:
//
//	EPHEMERA_TMPFS_INODE_COST=1 go test -count=1 -v -run TestInodeCost ./drivers/tmpfs/
//
// It mounts a volume of size 4096 with nr_inodes for 100,000 files, creates them
// empty from a thread of its own in a fresh memory cgroup (cgroup v1: threads
// can be moved one at a time), and reports per file:
//
//   - the cgroup's kernel memory charge (memory.kmem.usage_in_bytes): what the
//     pod that creates the files is charged, free of other processes' noise;
//   - the node's shmem_inode_cache, dentry and maple_node slab objects
//     (/proc/slabinfo, active objects × object size; maple_node holds the
//     directory's offset map and is not charged to a cgroup), and
//     /proc/meminfo's Slab: node-wide, so other work on the node adds noise.
//
// It then drops caches (echo 2 > /proc/sys/vm/drop_caches) and checks that the
// charge stays (tmpfs dentries and inodes are pinned while the files exist),
// and unlinks the files and checks that it goes.
func TestInodeCost(t *testing.T) {
	if os.Getenv("EPHEMERA_TMPFS_INODE_COST") != "1" {
		t.Skip("set EPHEMERA_TMPFS_INODE_COST=1 to measure the kernel memory of tmpfs inodes (root; drops caches)")
	}
	requireRoot(t)
	const n = inodeCostFiles
	v := &api.Volume{ID: api.VolumeHandle("5d7c1e2a-33b1-4a8e-a0f4-6f1f2b9e4c11", "cost"), Name: "cost", Size: 4096,
		Params: api.Params{tmpfs.ParamNrInodes: strconv.Itoa(n + 1)}} // the root directory is one
	dir := mountVolume(t, newBackend(t, tmpfs.Options{MaxInodes: n + 1}), v)

	// Everything below runs on this goroutine's thread, which alone is moved
	// into the measuring cgroup.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cg := newKmemCgroup(t)
	if cg == nil {
		t.Log("no cgroup v1 memory controller: reporting node-wide slab counters only")
	} else {
		defer cg.leave(t)
	}
	names := make([]string, n)
	for i := range names {
		names[i] = filepath.Join(dir, "f"+strconv.Itoa(i))
	}
	runtime.GC()

	before := readCounters(t, cg)
	t0 := time.Now()
	for _, name := range names {
		if err := createFile(name); err != nil {
			t.Fatal(err)
		}
	}
	created := readCounters(t, cg)
	t.Logf("%d empty files created in %v in a tmpfs of size=4096", n, time.Since(t0).Round(time.Millisecond))
	perFile := created.sub(before).per(n)
	t.Logf("kernel memory per file: %s", perFile)

	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("2"), 0); err != nil {
		t.Fatalf("dropping caches: %v", err)
	}
	dropped := readCounters(t, cg)
	t.Logf("after drop_caches, per file: %s", dropped.sub(before).per(n))

	for _, name := range names {
		if err := unix.Unlink(name); err != nil {
			t.Fatal(err)
		}
	}
	// Inodes and dentries are freed after an RCU grace period.
	var removed counters
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		removed = readCounters(t, cg)
		if cg == nil || removed.kmem-before.kmem < (created.kmem-before.kmem)/10 || time.Now().After(deadline) {
			break
		}
	}
	t.Logf("after unlinking them, per file: %s", removed.sub(before).per(n))

	if cg == nil {
		return
	}
	charged, kept, left := created.kmem-before.kmem, dropped.kmem-before.kmem, removed.kmem-before.kmem
	if charged < 500*n {
		t.Errorf("%d files charged only %d bytes of kernel memory to the cgroup, want at least 500 per file", n, charged)
	}
	if kept < charged*9/10 {
		t.Errorf("drop_caches freed %d of the %d bytes charged, want them pinned while the files exist", charged-kept, charged)
	}
	if left > charged/10 {
		t.Errorf("%d of the %d bytes charged are still charged after the files were unlinked", left, charged)
	}
}

// counters are kernel memory counters in bytes.
type counters struct {
	kmem                          int64 // the cgroup's memory.kmem.usage_in_bytes; 0 without one
	shmemInode, dentry, mapleNode int64 // /proc/slabinfo: active objects × object size
	slab                          int64 // /proc/meminfo Slab
}

func (c counters) sub(o counters) counters {
	return counters{c.kmem - o.kmem, c.shmemInode - o.shmemInode, c.dentry - o.dentry, c.mapleNode - o.mapleNode, c.slab - o.slab}
}

// perFile is a counters delta divided by a number of files.
type perFile struct {
	c counters
	n int64
}

func (c counters) per(n int) perFile { return perFile{c, int64(n)} }

func (p perFile) String() string {
	d := func(v int64) string { return strconv.FormatInt(v/p.n, 10) }
	return fmt.Sprintf("cgroup kmem %s B; node-wide slab objects %s B (shmem_inode_cache %s + dentry %s + maple_node %s); meminfo Slab %s B",
		d(p.c.kmem), d(p.c.shmemInode+p.c.dentry+p.c.mapleNode), d(p.c.shmemInode), d(p.c.dentry), d(p.c.mapleNode), d(p.c.slab))
}

func readCounters(t *testing.T, cg *kmemCgroup) counters {
	t.Helper()
	var c counters
	if cg != nil {
		c.kmem = readInt(t, filepath.Join(cg.dir, "memory.kmem.usage_in_bytes"))
	}
	b, err := os.ReadFile("/proc/slabinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 4 {
			continue
		}
		var dst *int64
		switch f[0] {
		case "shmem_inode_cache":
			dst = &c.shmemInode
		case "dentry":
			dst = &c.dentry
		case "maple_node":
			dst = &c.mapleNode
		default:
			continue
		}
		active, err1 := strconv.ParseInt(f[1], 10, 64)
		size, err2 := strconv.ParseInt(f[3], 10, 64)
		if err := errors.Join(err1, err2); err != nil {
			t.Fatalf("/proc/slabinfo: %q: %v", line, err)
		}
		*dst = active * size
	}
	c.slab = meminfo(t, "Slab")
	return c
}

// meminfo returns a /proc/meminfo field in bytes.
func meminfo(t *testing.T, field string) int64 {
	t.Helper()
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		name, rest, ok := strings.Cut(s.Text(), ":")
		if !ok || name != field {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil {
			t.Fatalf("/proc/meminfo %s: %v", field, err)
		}
		return kb << 10
	}
	t.Fatalf("/proc/meminfo has no %s", field)
	return 0
}

func readInt(t *testing.T, path string) int64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return n
}

// kmemCgroup is a fresh cgroup v1 memory cgroup below the thread's own, which
// the calling (locked) thread has joined.
type kmemCgroup struct {
	dir, home string // the new cgroup and the thread's own
	tid       int
}

// cgroupV1Memory is where the cgroup v1 memory controller is usually mounted.
const cgroupV1Memory = "/sys/fs/cgroup/memory"

// newKmemCgroup creates a memory cgroup for this test below the thread's own and
// moves the calling thread into it; it returns nil when there is no cgroup v1
// memory controller. The cgroup is removed at cleanup.
func newKmemCgroup(t *testing.T) *kmemCgroup {
	t.Helper()
	if _, err := os.Stat(filepath.Join(cgroupV1Memory, "memory.kmem.usage_in_bytes")); err != nil {
		return nil
	}
	tid := unix.Gettid()
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/cgroup", tid))
	if err != nil {
		t.Fatal(err)
	}
	var own string
	for _, line := range strings.Split(string(b), "\n") {
		// hierarchy-ID:controllers:path
		if f := strings.SplitN(line, ":", 3); len(f) == 3 && strings.Contains(","+f[1]+",", ",memory,") {
			own = f[2]
		}
	}
	if own == "" {
		return nil
	}
	cg := &kmemCgroup{home: filepath.Join(cgroupV1Memory, own), tid: tid}
	cg.dir = filepath.Join(cg.home, fmt.Sprintf("ephemera-inode-cost-%d", os.Getpid()))
	if err := os.Mkdir(cg.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Cleanups run after the deferred leave; a thread that ended while still in
	// the cgroup (a failed test exits its locked goroutine) has left it too.
	t.Cleanup(func() {
		if err := os.Remove(cg.dir); err != nil {
			t.Errorf("cleanup: removing cgroup %s: %v", cg.dir, err)
		}
	})
	if err := os.WriteFile(filepath.Join(cg.dir, "tasks"), []byte(strconv.Itoa(tid)), 0); err != nil {
		t.Fatalf("moving thread %d into %s: %v", tid, cg.dir, err)
	}
	return cg
}

// leave moves the thread back to its own cgroup.
func (cg *kmemCgroup) leave(t *testing.T) {
	if err := os.WriteFile(filepath.Join(cg.home, "tasks"), []byte(strconv.Itoa(cg.tid)), 0); err != nil {
		t.Errorf("moving thread %d back to %s: %v", cg.tid, cg.home, err)
	}
}
