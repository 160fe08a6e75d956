//go:build linux

package framework_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/drivers/dir"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
)

// deepTree makes depth nested directories "d" under dir (relative mkdirat
// and openat, so it costs nothing per level) with a 4KiB file at the bottom.
func deepTree(t testing.TB, dir string, depth int) {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	for range depth {
		if err := unix.Mkdirat(fd, "d", 0o755); err != nil {
			unix.Close(fd)
			t.Fatal(err)
		}
		nfd, err := unix.Openat(fd, "d", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		fd = nfd
	}
	defer unix.Close(fd)
	f, err := unix.Openat(fd, "bottom", unix.O_WRONLY|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(f)
	if _, err := unix.Write(f, make([]byte, 4096)); err != nil {
		t.Fatal(err)
	}
}

// publishDirVolume publishes a dir-backend volume name for a new pod of h and deletes
// the pod when the test ends (before the harness stops).
func publishDirVolume(t *testing.T, h *drivertest.Harness, name string) (*drivertest.Pod, string) {
	t.Helper()
	k := h.Kubelet
	pod := k.NewPod("ns", "p-"+name)
	if err := k.Publish(t.Context(), pod, drivertest.InlineVolume{Name: name, Attributes: map[string]string{"backend": "dir"}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := k.DeletePod(context.Background(), pod); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return pod, k.TargetPath(pod, name)
}

func volumeStats(ctx context.Context, h *drivertest.Harness, pod *drivertest.Pod, name string) (*csi.NodeGetVolumeStatsResponse, error) {
	return h.Node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{
		VolumeId: api.VolumeHandle(pod.UID, name), VolumePath: h.Kubelet.TargetPath(pod, name),
	})
}

// metricsText is what the driver's /metrics serves.
func metricsText(t *testing.T, d *framework.Driver) string {
	t.Helper()
	rec := httptest.NewRecorder()
	d.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	return rec.Body.String()
}

// A pod's directory 4,000 levels deep (the old walk took ~30s of CPU per
// NodeGetVolumeStats, re-resolving every path from the root) is counted down
// to the depth bound only: the answer is a lower bound, the volume stays
// healthy, and the bound shows in the metric. The entry bound likewise.
func TestVolumeStatsBounds(t *testing.T) {
	t.Run("depth", func(t *testing.T) {
		h := realHarness(t, nil)
		pod, target := publishDirVolume(t, h, "deep")
		deepTree(t, target, 4000)
		resp, err := volumeStats(t.Context(), h, pod, "deep")
		if err != nil {
			t.Fatal(err)
		}
		// The root and levels 1..128 (the default MaxDepth); the old walk
		// counted all 4,001 and the file.
		if i := usage(t, resp, csi.VolumeUsage_INODES); i.Used != 1+128 {
			t.Errorf("inodes used = %d, want %d (root and 128 levels)", i.Used, 1+128)
		}
		if abnormal, msg := legacyCondition(t, resp); abnormal {
			t.Errorf("a volume at the depth bound is reported abnormal: %s", msg)
		}
		if m := metricsText(t, h.Driver()); !strings.Contains(m, `ephemera_stats_walks_total{result="max_depth"} 1`) {
			t.Errorf("no max_depth walk in the metrics:\n%s", grepLines(m, "ephemera_stats_walks_total"))
		}
	})
	t.Run("entries", func(t *testing.T) {
		h := realHarness(t, func(o *framework.Options) { o.Limits.StatsWalk.MaxEntries = 50 })
		pod, target := publishDirVolume(t, h, "wide")
		for i := range 500 {
			if err := os.WriteFile(filepath.Join(target, fmt.Sprint(i)), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		resp, err := volumeStats(t.Context(), h, pod, "wide")
		if err != nil {
			t.Fatal(err)
		}
		if i := usage(t, resp, csi.VolumeUsage_INODES); i.Used != 50 {
			t.Errorf("inodes used = %d, want 50 (MaxEntries, the root included)", i.Used)
		}
		if m := metricsText(t, h.Driver()); !strings.Contains(m, `ephemera_stats_walks_total{result="max_entries"} 1`) {
			t.Errorf("no max_entries walk in the metrics:\n%s", grepLines(m, "ephemera_stats_walks_total"))
		}
	})
}

func grepLines(s, sub string) string {
	var out []string
	for l := range strings.Lines(s) {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "")
}

// A caller that goes away stops the walk it alone waited for, at once (the
// next entry), and gets its context's code; the cut-short count is not
// cached for the next caller, who gets the full one.
func TestVolumeStatsCallerGone(t *testing.T) {
	h := realHarness(t, func(o *framework.Options) { o.Limits.StatsWalk.MaxDepth = 10_000 })
	pod, target := publishDirVolume(t, h, "deep")
	deepTree(t, target, 4000)
	d := h.Driver()

	for _, tc := range []struct {
		name string
		code codes.Code
		ctx  func() (context.Context, context.CancelFunc)
	}{
		{"canceled", codes.Canceled, func() (context.Context, context.CancelFunc) { return context.WithCancel(t.Context()) }},
		{"deadline", codes.DeadlineExceeded, func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(t.Context(), 200*time.Millisecond)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			walks := framework.StatsWalks(d)
			ctx, cancel := tc.ctx()
			defer cancel()
			var mu sync.Mutex
			var visited int64
			framework.SetStatsWalkHook(d, func(wctx context.Context, n int64) {
				mu.Lock()
				visited = max(visited, n)
				mu.Unlock()
				if n == 10 {
					if tc.code == codes.Canceled {
						cancel()
					}
					<-ctx.Done()  // the caller is gone...
					<-wctx.Done() // ...and so the walk is canceled (or reaches its own Timeout)
				}
			})
			_, err := volumeStats(ctx, h, pod, "deep")
			if status.Code(err) != tc.code {
				t.Errorf("stats: %v, want %v", err, tc.code)
			}
			framework.WaitStatsWalks(d)
			framework.SetStatsWalkHook(d, nil)
			if visited != 10 {
				t.Errorf("the walk visited %d entries, want 10: it stops at the first entry after its caller left", visited)
			}
			if framework.StatsWalks(d) != walks+1 || framework.StatsCached(d) != 0 {
				t.Errorf("%d walks, %d cached, want 1 walk, nothing cached", framework.StatsWalks(d)-walks, framework.StatsCached(d))
			}
			resp, err := volumeStats(t.Context(), h, pod, "deep")
			if err != nil {
				t.Fatal(err)
			}
			if i := usage(t, resp, csi.VolumeUsage_INODES); i.Used != 4002 {
				t.Errorf("inodes used after the canceled walk = %d, want 4002 (the root, 4,000 levels, the file)", i.Used)
			}
			framework.StatsForget(d, api.VolumeHandle(pod.UID, "deep")) // the next case walks again
		})
	}
	if m := metricsText(t, d); !strings.Contains(m, `ephemera_stats_walks_total{result="canceled"} 2`) {
		t.Errorf("want 2 canceled walks in the metrics (none stopped by its Timeout):\n%s", grepLines(m, "ephemera_stats_walks_total"))
	}
}

// Concurrent calls for one volume share one walk; its answer is reused while
// fresh and dropped when the volume is unpublished, so the same volume
// published again is walked afresh.
func TestVolumeStatsSharedAndCached(t *testing.T) {
	h := realHarness(t, nil)
	pod, target := publishDirVolume(t, h, "v")
	if err := os.WriteFile(filepath.Join(target, "f"), make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	d, id := h.Driver(), api.VolumeHandle(pod.UID, "v")
	const n = 8
	release := make(chan struct{})
	framework.SetStatsWalkHook(d, func(_ context.Context, entries int64) {
		if entries == 2 { // the first after the root: f
			<-release
		}
	})
	var wg sync.WaitGroup
	used := make([]int64, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			resp, err := volumeStats(t.Context(), h, pod, "v")
			errs[i] = err
			for _, u := range resp.GetUsage() {
				if u.Unit == csi.VolumeUsage_INODES {
					used[i] = u.Used
				}
			}
		})
	}
	for deadline := time.Now().Add(30 * time.Second); framework.StatsWaiters(d, id) < n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) { // a hang would end the binary before the cleanups
			close(release)
			t.Fatalf("%d of %d calls wait for the walk after 30s", framework.StatsWaiters(d, id), n)
		}
	}
	close(release)
	wg.Wait()
	for i := range n {
		if errs[i] != nil || used[i] != 2 {
			t.Errorf("call %d: inodes used %d, %v; want 2 (root, f)", i, used[i], errs[i])
		}
	}
	if w := framework.StatsWalks(d); w != 1 {
		t.Errorf("%d concurrent calls made %d walks, want 1", n, w)
	}

	// Within the TTL the answer is reused: a new file is not seen yet.
	if err := os.WriteFile(filepath.Join(target, "g"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	resp, err := volumeStats(t.Context(), h, pod, "v")
	if err != nil {
		t.Fatal(err)
	}
	if i := usage(t, resp, csi.VolumeUsage_INODES); i.Used != 2 || framework.StatsWalks(d) != 1 {
		t.Errorf("within the TTL: inodes used %d after %d walks, want the cached 2 after 1", i.Used, framework.StatsWalks(d))
	}

	// Unpublished: the answer is dropped; published again, walked again.
	if err := h.Kubelet.Unpublish(t.Context(), pod, "v"); err != nil {
		t.Fatal(err)
	}
	if c := framework.StatsCached(d); c != 0 {
		t.Errorf("%d answers cached after the unpublish, want 0", c)
	}
	if err := h.Kubelet.Publish(t.Context(), pod, drivertest.InlineVolume{Name: "v", Attributes: map[string]string{"backend": "dir"}}); err != nil {
		t.Fatal(err)
	}
	resp, err = volumeStats(t.Context(), h, pod, "v")
	if err != nil {
		t.Fatal(err)
	}
	if i := usage(t, resp, csi.VolumeUsage_INODES); i.Used != 1 || framework.StatsWalks(d) != 2 {
		t.Errorf("republished: inodes used %d after %d walks, want 1 (a new, empty directory) after 2", i.Used, framework.StatsWalks(d))
	}
}

// The walk never follows a link (to /, to the parent) and never enters
// another mount inside the volume (du -x); a file's hard links count once.
func TestVolumeStatsStaysInside(t *testing.T) {
	h := realHarness(t, nil)
	pod, target := publishDirVolume(t, h, "v")
	for _, l := range []struct{ old, new string }{{"/", "root"}, {"..", "up"}, {".", "self"}} {
		if err := os.Symlink(l.old, filepath.Join(target, l.new)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(target, "f"), make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(target, "f"), filepath.Join(target, "f2")); err != nil {
		t.Fatal(err)
	}
	// A tmpfs mounted inside the volume, holding more than the volume.
	mnt := filepath.Join(target, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=16m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
	for i := range 10 {
		if err := os.WriteFile(filepath.Join(mnt, fmt.Sprint(i)), make([]byte, 1<<20), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := volumeStats(t.Context(), h, pod, "v")
	if err != nil {
		t.Fatal(err)
	}
	// root, root, up, self, f (f2 is f): 5; not the mount point's tmpfs
	// root nor its 10 files.
	if i := usage(t, resp, csi.VolumeUsage_INODES); i.Used != 5 {
		t.Errorf("inodes used = %d, want 5 (root, 3 links, one file)", i.Used)
	}
	if b := usage(t, resp, csi.VolumeUsage_BYTES); b.Used < 1<<20 || b.Used > 2<<20 {
		t.Errorf("bytes used = %d, want about 1MiB (f once, nothing behind links or the mount)", b.Used)
	}
	if err := syscall.Unmount(mnt, 0); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkVolumeStatsDeepDir is one NodeGetVolumeStats of a dir volume
// 4,000 levels deep, walked afresh each time (the cached answer dropped):
// "default" with the default bounds (128 levels counted), "unbounded" with
// a depth bound above the tree's (every level counted: the walk is linear).
func BenchmarkVolumeStatsDeepDir(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root (bind mounts)")
	}
	for _, bc := range []struct {
		name  string
		depth int
	}{{"default", 0}, {"unbounded", 10_000}} {
		b.Run(bc.name, func(b *testing.B) {
			base := b.TempDir()
			d, err := dir.New(dir.Options{Root: filepath.Join(base, "state", "volumes")})
			if err != nil {
				b.Fatal(err)
			}
			opts := framework.Options{
				Backends: map[string]framework.Backend{"dir": d},
				Node: framework.NodeOptions{
					KubeletRootDir: filepath.Join(base, "kubelet"),
					StateDir:       filepath.Join(base, "state"),
				},
				Observability: framework.ObservabilityOptions{Logger: klog.Background().V(10)},
			}
			opts.Limits.StatsWalk.MaxDepth = bc.depth
			h := drivertest.Start(b, opts)
			k := h.Kubelet
			pod := k.NewPod("ns", "p")
			if err := k.Publish(b.Context(), pod, drivertest.InlineVolume{Name: "v"}); err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = k.DeletePod(context.Background(), pod) })
			deepTree(b, k.TargetPath(pod, "v"), 4000)
			id := api.VolumeHandle(pod.UID, "v")
			for b.Loop() {
				framework.StatsForget(h.Driver(), id)
				if _, err := volumeStats(b.Context(), h, pod, "v"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
