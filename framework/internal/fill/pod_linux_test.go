//go:build linux

package fill

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/content"
	"github.com/ephemera-csi/ephemera/framework/internal/errkind"
	"github.com/ephemera-csi/ephemera/framework/internal/podcgroup"
	"github.com/ephemera-csi/ephemera/framework/internal/podcgroup/podcgrouptest"
)

const testUID = "0b5e1f3c-8a3d-4c1e-9f00-5e6d7c8b9a01"

// big is a content answer of one file of n bytes of b.
func big(n int, b byte) map[string]api.File {
	return map[string]api.File{"token": {Data: []byte(strings.Repeat(string(b), n))}}
}

// podFiller is a Filler that charges the pods of a fake kubelet's cgroup
// root (ChargePod), as OpenCharging finds it.
func podFiller(t *testing.T, cp *provider, root *podcgrouptest.Root) (*Filler, *refreshes, func() int64) {
	t.Helper()
	pods, mode, why, err := OpenCharging(PodCgroupConfig{Mode: PodCgroupsRequired, Mount: podcgrouptest.Mount, Root: root.Root})
	if err != nil || mode != ChargePod {
		t.Fatalf("OpenCharging = %v, %q (%s), want %s", err, mode, why, ChargePod)
	}
	p := Providers{Content: cp, Backends: map[string]Backend{"b": backend{x: struct{}{}}}}
	var r refreshes
	f, l := newFiller(t, p, &mounter{}, 1<<20, &r)
	f.cfg.PodCgroups, f.cfg.PodCgroupWait = pods, 200*time.Millisecond
	f.cfg.SaveHeld = func(context.Context, *api.Volume, int64) error { return nil }
	return f, &r, l.Held.InUse
}

// With pod cgroups (ChargePod) the pages of the content are charged to the
// pod's memory cgroup, by a writer that runs there and is gone after each
// write; what the pod keeps open of every generation stays the pod's, and
// none of it counts against the driver's content capacity (1 MiB here,
// less than one generation).
func TestContentChargedToThePod(t *testing.T) {
	root := podcgrouptest.New(t)
	pod := root.Pod(t, testUID, 64<<20)
	mem, _ := tmpfs(t, "size=32m")
	cp := &provider{files: big(2<<20, 'a')}
	f, _, held := podFiller(t, cp, root)
	v := &api.Volume{ID: "v1", Backend: "b", TargetPath: mem, Pod: api.Pod{UID: testUID}}
	before := podcgrouptest.Stat(t, pod, "total_shmem")
	if err := f.Fill(t.Context(), v); err != nil {
		t.Fatal(err)
	}
	var open []*os.File
	defer func() {
		for _, o := range open {
			o.Close()
		}
	}()
	for i, b := range []byte("bcd") {
		// The pod keeps the current generation open, then it is replaced.
		o, err := os.Open(filepath.Join(mem, "token"))
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, o)
		cp.files = big(2<<20, b)
		if err := f.Refresh(t.Context(), v); err != nil {
			t.Fatalf("refresh %d: %v", i, err)
		}
	}
	if s := readFile(t, mem, "token"); s[0] != 'd' {
		t.Errorf("the volume holds %q…, want the last generation", s[:1])
	}
	// Four generations of 2 MiB, three kept open by the pod: at least 8 MiB
	// of shmem charged to the pod's cgroup.
	if got := podcgrouptest.Stat(t, pod, "total_shmem") - before; got < 8<<20 {
		t.Errorf("the pod's cgroup gained %d bytes of shmem, want at least %d (four generations)", got, 8<<20)
	}
	if n := held(); n != 0 {
		t.Errorf("the content capacity counts %d bytes of content charged to the pod", n)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(mem, &st); err != nil {
		t.Fatal(err)
	}
	if used := int64(st.Blocks-st.Bfree) * st.Bsize; used < 8<<20 {
		t.Errorf("the volume's tmpfs uses %d bytes, want the four generations the pod keeps", used)
	}
}

