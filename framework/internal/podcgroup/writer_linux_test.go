package podcgroup

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The tests below run the writer for real: this test binary is the
// writer (the package's init), placed in a memory cgroup made for the
// test, writing into a tmpfs mounted for it; they read what was charged
// where from the kernel. They need root and a cgroup v1 memory controller
// (the v2 test, a cgroup2 mount), and skip without.

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (cgroups, mounts)")
	}
}

func randomName(t *testing.T, prefix string) string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return prefix + hex.EncodeToString(b[:])
}

// removeCgroups removes the cgroup tree at base, deepest first, failing
// the test for any process still in it (a writer must never outlive its
// write), which it kills first.
func removeCgroups(t *testing.T, base string) {
	t.Helper()
	var dirs []string
	_ = filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	slices.Reverse(dirs)
	for _, dir := range dirs {
		if pids := procs(t, dir); len(pids) > 0 {
			t.Errorf("processes left in %s: %v", dir, pids)
			for _, pid := range pids {
				_ = unix.Kill(pid, unix.SIGKILL)
			}
		}
		// A killed process leaves its cgroup when it has exited: bounded
		// retries, only for the cleanup of a test that already failed.
		for i := 0; ; i++ {
			err := unix.Rmdir(dir)
			if err == nil || errors.Is(err, unix.ENOENT) {
				break
			}
			if !errors.Is(err, unix.EBUSY) || i == 100 {
				t.Errorf("removing the test cgroup %s: %v", dir, err)
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// procs lists the processes in the cgroup dir.
func procs(t *testing.T, dir string) []int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("reading %s/cgroup.procs: %v", dir, err)
		}
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("%s/cgroup.procs: %q", dir, data)
		}
		pids = append(pids, pid)
	}
	return pids
}

// v1Pod makes a burstable pod's memory cgroup under a kubelet cgroup root
// of its own in this machine's v1 memory hierarchy,
// /sys/fs/cgroup/memory/ephemera-test-<random>/kubepods/burstable/pod<uid>,
// removed when the test ends, and returns the tree and the pod's cgroup
// as Find sees them.
func v1Pod(t *testing.T) (*Tree, *Cgroup) {
	t.Helper()
	needRoot(t)
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup/memory", &st); err != nil || st.Type != unix.CGROUP_SUPER_MAGIC {
		t.Skip("no cgroup v1 memory controller at /sys/fs/cgroup/memory")
	}
	root := "/" + randomName(t, "ephemera-test-")
	base := filepath.Join("/sys/fs/cgroup/memory", root)
	dir := filepath.Join("/sys/fs/cgroup/memory", PodPath(Cgroupfs, root, Burstable, testUID))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeCgroups(t, base) })
	tree, err := Open(Hierarchy{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	if v := tree.Hierarchy().Version; v != V1 {
		t.Fatalf("Open detected %v, want v1", v)
	}
	c, err := tree.Find(testUID)
	if err != nil {
		t.Fatal(err)
	}
	if c.Dir != dir || c.QoS != Burstable {
		t.Fatalf("Find = %+v, want the burstable cgroup at %s", c, dir)
	}
	return tree, c
}

// tmpfs mounts a tmpfs of the given size in a temporary directory,
// unmounted when the test ends, and returns the directory open.
func tmpfs(t *testing.T, size string) *os.File {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+size+",mode=0755"); err != nil {
		t.Fatalf("mounting a tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmounting %s: %v", dir, err)
		}
	})
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// ownMemoryCgroup is the directory of this process's v1 memory cgroup.
func ownMemoryCgroup(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(data)) {
		parts := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(parts) == 3 && slices.Contains(strings.Split(parts[1], ","), "memory") {
			return filepath.Join("/sys/fs/cgroup/memory", parts[2])
		}
	}
	t.Fatalf("no memory cgroup in /proc/self/cgroup:\n%s", data)
	return ""
}

