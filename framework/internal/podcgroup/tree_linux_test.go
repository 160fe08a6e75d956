package podcgroup

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// fakeTree makes, in a temporary directory laid out as a v1 (memory
// controller in memory/) or v2 hierarchy, the kubepods cgroup of h and,
// when qos is set, the pod's cgroup in that class; on v2 every cgroup
// made lists controllers in its cgroup.controllers.
func fakeTree(t *testing.T, h Hierarchy, qos QoS, controllers string) (*Tree, string) {
	t.Helper()
	h.Mount = t.TempDir()
	mem := h.Mount
	if h.Version == V1 {
		mem = filepath.Join(h.Mount, "memory")
	}
	h.setDefaults()
	mk := func(rel string) string {
		dir := filepath.Join(mem, filepath.FromSlash(rel))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if h.Version == V2 {
			if err := os.WriteFile(filepath.Join(dir, "cgroup.controllers"), []byte(controllers+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	mk(KubepodsPath(h.Driver, h.Root))
	pod := ""
	if qos != "" {
		pod = mk(PodPath(h.Driver, h.Root, qos, testUID))
	}
	tree, err := Open(h)
	if err != nil {
		t.Fatal(err)
	}
	return tree, pod
}

// TestFind: Find locates the pod's cgroup in every layout (v1 and v2, both
// drivers, every QoS class, roots with and without components) and says
// which class it found it in; the other pods' cgroups are not it.
func TestFind(t *testing.T) {
	for _, v := range []Version{V1, V2} {
		for _, d := range []Driver{Cgroupfs, Systemd} {
			for _, root := range []string{"/", "/ephemera-node-a"} {
				for _, qos := range []QoS{Guaranteed, Burstable, BestEffort} {
					h := Hierarchy{Root: root, Driver: d, Version: v}
					tree, pod := fakeTree(t, h, qos, "cpu memory pids")
					c, err := tree.Find(testUID)
					if err != nil {
						t.Errorf("%v %s root %s %s: Find: %v", v, d, root, qos, err)
						continue
					}
					if c.Dir != pod || c.QoS != qos || c.Version != v || c.Driver != d || c.UID != testUID {
						t.Errorf("%v %s root %s %s: Find = %+v, want the cgroup at %s", v, d, root, qos, c, pod)
					}
					// Another pod of the node has no cgroup: not this one's.
					if _, err := tree.Find("11111111-2222-3333-4444-555555555555"); !errors.Is(err, ErrNotFound) || errors.Is(err, ErrNoPodCgroups) {
						t.Errorf("%v %s root %s %s: Find(other pod): %v, want ErrNotFound only", v, d, root, qos, err)
					}
				}
			}
		}
	}
}

// TestFindMissing: a pod without a cgroup is ErrNotFound, and also
// ErrNoPodCgroups when the kubelet's kubepods cgroup is not where the
// Hierarchy says (another driver, another root, no pod cgroups at all).
func TestFindMissing(t *testing.T) {
	tree, _ := fakeTree(t, Hierarchy{Version: V1}, "", "")
	_, err := tree.Find(testUID)
	var nf *NotFoundError
	if !errors.As(err, &nf) || !errors.Is(err, ErrNotFound) || errors.Is(err, ErrNoPodCgroups) || len(nf.Tried) != 3 {
		t.Errorf("Find without the pod's cgroup: %v, want a NotFoundError of 3 places, not ErrNoPodCgroups", err)
	}

	// A cgroupfs node read as systemd, and a root the kubelet does not use.
	for _, h := range []Hierarchy{{Version: V1, Driver: Systemd}, {Version: V1, Root: "/elsewhere"}} {
		tree, _ := fakeTree(t, Hierarchy{Version: V1}, Burstable, "")
		h.Mount = tree.h.Mount
		other, err := Open(h)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := other.Find(testUID); !errors.Is(err, ErrNoPodCgroups) {
			t.Errorf("%+v: Find: %v, want ErrNoPodCgroups", h, err)
		}
	}

	if _, err := tree.Find("../../x"); !errors.Is(err, ErrBadUID) {
		t.Errorf("Find(../../x): %v, want ErrBadUID", err)
	}
}

// TestFindRefuses: a v2 pod cgroup without the memory controller (a write
// there would be charged to an ancestor) and a pod in two classes.
func TestFindRefuses(t *testing.T) {
	tree, _ := fakeTree(t, Hierarchy{Version: V2}, Burstable, "cpu pids")
	if _, err := tree.Find(testUID); !errors.Is(err, ErrUnsupported) {
		t.Errorf("Find in a v2 pod cgroup without memory: %v, want ErrUnsupported", err)
	}

	tree, _ = fakeTree(t, Hierarchy{Version: V1}, Burstable, "")
	if err := os.MkdirAll(filepath.Join(tree.MemoryDir(), PodPath(Cgroupfs, "/", BestEffort, testUID)), 0o755); err != nil {
		t.Fatal(err)
	}
	if c, err := tree.Find(testUID); err == nil || errors.Is(err, ErrNotFound) {
		t.Errorf("Find of a pod in two classes: %+v, %v, want an error", c, err)
	}
}

// TestWait: Wait returns the pod's cgroup once the kubelet makes it,
// gives up at the context's end with both errors, and at once when the
// node has no pod cgroups.
func TestWait(t *testing.T) {
	h := Hierarchy{Version: V1, Driver: Systemd}
	tree, _ := fakeTree(t, h, "", "")
	pod := filepath.Join(tree.MemoryDir(), PodPath(Systemd, "/", BestEffort, testUID))
	misses := 0
	tree.afterMiss = func() {
		// The kubelet makes the pod's cgroup after Wait's second miss.
		if misses++; misses == 2 {
			if err := os.MkdirAll(pod, 0o755); err != nil {
				t.Error(err)
			}
		}
	}
	c, err := tree.Wait(context.Background(), testUID)
	if err != nil || c.Dir != pod || c.QoS != BestEffort {
		t.Errorf("Wait: %+v, %v, want the cgroup at %s", c, err, pod)
	}
	if misses != 2 {
		t.Errorf("Wait missed %d times, want 2", misses)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	tree.afterMiss = nil
	if _, err := tree.Wait(ctx, "11111111-2222-3333-4444-555555555555"); !errors.Is(err, ErrNotFound) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait for a cgroup that never comes: %v, want ErrNotFound and DeadlineExceeded", err)
	}

	bare := Hierarchy{Version: V2, Mount: t.TempDir()}
	none, err := Open(bare)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := none.Wait(context.Background(), testUID); !errors.Is(err, ErrNoPodCgroups) {
		t.Errorf("Wait on a node without pod cgroups: %v, want ErrNoPodCgroups", err)
	}
	t.Logf("Wait gave up on a node without pod cgroups in %v", time.Since(start))
}

// TestDetect reads the version of this machine's cgroup mounts from the
// kernel, and refuses a directory that is no cgroup mount.
func TestDetect(t *testing.T) {
	if _, err := Open(Hierarchy{Mount: t.TempDir()}); !errors.Is(err, ErrUnsupported) {
		t.Errorf("Open of a plain directory: %v, want ErrUnsupported", err)
	}
	for mount, want := range map[string]Version{
		"/sys/fs/cgroup":         0, // whatever this machine has
		"/sys/fs/cgroup/unified": V2,
		"/sys/fs/cgroup/memory":  0, // a v1 controller's mount: refused
	} {
		if _, err := os.Stat(mount); err != nil {
			continue
		}
		tree, err := Open(Hierarchy{Mount: mount})
		switch {
		case mount == "/sys/fs/cgroup/memory":
			if !errors.Is(err, ErrUnsupported) {
				t.Errorf("Open(%s), a v1 controller's own mount: %v, want ErrUnsupported", mount, err)
			}
		case err != nil:
			t.Errorf("Open(%s): %v", mount, err)
		case want != 0 && tree.Hierarchy().Version != want:
			t.Errorf("Open(%s): %v, want %v", mount, tree.Hierarchy().Version, want)
		default:
			t.Logf("%s: cgroup %v, memory controller at %s", mount, tree.Hierarchy().Version, tree.MemoryDir())
		}
	}
}
