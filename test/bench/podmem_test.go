//go:build linux

package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"text/tabwriter"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/pluginserver"
)

// generationsMode is the plugin mode (pluginModeEnv) of TestDriverPodMemory:
// every Content call answers one file of generationBytes, a new generation.
const (
	generationsMode = "generations"
	generationBytes = 4 << 20
)

// serveGenerations is the plugin process of TestDriverPodMemory.
func serveGenerations(sock string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	var n atomic.Int64
	err := pluginserver.Serve(ctx, pluginserver.Options{
		Name: "bench-" + generationsMode, Version: "bench", Endpoint: "unix://" + sock,
		Content: framework.ContentFunc(func(context.Context, *api.Volume) (map[string]api.File, error) {
			return map[string]api.File{"token": {Data: bytes.Repeat([]byte{byte('a' + n.Add(1)%26)}, generationBytes)}}, nil
		}),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// kubeletCgroups is a fake kubelet's pod cgroups on the v1 memory
// hierarchy: /sys/fs/cgroup/memory/<root>/kubepods/burstable/pod<UID>,
// removed at cleanup (after the driver and the volumes: register it first).
type kubeletCgroups struct{ root, base string }

func newKubeletCgroups(t *testing.T) *kubeletCgroups {
	t.Helper()
	if _, err := os.Stat("/sys/fs/cgroup/memory/cgroup.procs"); err != nil {
		t.Skip("no cgroup v1 memory hierarchy for the pods")
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	k := &kubeletCgroups{root: "/ephemera-bench-" + hex.EncodeToString(b[:])}
	k.base = "/sys/fs/cgroup/memory" + k.root
	if err := os.MkdirAll(filepath.Join(k.base, "kubepods", "burstable"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		var dirs []string
		_ = filepath.WalkDir(k.base, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		slices.Reverse(dirs)
		for _, d := range dirs {
			if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Errorf("removing %s: %v", d, err)
			}
		}
	})
	return k
}

// pod makes the cgroup of the pod of uid, limited to limit bytes.
func (k *kubeletCgroups) pod(t *testing.T, uid string, limit int64) string {
	t.Helper()
	dir := filepath.Join(k.base, "kubepods", "burstable", "pod"+uid)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "memory.limit_in_bytes"), []byte(strconv.FormatInt(limit, 10)), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// shmemOf reads the total_shmem of a v1 memory cgroup.
func shmemOf(t *testing.T, dir string) int64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "memory.stat"))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "total_shmem "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// TestDriverPodMemory runs the image's driver binary in a memory cgroup
// limited as the DaemonSet limits its container (320Mi), with pods that
// keep every generation of their content open across refreshes (each a
// 4 MiB token: the red-team's "pages outlive their charge"), once on a
// node with pod cgroups (a fake kubelet's, --kubelet-cgroup-root) and once
// with --pod-cgroups=off:
//
//   - pod-cgroup: the pages are charged to the pods' cgroups; the driver's
//     cgroup stays flat however many generations the pods keep (more than
//     its whole limit here), and ephemera_content_held_bytes counts none;
//
//   - volume-size: each volume is reserved at its tmpfs's size against
//     --content-capacity (64Mi); the driver pays for what the pods keep, up
//     to that, and a pod that keeps too much gets its own refreshes refused.
//
//     EPHEMERA_BENCH=1 go test ./test/bench -run TestDriverPodMemory -v
func TestDriverPodMemory(t *testing.T) {
	if !enabled() {
		t.Skip("set EPHEMERA_BENCH=1 to measure")
	}
	requireRoot(t)
	bin := driverBinary(t)
	var out strings.Builder
	tw := tabwriter.NewWriter(&out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "mode\tpods\trefreshes ok\trefused\tgenerations kept open\tdriver cgroup shmem\tdriver cgroup peak\tpods' cgroups shmem\theld (metric)")
	for _, mode := range []string{"pod-cgroup", "volume-size"} {
		t.Run(mode, func(t *testing.T) { podMemory(t, bin, mode, tw) })
	}
	_ = tw.Flush()
	t.Logf("driver memory while pods keep every generation of their content open, in a memory cgroup limited to %s (%s, %s):\n%s",
		cgroupString(heldLimit), cpuModel(), kernel(), out.String())
}

func podMemory(t *testing.T, bin, mode string, tw *tabwriter.Writer) {
	const pods, refreshes = 8, 10
	kc := newKubeletCgroups(t)
	base := shortTempDir(t, "ephemera-podmem")
	pluginSock := filepath.Join(base, "p.sock")
	startPlugin(t, generationsMode, pluginSock, filepath.Join(base, "plugin.log"))
	sock := filepath.Join(base, "csi.sock")
	metricsAddr := freeAddr(t)
	args := append(driverArgs(base, sock, metricsAddr), "--plugin=content=unix://"+pluginSock,
		"--memory-limit="+strconv.Itoa(heldLimit), "--kubelet-cgroup-root="+kc.root, "--pod-cgroup-wait=5s")
	if mode == "volume-size" {
		args = append(args, "--pod-cgroups=off")
	} else {
		args = append(args, "--pod-cgroups=required")
	}
	var cg *memCgroup
	pid, _ := startDriverProcess(t, bin, args, base, func(pid int) {
		cg = newMemCgroup(t, pid)
		cg.setLimit(t, heldLimit)
	})
	waitReady(t, metricsAddr, base)
	if cg.dir == "" {
		t.Skip("no memory cgroup to run the driver in")
	}
	k := drivertest.NewKubelet(drivertest.KubeletOptions{
		Root: filepath.Join(base, "kubelet"), Endpoint: "unix://" + sock, DriverName: memDriver, NodeName: memNode,
	})
	ctx := t.Context()
	// With pod cgroups a volume large enough for every generation (the pods
	// pay); without, one that holds three (the driver pays for its size).
	size := "64Mi"
	if mode == "volume-size" {
		size = "12Mi"
	}
	vol := drivertest.InlineVolume{Name: "token", Attributes: map[string]string{api.ParamBackend: "content", api.ParamSize: size}}
	var open []*os.File
	var ps []*drivertest.Pod
	t.Cleanup(func() {
		for _, f := range open {
			f.Close()
		}
		for _, p := range ps {
			_ = k.DeletePod(context.Background(), p)
		}
	})
	var podDirs []string
	_, _, shmem0 := cg.read(t)
	ok, refused := 0, 0
	for i := range pods {
		p := k.NewPod("podmem", fmt.Sprint("p", i))
		podDirs = append(podDirs, kc.pod(t, p.UID, 256<<20))
		err := k.Publish(ctx, p, vol)
		if status.Code(err) == codes.ResourceExhausted {
			refused++
			continue
		}
		if err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		ps = append(ps, p)
	}
	for range refreshes {
		for _, p := range ps {
			// The pod keeps what it reads open, then the content is replaced.
			f, err := os.Open(filepath.Join(k.TargetPath(p, vol.Name), "token"))
			if err != nil {
				t.Fatal(err)
			}
			open = append(open, f)
			switch err := k.Publish(ctx, p, vol); {
			case err == nil:
				ok++
			case status.Code(err) == codes.ResourceExhausted:
				refused++
			default:
				t.Fatalf("refresh of %s: %v", p.Name, err)
			}
		}
		if !alive(pid) {
			t.Fatal("the driver was killed")
		}
	}
	peak, _, shmem := cg.read(t)
	var podShmem int64
	for _, d := range podDirs {
		podShmem += shmemOf(t, d)
	}
	held := metricValue(t, metricsAddr, "ephemera_content_held_bytes")
	fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\n", mode, len(ps), ok, refused, len(open), cgroupString(shmem-shmem0), cgroupString(peak), cgroupString(podShmem), sizeString(int64(held)))
	switch mode {
	case "pod-cgroup":
		if refused > 0 || held != 0 {
			t.Errorf("with pod cgroups: %d refused, %v bytes held, want none", refused, held)
		}
		if shmem-shmem0 > 2<<20 {
			t.Errorf("the driver's cgroup gained %s of tmpfs pages, want them all charged to the pods", cgroupString(shmem-shmem0))
		}
		if want := int64(pods*(refreshes+1)) * generationBytes; podShmem < want {
			t.Errorf("the pods' cgroups hold %s of tmpfs pages, want at least %s (every generation kept)", cgroupString(podShmem), cgroupString(want))
		}
	case "volume-size":
		if shmem-shmem0 > 64<<20 {
			t.Errorf("the driver's cgroup gained %s of tmpfs pages, more than --content-capacity", cgroupString(shmem-shmem0))
		}
		if refused == 0 {
			t.Error("no publish or refresh refused: the pods kept more than their volumes hold?")
		}
	}
	if peak >= heldLimit {
		t.Errorf("the driver's cgroup peaked at %s, its limit", cgroupString(peak))
	}
}
