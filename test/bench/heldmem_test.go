//go:build linux

package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
)

// heldVolumeSize is the size of TestDriverHeldMemory's content volumes: the
// worst "files" answer fits (10,000 pages and inodes), and what its tmpfs
// can hold (48Mi, and 12,287 inodes at content.InodeCharge: 60 MiB), which
// a driver without pod cgroups reserves from --content-capacity, fits the
// default capacity (64Mi) once; a 64Mi volume (80 MiB) never would.
const heldVolumeSize = "48Mi"

// chargeDriverArgs are the arguments that make a driver whose -h output is
// help pay for the content it writes into tmpfs volumes itself
// (--pod-cgroups=off), as the benchmarks measure it, also on a machine
// with pod cgroups: none when it does not have the flag.
func chargeDriverArgs(help []byte) []string {
	if bytes.Contains(help, []byte("pod-cgroups")) {
		return []string{"--pod-cgroups=off"}
	}
	return nil
}

// heldLimit is the DaemonSet's memory limit of the driver container
// (deploy/base, the chart's default): the memory cgroup's limit here.
const heldLimit = 320 << 20

// TestDriverHeldMemory runs the image's driver binary in a memory cgroup
// limited as the DaemonSet limits its container (320Mi, --memory-limit
// too), with every kind of memory pods can make it hold at once, the way the
// kernel enforces it:
//
//   - held: content volumes of the worst "files" answer (10,000 files of
//     about 1.1 KiB: 49 MiB of tmpfs pages and inodes each, charged to the
//     driver: --pod-cgroups=off) published one after another and kept, until
//     the content capacity (--content-capacity, 64Mi) refuses one; each
//     volume, 48Mi, is reserved at what its tmpfs can hold (48Mi and 12,287
//     inodes at 1Ki: 60 MiB), so one is held;
//   - in flight: 16 pods publishing content volumes at once and retrying
//     every 100 ms, their answers fetched (the budget's 48Mi at a time) and
//     refused at the capacity, for 10 s;
//   - walks: at the same time, 8 callers asking NodeGetVolumeStats of 5
//     directory volumes that share 70,000 files with several links each, the
//     answers never reused (--stats-cache-ttl=-1s): more walks than
//     --stats-max-walks (4), each up to --stats-max-linked-files (65,536);
//   - restart: the driver stopped and started again in the same cgroup with
//     the volumes still held (their pages stay charged to it), counting
//     them again, serving, and refusing content past the capacity.
//
// The cgroup's peak (v1 memory.max_usage_in_bytes, v2 memory.peak) must stay
// under the limit, and the driver must never be OOM-killed. A driver binary
// without --content-capacity (EPHEMERA_BENCH_DRIVER_BIN of an older build)
// is measured too, not asserted: the kernel kills it.
//
//	EPHEMERA_BENCH=1 go test ./test/bench -run TestDriverHeldMemory -v
func TestDriverHeldMemory(t *testing.T) {
	if !enabled() {
		t.Skip("set EPHEMERA_BENCH=1 to measure")
	}
	requireRoot(t)
	bin := driverBinary(t)
	help, _ := exec.Command(bin, "-h").CombinedOutput()
	bounded := bytes.Contains(help, []byte("content-capacity"))
	base := shortTempDir(t, "ephemera-held")
	pluginSock := filepath.Join(base, "p.sock")
	startPlugin(t, worstModePrefix+"files", pluginSock, filepath.Join(base, "plugin.log"))
	sock := filepath.Join(base, "csi.sock")
	metricsAddr := freeAddr(t)
	args := driverArgs(base, sock, metricsAddr)
	for i, a := range args {
		if a == "--backends=tmpfs" {
			args[i] = "--backends=tmpfs,dir"
		}
	}
	args = append(args, "--plugin=content=unix://"+pluginSock, "--default-size="+heldVolumeSize,
		"--memory-limit="+strconv.Itoa(heldLimit), "--stats-cache-ttl=-1s")
	args = append(args, chargeDriverArgs(help)...)

	var cg *memCgroup
	start := func() (int, func()) {
		pid, stop := startDriverProcess(t, bin, args, base, func(pid int) {
			if cg == nil {
				cg = newMemCgroup(t, pid)
				cg.setLimit(t, heldLimit)
			} else {
				cg.add(t, pid)
			}
		})
		waitReady(t, metricsAddr, base)
		return pid, stop
	}
	pid, stop := start()
	if cg.dir == "" {
		t.Skip("no memory cgroup to run the driver in")
	}
	k := drivertest.NewKubelet(drivertest.KubeletOptions{
		Root: filepath.Join(base, "kubelet"), Endpoint: "unix://" + sock, DriverName: memDriver, NodeName: memNode,
	})
	ctx := t.Context()
	var pods []*drivertest.Pod
	t.Cleanup(func() {
		for _, p := range pods {
			_ = k.DeletePod(context.Background(), p)
		}
	})
	newPod := func(name string) *drivertest.Pod {
		p := k.NewPod("held", name)
		pods = append(pods, p)
		return p
	}
	contentVol := drivertest.InlineVolume{Name: "content", Attributes: map[string]string{api.ParamBackend: "content", api.ParamSize: heldVolumeSize}}
	dirVol := drivertest.InlineVolume{Name: "dir", Attributes: map[string]string{api.ParamBackend: "dir"}}

	var out strings.Builder
	tw := tabwriter.NewWriter(&out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "phase\tcontent volumes held\theld (metric)\tpublishes refused\tstats calls\tVmHWM\tVmRSS\tcgroup peak\tcgroup now\tof it tmpfs\twall s")
	row := func(phase string, held int, refused, stats int64, began time.Time) {
		peak, now, shmem := cg.read(t)
		if !alive(pid) {
			fmt.Fprintf(tw, "%s\t%d\tkilled\t%d\t%d\t-\t-\t%s\t%s\t%s\t%.1f\n", phase, held,
				refused, stats, cgroupString(peak), cgroupString(now), cgroupString(shmem), time.Since(began).Seconds())
			return
		}
		st := procStatus(t, pid)
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%.1f MiB\t%.1f MiB\t%s\t%s\t%s\t%.1f\n", phase, held, sizeString(int64(metricValue(t, metricsAddr, "ephemera_content_held_bytes"))),
			refused, stats, mib(st["VmHWM"]), mib(st["VmRSS"]), cgroupString(peak), cgroupString(now), cgroupString(shmem), time.Since(began).Seconds())
		if bounded && peak >= heldLimit {
			t.Errorf("%s: the cgroup's peak %s reached its limit %s", phase, cgroupString(peak), cgroupString(heldLimit))
		}
	}

	// Directory volumes that share 70,000 files with several links.
	began := time.Now()
	var dirs []*drivertest.Pod
	for i := range 5 {
		p := newPod(fmt.Sprint("dir-", i))
		if err := k.Publish(ctx, p, dirVol); err != nil {
			t.Fatalf("dir volume %d: %v", i, err)
		}
		dirs = append(dirs, p)
	}
	if err := linkedFiles(filepath.Join(base, "state", "volumes"), dirs, dirVol.Name, 70_000); err != nil {
		t.Fatal(err)
	}
	t.Logf("5 directory volumes sharing 70,000 linked files made in %.1f s", time.Since(began).Seconds())
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	node := csi.NewNodeClient(conn)
	var stats atomic.Int64
	walk := func(ctx context.Context, i int) {
		for j := i; ctx.Err() == nil; j++ {
			p := dirs[j%len(dirs)]
			_, err := node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{
				VolumeId: api.VolumeHandle(p.UID, dirVol.Name), VolumePath: k.TargetPath(p, dirVol.Name)})
			if err == nil {
				stats.Add(1)
			}
		}
	}

	// The walks alone first: what they take beside the idle driver.
	began = time.Now()
	walkCtx, stopWalks := context.WithTimeout(ctx, 5*time.Second)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() { walk(walkCtx, i) })
	}
	wg.Wait()
	stopWalks()
	row("8 stats callers, 5 volumes", 0, 0, stats.Load(), began)
	stats.Store(0)

	// Content held: one volume after another until the capacity refuses.
	began = time.Now()
	held := 0
	var refused atomic.Int64
	for i := range 8 {
		err := k.Publish(ctx, newPod(fmt.Sprint("held-", i)), contentVol)
		if status.Code(err) == codes.ResourceExhausted {
			refused.Add(1)
			break
		}
		if err != nil && alive(pid) {
			t.Fatalf("content volume %d: %v", i, err)
		}
		if err != nil {
			t.Logf("content volume %d: %v", i, err)
			break
		}
		held++
		if !alive(pid) {
			break
		}
	}
	if !alive(pid) {
		row("held (driver OOM-killed)", held, refused.Load(), 0, began)
		_ = tw.Flush()
		t.Logf("%s", out.String())
		if bounded {
			t.Fatalf("the driver was killed holding %d content volumes", held)
		}
		return
	}
	row("held", held, refused.Load(), 0, began)

	// Answers in flight and walks at once, on top of what is held.
	began = time.Now()
	loadCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	for i := range 16 {
		p := newPod(fmt.Sprint("burst-", i))
		wg.Go(func() {
			for loadCtx.Err() == nil {
				err := k.Publish(loadCtx, p, contentVol)
				switch {
				case status.Code(err) == codes.ResourceExhausted:
					refused.Add(1)
				case err == nil:
					return // room was made: keep it
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
	for i := range 8 {
		wg.Go(func() { walk(loadCtx, i) })
	}
	wg.Wait()
	cancel()
	row("held + 16 publishes + 8 stats callers", held, refused.Load(), stats.Load(), began)
	if !alive(pid) {
		t.Fatal("the driver was killed under load")
	}

	// A restart in the same cgroup with the volumes held.
	began = time.Now()
	before := metricValue(t, metricsAddr, "ephemera_content_held_bytes")
	stop()
	pid, _ = start()
	if got := metricValue(t, metricsAddr, "ephemera_content_held_bytes"); bounded && got != before {
		t.Errorf("after the restart the driver counts %v bytes of content held, want the %v before", got, before)
	}
	err = k.Publish(ctx, newPod("after-restart"), contentVol)
	if bounded && status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a content volume past the capacity after the restart: %v, want ResourceExhausted", err)
	}
	if err := k.Publish(ctx, newPod("tmpfs-after-restart"), drivertest.InlineVolume{Name: "t", Attributes: map[string]string{api.ParamBackend: "tmpfs", api.ParamSize: "1Mi"}}); err != nil {
		t.Errorf("a tmpfs volume after the restart: %v", err)
	}
	row("restarted, volumes held", held, refused.Load(), 0, began)
	_ = tw.Flush()
	t.Logf("driver memory with content held, answers in flight and walks, in a memory cgroup limited to %s (%s, %s; --content-capacity known: %v):\n%s",
		cgroupString(heldLimit), cpuModel(), kernel(), bounded, out.String())
}

// linkedFiles makes n empty files in the directory volume of the first pod
// and a hard link to each in the volumes of the others, in the dir backend's
// directories under root (links cannot cross the volumes' bind mounts):
// every walk of them meets n files with several links.
func linkedFiles(root string, pods []*drivertest.Pod, vol string, n int) error {
	dir := func(p *drivertest.Pod) string { return filepath.Join(root, api.VolumeHandle(p.UID, vol)) }
	first := dir(pods[0])
	for i := range n {
		name := fmt.Sprintf("f%06d", i)
		f, err := os.OpenFile(filepath.Join(first, name), os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o644)
		if err != nil {
			return err
		}
		f.Close()
		for _, p := range pods[1:] {
			if err := os.Link(filepath.Join(first, name), filepath.Join(dir(p), name)); err != nil {
				return err
			}
		}
	}
	return nil
}

// alive reports whether process pid still runs (not a zombie).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	return !strings.HasPrefix(rest, "Z") && syscall.Kill(pid, 0) == nil
}

// metricValue reads one unlabelled series from the driver's /metrics; 0
// when absent.
func metricValue(t *testing.T, addr, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}