// A pod whose memory limit cannot hold its content is refused
// (ResourceExhausted, naming its memory limit), its old content in place,
// and a pod whose cgroup does not appear within the wait is refused
// Unavailable: the kubelet retries.
func TestContentOverThePodsLimit(t *testing.T) {
	root := podcgrouptest.New(t)
	// The limit holds the first content and the writer (this test binary:
	// about 2 MiB, 16 MiB under -race), not the next content alone.
	root.Pod(t, testUID, 24<<20)
	mem, _ := tmpfs(t, "size=32m")
	cp := &provider{files: big(1<<20, 'a')}
	f, _, _ := podFiller(t, cp, root)
	v := &api.Volume{ID: "v1", Backend: "b", TargetPath: mem, Pod: api.Pod{UID: testUID}}
	if err := f.Fill(t.Context(), v); err != nil {
		t.Fatal(err)
	}
	cp.files = big(28<<20, 'b')
	err := f.Refresh(t.Context(), v)
	if !errors.Is(err, api.ErrResourceExhausted) || !strings.Contains(err.Error(), "the pod's memory limit") {
		t.Errorf("content over the pod's limit: %v, want ResourceExhausted naming the pod's memory limit", err)
	}
	if s := readFile(t, mem, "token"); s[0] != 'a' {
		t.Errorf("a refused refresh changed the content to %q…", s[:1])
	}
	if cur, err := content.Current(mem); err != nil || cur == "" {
		t.Errorf("content.Current after a refused refresh: %q, %v", cur, err)
	}

	other := &api.Volume{ID: "v2", Backend: "b", TargetPath: t.TempDir(), Pod: api.Pod{UID: "7d1c0e4f-0000-4000-8000-000000000002"}}
	mem2, _ := tmpfs(t, "size=1m")
	other.TargetPath = mem2
	err = f.Fill(t.Context(), other)
	if errkind.Code(err).String() != "Unavailable" || !errors.Is(err, podcgroup.ErrNotFound) {
		t.Errorf("a pod without a cgroup: %v, want Unavailable", err)
	}
	other.Pod.UID = ""
	if err := f.Fill(t.Context(), other); errkind.Code(err).String() != "InvalidArgument" || !strings.Contains(err.Error(), "podInfoOnMount") {
		t.Errorf("a volume without its pod's UID: %v, want InvalidArgument naming podInfoOnMount", err)
	}
}

// A volume an earlier run wrote in volume-size mode keeps its reservation in
// pod-cgroup mode until a write has replaced its files (those pages are the
// driver's until then), and none after.
func TestHeldUntilReplacedByThePod(t *testing.T) {
	root := podcgrouptest.New(t)
	root.Pod(t, testUID, 64<<20)
	pods, _, _, err := OpenCharging(PodCgroupConfig{Mode: PodCgroupsRequired, Mount: podcgrouptest.Mount, Root: root.Root})
	if err != nil {
		t.Fatal(err)
	}
	mem, bound := tmpfs(t, "size=4m,nr_inodes=64")
	cp := &provider{files: big(1<<20, 'a')}
	p := Providers{Content: cp, Backends: map[string]Backend{"b": backend{x: struct{}{}}}}
	var r refreshes
	f, l := newFiller(t, p, &mounter{}, 64<<20, &r)
	f.cfg.SaveHeld = func(context.Context, *api.Volume, int64) error { return nil }
	v := &api.Volume{ID: "v1", Backend: "b", TargetPath: mem, Pod: api.Pod{UID: testUID}}
	if err := f.Fill(t.Context(), v); err != nil { // volume-size, as an earlier run
		t.Fatal(err)
	}
	if n := l.Held.InUse(); n != bound {
		t.Fatalf("held %d after a volume-size write, want %d", n, bound)
	}
	f.cfg.PodCgroups, f.cfg.PodCgroupWait = pods, time.Second
	if err := f.Refresh(t.Context(), v); err != nil {
		t.Fatal(err)
	}
	if n := l.Held.InUse(); n != bound {
		t.Errorf("held %d after a refresh that swapped nothing, want the earlier run's %d", n, bound)
	}
	cp.files = big(1<<20, 'b')
	if err := f.Refresh(t.Context(), v); err != nil {
		t.Fatal(err)
	}
	if n := l.Held.InUse(); n != 0 {
		t.Errorf("held %d after the pod's writer replaced the files, want 0", n)
	}
}
