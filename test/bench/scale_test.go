//go:build linux

package bench

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
)

// TestScale (issue 11, "Scale"): one node with many tmpfs volumes (1Mi each,
// so memory is not the limit), the scratch driver as its own process:
//
//   - publish throughput of the last 1,000 volumes against the first 1,000;
//   - restart to serving (process start to Probe ready, the reconcile of every
//     record included);
//   - NodeGetVolumeStats of one volume at 1,000 and at N volumes;
//   - the driver's RSS (VmRSS, RssAnon, RssFile) at N volumes;
//   - the orphan GC removing all N after their pods vanished, from the end of
//     the grace period (with --gc-max-orphan-share=1: a wholesale orphaning is
//     otherwise refused without API confirmation, by design).
//
// EPHEMERA_BENCH_SCALE_N sets N (default 10000).
func TestScale(t *testing.T) {
	if !enabled() {
		t.Skip("set EPHEMERA_BENCH=1 (or pass -bench) to measure")
	}
	requireRoot(t)
	n, conc := envInt("EPHEMERA_BENCH_SCALE_N", 10000), 16
	const window = 1000
	if n < 2*window {
		t.Fatalf("EPHEMERA_BENCH_SCALE_N must be at least %d", 2*window)
	}
	base := t.TempDir()
	root, state := filepath.Join(base, "kubelet"), filepath.Join(base, "state")
	t.Cleanup(func() { _ = unmountAllUnder(root) })
	sockDir, err := os.MkdirTemp("", "scale")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	sock := filepath.Join(sockDir, "csi.sock")
	bin := driverBinary(t)
	metricsAddr := freeAddr(t)
	args := []string{"--endpoint=unix://" + sock, "--nodeid=node-1", "--kubelet-root=" + root, "--state-dir=" + state,
		"--backends=tmpfs", "--metrics-address=" + metricsAddr, "--gc-interval=1s", "--orphan-grace-period=2s",
		"--gc-max-orphan-share=1", "--v=2"}
	logf, err := os.Create(filepath.Join(base, "driver.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	var cmd *exec.Cmd
	start := func() time.Duration {
		t.Helper()
		cmd = exec.Command(bin, args...)
		cmd.Stdout, cmd.Stderr = logf, logf
		t0 := time.Now()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		waitProbeReady(t, sock)
		return time.Since(t0)
	}
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}
	t.Cleanup(func() {
		if cmd != nil && cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	if err := os.MkdirAll(filepath.Join(root, "pods"), 0o750); err != nil {
		t.Fatal(err)
	}
	start()
	k := drivertest.NewKubelet(drivertest.KubeletOptions{Root: root, Endpoint: "unix://" + sock, DriverName: "scratch.csi.ephemera.dev"})
	attrs := map[string]string{api.ParamBackend: "tmpfs", api.ParamSize: "1Mi"}
	pods := make([]*drivertest.Pod, n)
	ctx := t.Context()
	publish := func(from, to int) time.Duration {
		t0 := time.Now()
		if err := parallel(to-from, conc, func(i int) error {
			pods[from+i] = k.NewPod("scale", "pod-"+strconv.Itoa(from+i))
			return k.Publish(ctx, pods[from+i], drivertest.InlineVolume{Name: "data", Attributes: attrs})
		}); err != nil {
			t.Fatalf("publishing %d..%d: %v", from, to, err)
		}
		return time.Since(t0)
	}
	first := publish(0, window)
	stats1k := statsLatency(t, sock, pods[0], k)
	publish(window, n-window)
	last := publish(n-window, n)
	statsN := statsLatency(t, sock, pods[0], k)
	rss := readRSS(t, cmd.Process.Pid)
	stop()
	restart := start()
	rssAfter := readRSS(t, cmd.Process.Pid)

	// Every pod vanishes behind the kubelet's back: its mounts go (as in a
	// reboot) and its directory with them.
	stop()
	if err := unmountAllUnder(root); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(filepath.Join(root, "pods"))
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(root, "pods", e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.Now()
	start()
	graceEnd := t0.Add(2 * time.Second)
	deadline := time.Now().Add(5 * time.Minute)
	for volumesGauge(t, metricsAddr) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the orphan GC did not remove every volume within 5 minutes")
		}
		time.Sleep(50 * time.Millisecond)
	}
	gc := time.Since(graceEnd)
	stop()

	perSec := func(d time.Duration) float64 { return float64(window) / d.Seconds() }
	var b strings.Builder
	fmt.Fprintf(&b, "scale: %d tmpfs volumes of 1Mi, the scratch driver as a process, concurrency %d, kubelet-shaped publishes\n", n, conc)
	fmt.Fprintf(&b, "  publish throughput: first %d %.0f/s, last %d (at %d) %.0f/s: %.2fx (target >= 0.8)\n", window, perSec(first), window, n, perSec(last), perSec(last)/perSec(first))
	fmt.Fprintf(&b, "  restart to serving with %d volumes: %s (target <= 1s)\n", n, restart.Round(time.Millisecond))
	fmt.Fprintf(&b, "  NodeGetVolumeStats of one volume: p50 %s at %d volumes, %s at %d\n", ms(stats1k), window, ms(statsN), n)
	fmt.Fprintf(&b, "  RSS at %d volumes: %s; after a restart: %s (target VmRSS <= 40MiB)\n", n, rss, rssAfter)
	fmt.Fprintf(&b, "  orphan GC of %d volumes: %s after the grace period (target <= 10s)\n", n, gc.Round(time.Millisecond))
	t.Log("\n" + b.String())
}

// waitProbeReady waits until the driver's Probe answers ready.
func waitProbeReady(t *testing.T, sock string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			p, err := csi.NewIdentityClient(conn).Probe(ctx, &csi.ProbeRequest{})
			cancel()
			conn.Close()
			if err == nil && p.GetReady().GetValue() {
				return
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatal("the driver did not become ready within 60s")
}

// statsLatency returns the median of 200 NodeGetVolumeStats calls for pod's
// volume, on one connection.
func statsLatency(t *testing.T, sock string, pod *drivertest.Pod, k *drivertest.Kubelet) time.Duration {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	node := csi.NewNodeClient(conn)
	req := &csi.NodeGetVolumeStatsRequest{VolumeId: api.VolumeHandle(pod.UID, "data"), VolumePath: k.TargetPath(pod, "data")}
	d := make([]time.Duration, 200)
	for i := range d {
		t0 := time.Now()
		if _, err := node.NodeGetVolumeStats(t.Context(), req); err != nil {
			t.Fatal(err)
		}
		d[i] = time.Since(t0)
	}
	slices.Sort(d)
	return pct(d, 0.5)
}

// readRSS returns VmRSS, RssAnon and RssFile of pid.
func readRSS(t *testing.T, pid int) string {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var parts []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		for _, k := range []string{"VmRSS:", "RssAnon:", "RssFile:"} {
			if v, ok := strings.CutPrefix(sc.Text(), k); ok {
				parts = append(parts, k+" "+strings.Join(strings.Fields(v), " "))
			}
		}
	}
	return strings.Join(parts, ", ")
}

// volumesGauge sums ephemera_volumes over backends from the driver's metrics.
func volumesGauge(t *testing.T, addr string) float64 {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 1 // not serving yet
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		if line, ok := strings.CutPrefix(sc.Text(), "ephemera_volumes{"); ok {
			if _, v, ok := strings.Cut(line, "} "); ok {
				f, _ := strconv.ParseFloat(v, 64)
				sum += f
			}
		}
	}
	return sum
}