// stat reads key of a cgroup's memory.stat (or another "key value" file).
func stat(t *testing.T, dir, file, key string) int64 {
	t.Helper()
	n, err := readKey(filepath.Join(dir, file), key)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// usage reads a v1 memory cgroup's memory.usage_in_bytes.
func usage(t *testing.T, dir string) int64 {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "memory.usage_in_bytes"))
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// memoryCgroupOf is the memory cgroup of pid, relative to the hierarchy's
// root, from /proc/<pid>/cgroup (v1: the memory line; v2: the 0:: line).
func memoryCgroupOf(pid int, v Version) (string, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return "", err
	}
	for line := range strings.Lines(string(data)) {
		parts := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if v == V2 && parts[0] == "0" || v == V1 && slices.Contains(strings.Split(parts[1], ","), "memory") {
			return parts[2], nil
		}
	}
	return "", errors.New("no memory cgroup in /proc/pid/cgroup")
}

// gone says whether pid no longer exists (reaped).
func gone(pid int) bool {
	return errors.Is(unix.Kill(pid, 0), unix.ESRCH)
}

// hook sets afterStart for the test.
func hook(t *testing.T, f func(pid int)) {
	afterStart = f
	t.Cleanup(func() { afterStart = nil })
}

const MiB = 1 << 20

// TestWriteChargesThePod: files written by the writer are all there, with
// their modes, group and directories, and their pages are charged to the
// pod's memory cgroup (its shmem, from the kernel), not to this process's;
// the writer was in the pod's cgroup before it was sent anything, and is
// gone afterwards.
func TestWriteChargesThePod(t *testing.T) {
	tree, c := v1Pod(t)
	dir := tmpfs(t, "64m")
	own := ownMemoryCgroup(t)
	token := bytes.Repeat([]byte("secret-token "), 16*MiB/13+1)[:16*MiB]
	files := map[string]File{
		"token":          {Data: token, Mode: 0o440},
		"sub/dir/ca.crt": {Data: []byte("-----BEGIN CERTIFICATE-----"), Mode: 0o444},
		"empty":          {},
	}
	gid := int64(4321)

	var during string
	hook(t, func(pid int) {
		cg, err := memoryCgroupOf(pid, V1)
		if err != nil {
			t.Error(err)
		}
		during = cg
	})
	podShmem, ownShmem := stat(t, c.Dir, "memory.stat", "shmem"), stat(t, own, "memory.stat", "shmem")
	res, err := c.Write(context.Background(), dir, files, WriteOptions{GID: &gid, DirMode: 0o750})
	if err != nil {
		t.Fatalf("Write: %v", err)
	}
	podAfter, ownAfter := stat(t, c.Dir, "memory.stat", "shmem"), stat(t, own, "memory.stat", "shmem")
	t.Logf("Write of %d MiB: %v; pod cgroup shmem %d → %d KiB, usage %d KiB; this process's cgroup shmem %d → %d KiB",
		len(token)/MiB, res.Elapsed, podShmem>>10, podAfter>>10, usage(t, c.Dir)>>10, ownShmem>>10, ownAfter>>10)

	if want := c.Dir[len(tree.MemoryDir()):]; during != want {
		t.Errorf("the writer's memory cgroup before it was sent the files: %q, want the pod's %q", during, want)
	}
	if podAfter-podShmem < int64(len(token)) {
		t.Errorf("the pod's cgroup was charged %d bytes of shmem, want at least the %d written", podAfter-podShmem, len(token))
	}
	// A page is charged to one memory cgroup, so the pod's charge above is
	// not this process's as long as the pod's cgroup is not below ours. Our
	// own shmem is only logged: this process shares its cgroup with every
	// other process of the session (go test runs two packages at once, and
	// their tmpfs pages come and go in it), so it moves with theirs
	// (test-flakes saw +6 MiB of theirs here).
	if strings.HasPrefix(c.Dir+"/", own+"/") {
		t.Errorf("the pod's cgroup %s is below this process's %s: its charge would be ours too", c.Dir, own)
	}
	if pids := procs(t, c.Dir); len(pids) > 0 || !gone(res.Pid) {
		t.Errorf("the writer %d outlived Write: pod cgroup's processes %v", res.Pid, pids)
	}

	for name, f := range files {
		p := filepath.Join(dir.Name(), name)
		data, err := os.ReadFile(p)
		if err != nil || !bytes.Equal(data, f.Data) {
			t.Errorf("%s: %d bytes (%v), want the %d written", name, len(data), err, len(f.Data))
			continue
		}
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		want := f.Mode
		if want == 0 {
			want = 0o644
		}
		if fi.Mode() != want || fi.Sys().(*syscall.Stat_t).Gid != uint32(gid) {
			t.Errorf("%s: mode %v group %d, want %v and %d", name, fi.Mode(), fi.Sys().(*syscall.Stat_t).Gid, want, gid)
		}
	}
	for _, d := range []string{"sub", "sub/dir"} {
		fi, err := os.Lstat(filepath.Join(dir.Name(), d))
		if err != nil || fi.Mode() != fs.ModeDir|0o750 || fi.Sys().(*syscall.Stat_t).Gid != uint32(gid) {
			t.Errorf("directory %s: %v, want mode drwxr-x--- and group %d", d, fi.Mode(), gid)
		}
	}

	// The control: the same pages written by this process are not charged
	// to the pod's cgroup (only logged for this process's, shared with
	// others as above).
	podBefore, ownBefore := stat(t, c.Dir, "memory.stat", "shmem"), stat(t, own, "memory.stat", "shmem")
	if err := os.WriteFile(filepath.Join(dir.Name(), "control"), make([]byte, 4*MiB), 0o600); err != nil {
		t.Fatal(err)
	}
	podCtl, ownCtl := stat(t, c.Dir, "memory.stat", "shmem"), stat(t, own, "memory.stat", "shmem")
	t.Logf("control: 4 MiB written by this process: pod cgroup shmem %d → %d KiB, this process's %d → %d KiB", podBefore>>10, podCtl>>10, ownBefore>>10, ownCtl>>10)
	if podCtl-podBefore > MiB {
		t.Errorf("control: 4 MiB written by this process charged %d bytes to the pod's cgroup, want none", podCtl-podBefore)
	}
	if err := os.Remove(filepath.Join(dir.Name(), "control")); err != nil {
		t.Fatal(err)
	}

	// The pages are the files': removed, the pod's charge goes.
	if err := os.Remove(filepath.Join(dir.Name(), "token")); err != nil {
		t.Fatal(err)
	}
	if after := stat(t, c.Dir, "memory.stat", "shmem"); after > podAfter-int64(len(token))+MiB {
		t.Errorf("the pod's cgroup still holds %d KiB of shmem after the file was removed", after>>10)
	}
}

