//go:build linux

package podcgrouptest

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ephemera-csi/ephemera/framework/internal/podcgroup"
)

// Mount is where the tests find the host's cgroup tree.
const Mount = "/sys/fs/cgroup"

// Root is a kubelet cgroup root of a test's own,
// /sys/fs/cgroup/memory/ephemera-test-<random>, with the kubelet's kubepods
// cgroups (cgroupfs driver) below it.
type Root struct {
	// Root is the kubelet's cgroupRoot, "/ephemera-test-<random>".
	Root string
	base string
}

// New makes a Root, removed with everything below it when the test ends
// (a process left in it fails the test). It skips the test without root or
// without a cgroup v1 memory controller.
func New(t testing.TB) *Root {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (cgroups)")
	}
	var st unix.Statfs_t
	if err := unix.Statfs(filepath.Join(Mount, "memory"), &st); err != nil || st.Type != unix.CGROUP_SUPER_MAGIC {
		t.Skip("no cgroup v1 memory controller at /sys/fs/cgroup/memory")
	}
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	r := &Root{Root: "/ephemera-test-" + hex.EncodeToString(b[:])}
	r.base = filepath.Join(Mount, "memory", r.Root)
	if err := os.MkdirAll(filepath.Join(r.base, "kubepods", "burstable"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { remove(t, r.base) })
	return r
}

// Pod makes the memory cgroup of a burstable pod of uid, with a memory
// limit when limit > 0, and returns its directory.
func (r *Root) Pod(t testing.TB, uid string, limit int64) string {
	t.Helper()
	dir := filepath.Join(Mount, "memory", filepath.FromSlash(podcgroup.PodPath(podcgroup.Cgroupfs, r.Root, podcgroup.Burstable, uid)))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if limit > 0 {
		if err := os.WriteFile(filepath.Join(dir, "memory.limit_in_bytes"), []byte(strconv.FormatInt(limit, 10)), 0); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// Stat reads key of the memory.stat of the v1 memory cgroup dir.
func Stat(t testing.TB, dir, key string) int64 {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "memory.stat"))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(data)) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), " ")
		if ok && k == key {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no %s in %s/memory.stat", key, dir)
	return 0
}

// remove removes the cgroup tree at base, deepest first, failing the test
// for any process still in it (a writer must never outlive its write),
// which it kills first. The pages still charged to a cgroup (a tmpfs the
// test has not unmounted yet) do not keep it: v1 moves them to the parent.
func remove(t testing.TB, base string) {
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
		data, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		for _, f := range strings.Fields(string(data)) {
			t.Errorf("process %s left in %s", f, dir)
			if pid, err := strconv.Atoi(f); err == nil {
				_ = unix.Kill(pid, unix.SIGKILL)
			}
		}
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