// TestWriteOverThePodsLimit: a pod whose memory cgroup cannot take the
// files gets its write refused (the writer, the pod cgroup's preferred
// OOM victim, is killed: ErrPodOutOfMemory, read from the kernel's
// oom_kill count); what was written stays within the pod's limit, in a
// cgroup that is not this process's.
func TestWriteOverThePodsLimit(t *testing.T) {
	_, c := v1Pod(t)
	dir := tmpfs(t, "64m")
	own := ownMemoryCgroup(t)
	const limit = 4 * MiB
	if err := os.WriteFile(filepath.Join(c.Dir, "memory.limit_in_bytes"), []byte(strconv.Itoa(limit)), 0); err != nil {
		t.Fatal(err)
	}
	kills, ownShmem := stat(t, c.Dir, "memory.oom_control", "oom_kill"), stat(t, own, "memory.stat", "shmem")
	res, err := c.Write(context.Background(), dir, map[string]File{"big": {Data: make([]byte, 8*MiB)}}, WriteOptions{})
	t.Logf("Write of 8 MiB into a pod limited to 4 MiB: %v (%v)", err, res.Elapsed)
	if !errors.Is(err, ErrPodOutOfMemory) {
		t.Errorf("Write: %v, want ErrPodOutOfMemory", err)
	}
	if after := stat(t, c.Dir, "memory.oom_control", "oom_kill"); after <= kills {
		t.Errorf("the pod cgroup's oom_kill count: %d → %d, want it up", kills, after)
	}
	if shmem := stat(t, c.Dir, "memory.stat", "shmem"); shmem > limit {
		t.Errorf("the pod's cgroup holds %d bytes of shmem, over its limit %d", shmem, limit)
	}
	// This process's cgroup is shared with the session's other processes
	// (TestWriteChargesThePod): its shmem is only logged; the pod's cgroup
	// not being below it is what keeps the pod's charge from being ours.
	t.Logf("this process's cgroup shmem moved by %d KiB (its other processes' too)", (stat(t, own, "memory.stat", "shmem")-ownShmem)>>10)
	if strings.HasPrefix(c.Dir+"/", own+"/") {
		t.Errorf("the pod's cgroup %s is below this process's %s", c.Dir, own)
	}
	if pids := procs(t, c.Dir); len(pids) > 0 || !gone(res.Pid) {
		t.Errorf("the writer %d outlived Write: pod cgroup's processes %v", res.Pid, pids)
	}
}

// TestWriteNoSpace: a volume too small for the files is ErrNoSpace.
func TestWriteNoSpace(t *testing.T) {
	_, c := v1Pod(t)
	dir := tmpfs(t, "1m")
	secret := bytes.Repeat([]byte("SECRET"), 2*MiB/6)
	_, err := c.Write(context.Background(), dir, map[string]File{"a": {Data: secret}}, WriteOptions{})
	if !errors.Is(err, ErrNoSpace) {
		t.Errorf("Write of 2 MiB into a 1 MiB tmpfs: %v, want ErrNoSpace", err)
	}
	if err != nil && strings.Contains(err.Error(), "SECRET") {
		t.Errorf("the error shows the file's data: %v", err)
	}
}

// TestWriteWithoutItsCgroup: a pod cgroup removed between Find and Write
// (the pod went away) fails the write, the writer not left anywhere.
func TestWriteWithoutItsCgroup(t *testing.T) {
	_, c := v1Pod(t)
	dir := tmpfs(t, "4m")
	if err := unix.Rmdir(c.Dir); err != nil {
		t.Fatal(err)
	}
	res, err := c.Write(context.Background(), dir, map[string]File{"a": {Data: []byte("a")}}, WriteOptions{})
	t.Logf("Write into a removed pod cgroup: %v", err)
	if !errors.Is(err, fs.ErrNotExist) || res.Pid == 0 || !gone(res.Pid) {
		t.Errorf("Write into a removed pod cgroup: %v (writer %d gone: %v), want fs.ErrNotExist and no writer", err, res.Pid, gone(res.Pid))
	}
	if entries, _ := os.ReadDir(dir.Name()); len(entries) > 0 {
		t.Errorf("the writer wrote outside the pod's cgroup: %v", entries)
	}
}

// TestWriteEndsWithItsContext: a write whose context ends while the writer
// runs returns the context's error, the writer killed and reaped.
func TestWriteEndsWithItsContext(t *testing.T) {
	_, c := v1Pod(t)
	dir := tmpfs(t, "64m")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hook(t, func(int) { cancel() })
	res, err := c.Write(ctx, dir, map[string]File{"a": {Data: make([]byte, 8*MiB)}}, WriteOptions{})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Write canceled while its writer runs: %v, want context.Canceled", err)
	}
	if pids := procs(t, c.Dir); len(pids) > 0 || res.Pid == 0 || !gone(res.Pid) {
		t.Errorf("the writer %d outlived Write: pod cgroup's processes %v", res.Pid, pids)
	}
	if _, err := c.Write(ctx, dir, map[string]File{"a": {}}, WriteOptions{}); !errors.Is(err, context.Canceled) {
		t.Errorf("Write with a done context: %v, want context.Canceled", err)
	}
}

// TestWriteStaysBeneath: the writer follows no link out of its directory
// and replaces nothing.
func TestWriteStaysBeneath(t *testing.T) {
	_, c := v1Pod(t)
	dir := tmpfs(t, "4m")
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(dir.Name(), "sub")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "f"), filepath.Join(dir.Name(), "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir.Name(), "old"), []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"sub/x", "link", "old"} {
		if _, err := c.Write(context.Background(), dir, map[string]File{name: {Data: []byte("new")}}, WriteOptions{}); err == nil {
			t.Errorf("Write of %s: no error", name)
		} else {
			t.Logf("Write of %s: %v", name, err)
		}
	}
	if entries, _ := os.ReadDir(outside); len(entries) > 0 {
		t.Errorf("the writer wrote outside its directory: %v", entries)
	}
	if data, _ := os.ReadFile(filepath.Join(dir.Name(), "old")); string(data) != "old" {
		t.Errorf("the writer replaced a file: %q", data)
	}
}

// TestWriteV2Leaf runs the writer on a cgroup2 mount made for the test:
// it is born in a leaf cgroup of its own below the pod's (which, with a
// controller enabled for its children as the kubelet's have, refuses a
// process: EBUSY), and the leaf is gone after the write. This kernel's
// memory controller may be bound to v1, so the charge itself is the v1
// tests'.
func TestWriteV2Leaf(t *testing.T) {
	t.Run("clone3", func(t *testing.T) { testWriteV2Leaf(t) })
	// A kernel without clone3: started here, moved into the leaf before
	// it is sent anything.
	t.Run("moved", func(t *testing.T) {
		noCloneIntoCgroup = true
		defer func() { noCloneIntoCgroup = false }()
		testWriteV2Leaf(t)
	})
}

func testWriteV2Leaf(t *testing.T) {
	needRoot(t)
	mount := t.TempDir()
	if err := unix.Mount("ephemera-test", mount, "cgroup2", 0, ""); err != nil {
		t.Skipf("cannot mount cgroup2: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mount, unix.MNT_DETACH); err != nil {
			t.Errorf("unmounting %s: %v", mount, err)
		}
	})
	root := "/" + randomName(t, "ephemera-test-")
	rel := PodPath(Systemd, root, Burstable, testUID)
	base := filepath.Join(mount, strings.SplitN(rel, "/", 2)[0]) // the root's slice
	pod := filepath.Join(mount, rel)
	if err := os.MkdirAll(pod, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeCgroups(t, base) })

	// A controller enabled down to the pod's children, as the kubelet's
	// are: then the pod's cgroup takes no process of its own.
	refuses := enableDown(t, mount, pod)

	tree, err := Open(Hierarchy{Mount: mount, Root: root, Driver: Systemd})
	if err != nil {
		t.Fatal(err)
	}
	if v := tree.Hierarchy().Version; v != V2 {
		t.Fatalf("Open detected %v, want v2", v)
	}
	tree.checkMemory = false // no memory controller on this v2 mount
	c, err := tree.Find(testUID)
	if err != nil {
		t.Fatal(err)
	}
	dir := tmpfs(t, "4m")
	var during string
	hook(t, func(pid int) {
		cg, err := memoryCgroupOf(pid, V2)
		if err != nil {
			t.Error(err)
		}
		during = cg
		if refuses {
			if err := join(filepath.Join(pod, "cgroup.procs"), pid); !errors.Is(err, unix.EBUSY) {
				t.Errorf("moving a process into the pod's cgroup itself: %v, want EBUSY", err)
			}
		}
	})
	res, err := c.Write(context.Background(), dir, map[string]File{"token": {Data: []byte("t0k3n")}}, WriteOptions{})
	if err != nil {
		t.Fatalf("Write: %v", err)
	}
	t.Logf("v2 Write: leaf %s, %v", res.Leaf, res.Elapsed)
	if filepath.Dir(res.Leaf) != pod || !strings.HasPrefix(filepath.Base(res.Leaf), leafPrefix) {
		t.Errorf("the writer's leaf %s, want one below %s", res.Leaf, pod)
	}
	// This process's cgroup namespace is the hierarchy's root (the test
	// would not run otherwise): /proc shows the path below the mount.
	if want := res.Leaf[len(mount):]; during != want {
		t.Errorf("the writer's cgroup before it was sent the files: %q, want its leaf %q", during, want)
	}
	if res.LeafLeft != nil {
		t.Errorf("LeafLeft: %v", res.LeafLeft)
	}
	if _, err := os.Stat(res.Leaf); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the writer's leaf is still there: %v", err)
	}
	if data, err := os.ReadFile(filepath.Join(dir.Name(), "token")); err != nil || string(data) != "t0k3n" {
		t.Errorf("token: %q, %v", data, err)
	}
	if !gone(res.Pid) {
		t.Errorf("the writer %d outlived Write", res.Pid)
	}
}

// enableDown enables a controller in the subtree_control of every cgroup
// from the mount's root down to pod, so that pod, like a kubelet's pod
// cgroup, has one enabled for its children; undone when the test ends. It
// says whether it could (no controller is free for v2 on a kernel that
// binds them all to v1).
func enableDown(t *testing.T, mount, pod string) bool {
	t.Helper()
	avail, err := os.ReadFile(filepath.Join(mount, "cgroup.controllers"))
	if err != nil {
		t.Fatal(err)
	}
	ctrls := strings.Fields(string(avail))
	if len(ctrls) == 0 {
		t.Logf("no controller available to cgroup2: the pod's cgroup refusing a process (EBUSY) is not shown")
		return false
	}
	ctrl := ctrls[0]
	rel, err := filepath.Rel(mount, pod)
	if err != nil {
		t.Fatal(err)
	}
	dirs := []string{mount}
	p := mount
	for _, c := range strings.Split(rel, "/") {
		p = filepath.Join(p, c)
		dirs = append(dirs, p)
	}
	var enabled []string
	t.Cleanup(func() {
		for i := len(enabled) - 1; i >= 0; i-- {
			if err := os.WriteFile(filepath.Join(enabled[i], "cgroup.subtree_control"), []byte("-"+ctrl), 0); err != nil {
				t.Errorf("disabling %s in %s: %v", ctrl, enabled[i], err)
			}
		}
	})
	for _, d := range dirs {
		sc, err := os.ReadFile(filepath.Join(d, "cgroup.subtree_control"))
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(strings.Fields(string(sc)), ctrl) {
			continue
		}
		if err := os.WriteFile(filepath.Join(d, "cgroup.subtree_control"), []byte("+"+ctrl), 0); err != nil {
			t.Logf("enabling %s in %s: %v: the pod's cgroup refusing a process (EBUSY) is not shown", ctrl, d, err)
			return false
		}
		enabled = append(enabled, d)
	}
	t.Logf("%s enabled for the children of every cgroup from the root to the pod's", ctrl)
	return true
}

// TestWriterCost measures one write of a 4 KiB file: the writer's start,
// its placement, the write and its reaping.
func TestWriterCost(t *testing.T) {
	_, c := v1Pod(t)
	dir := tmpfs(t, "4m")
	const n = 20
	var times, placed []time.Duration
	var start time.Time
	hook(t, func(int) { placed = append(placed, time.Since(start)) })
	for i := range n {
		name := "f" + strconv.Itoa(i)
		start = time.Now()
		if _, err := c.Write(context.Background(), dir, map[string]File{name: {Data: make([]byte, 4096)}}, WriteOptions{}); err != nil {
			t.Fatal(err)
		}
		times = append(times, time.Since(start))
	}
	slices.Sort(times)
	slices.Sort(placed)
	t.Logf("one write of 4 KiB through a writer, %d runs: min %v, median %v, max %v; of which started and in the pod's cgroup: min %v, median %v, max %v",
		n, times[0], times[n/2], times[n-1], placed[0], placed[n/2], placed[n-1])
}

// TestDispatch: this binary runs as a writer only with both marks, argv[0]
// and the environment; with one of them it is itself (here, the tests).
func TestDispatch(t *testing.T) {
	run := func(arg0 string, env ...string) (string, int) {
		t.Helper()
		var out bytes.Buffer
		cmd := &exec.Cmd{Path: selfExe, Args: []string{arg0, "-test.run=^$"}, Env: env, Stdout: &out, Stderr: &out, Stdin: strings.NewReader("not a request")}
		err := cmd.Run()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		return out.String(), cmd.ProcessState.ExitCode()
	}
	marker := writerEnv + "=" + writerEnvValue
	if out, code := run(writerArg0, marker); code != exitRequest || !strings.HasPrefix(out, "error 0 bad request header") {
		t.Errorf("argv[0] %s and %s: exit %d, %q; want the writer refusing the request", writerArg0, marker, code, out)
	}
	for _, tc := range [][]string{{"podcgroup.test", marker}, {writerArg0, writerEnv + "=0"}, {writerArg0}} {
		if out, code := run(tc[0], tc[1:]...); code != 0 || !strings.Contains(out, "PASS") {
			t.Errorf("argv[0] %s, environment %q: exit %d, %q; want the test binary", tc[0], tc[1:], code, out)
		}
	}
}
