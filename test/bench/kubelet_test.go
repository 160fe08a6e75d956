//go:build linux

package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ephemera-csi/ephemera/framework/drivertest"
)

// The kubelet-shaped comparison (issue 11): full publish+unpublish cycles of
// tmpfs volumes driven by the kubelet simulator, which does what the kubelet
// does per volume (a new gRPC connection for each RPC, two
// NodeGetCapabilities per publish, vol_data.json, removeMountDir and the pod
// directories), against the Ephemera driver and against a stateless reference
// driver (statelessDriver: mkdir + mount(2), umount + rmdir), alternated round
// by round in one run so that both see the same machine.
//
//	EPHEMERA_BENCH=1 go test -run TestKubeletShaped -v ./test/bench/
//
// EPHEMERA_BENCH_KUBELET_N (default 200 volumes), EPHEMERA_BENCH_CONC (16),
// EPHEMERA_BENCH_ROUNDS (4). EPHEMERA_BENCH_PROFILE=DIR adds one profiled
// round of the driver and prints the top of its CPU, block and mutex
// profiles (written to DIR).

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// cycleLoad is one kubelet simulator publishing and deleting pods with one
// tmpfs volume each.
type cycleLoad struct {
	k     *drivertest.Kubelet
	attrs map[string]string
}

// cycles runs n full cycles (new pod, publish, delete the pod) on conc workers
// and returns the wall time and the sorted publish and unpublish latencies.
func (l cycleLoad) cycles(ctx context.Context, n, conc int) (time.Duration, []time.Duration, []time.Duration, error) {
	pub, unpub := make([]time.Duration, n), make([]time.Duration, n)
	start := time.Now()
	err := parallel(n, conc, func(i int) error {
		pod := l.k.NewPod("bench", "pod-"+strconv.Itoa(i))
		t0 := time.Now()
		if err := l.k.Publish(ctx, pod, drivertest.InlineVolume{Name: "data", Attributes: l.attrs}); err != nil {
			return err
		}
		t1 := time.Now()
		if err := l.k.DeletePod(ctx, pod); err != nil {
			return err
		}
		pub[i], unpub[i] = t1.Sub(t0), time.Since(t1)
		return nil
	})
	wall := time.Since(start)
	slices.Sort(pub)
	slices.Sort(unpub)
	return wall, pub, unpub, err
}

type cycleResult struct {
	wall       time.Duration
	n          int
	pub, unpub []time.Duration
}

func (r *cycleResult) add(wall time.Duration, n int, pub, unpub []time.Duration) {
	r.wall += wall
	r.n += n
	r.pub = append(r.pub, pub...)
	r.unpub = append(r.unpub, unpub...)
}

func (r *cycleResult) perSecond() float64 { return float64(r.n) / r.wall.Seconds() }

func TestKubeletShaped(t *testing.T) {
	if !enabled() {
		t.Skip("set EPHEMERA_BENCH=1 (or pass -bench) to measure")
	}
	requireRoot(t)
	n, conc, rounds := envInt("EPHEMERA_BENCH_KUBELET_N", 200), envInt("EPHEMERA_BENCH_CONC", 16), envInt("EPHEMERA_BENCH_ROUNDS", 4)
	e := newEnv(t)
	attrs := newDriverLoad(e.h.Kubelet, "tmpfs", 0).attrs
	driver := cycleLoad{k: e.h.Kubelet, attrs: attrs}

	sockDir, err := os.MkdirTemp("", "stateless")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	root := filepath.Join(t.TempDir(), "kubelet")
	t.Cleanup(func() { _ = unmountAllUnder(root) })
	stateless := cycleLoad{
		k: drivertest.NewKubelet(drivertest.KubeletOptions{
			Root: root, Endpoint: serveStateless(t, sockDir), DriverName: "stateless.bench", NodeName: "node-1",
		}),
		attrs: attrs,
	}

	ctx := t.Context()
	// A warm-up of each, not counted.
	for _, l := range []cycleLoad{driver, stateless} {
		if _, _, _, err := l.cycles(ctx, n/4, conc); err != nil {
			t.Fatal(err)
		}
	}
	var d, s cycleResult
	for r := range rounds {
		order := []string{"driver", "stateless"}
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, kind := range order {
			l, res := driver, &d
			if kind == "stateless" {
				l, res = stateless, &s
			}
			wall, pub, unpub, err := l.cycles(ctx, n, conc)
			if err != nil {
				t.Fatalf("round %d, %s: %v", r, kind, err)
			}
			res.add(wall, n, pub, unpub)
		}
	}
	slices.Sort(d.pub)
	slices.Sort(s.pub)
	slices.Sort(d.unpub)
	slices.Sort(s.unpub)
	var b strings.Builder
	fmt.Fprintf(&b, "kubelet-shaped load: %d tmpfs volumes x %d rounds, concurrency %d, alternated; a cycle = new pod, publish (3 RPCs, 3 connections), delete the pod\n", n, rounds, conc)
	fmt.Fprintf(&b, "  %-10s %12s %12s %12s %12s %12s\n", "", "cycles/s", "publish p50", "publish p99", "unpub p50", "unpub p99")
	for _, row := range []struct {
		name string
		r    *cycleResult
	}{{"ephemera", &d}, {"stateless", &s}} {
		fmt.Fprintf(&b, "  %-10s %12.0f %12s %12s %12s %12s\n", row.name, row.r.perSecond(),
			ms(pct(row.r.pub, 0.5)), ms(pct(row.r.pub, 0.99)), ms(pct(row.r.unpub, 0.5)), ms(pct(row.r.unpub, 0.99)))
	}
	fmt.Fprintf(&b, "  ratio: throughput %.2fx of stateless (target >= 0.85), publish p99 %.2fx (target <= 1.3), publish p50 %.2fx\n",
		d.perSecond()/s.perSecond(), ratio(pct(d.pub, 0.99), pct(s.pub, 0.99)), ratio(pct(d.pub, 0.5), pct(s.pub, 0.5)))
	t.Log("\n" + b.String())

	if dir := os.Getenv("EPHEMERA_BENCH_PROFILE"); dir != "" {
		profileRound(t, dir, func() error {
			_, _, _, err := driver.cycles(ctx, n, conc)
			return err
		})
	}
}

// profileRound runs f with the CPU profiler and block and mutex profiling on,
// writes the profiles to dir and logs the top entries of each (flat, within
// this module and the libraries it calls; the kubelet simulator's side is in
// the profile too, since the driver runs in-process).
func profileRound(t *testing.T, dir string, f func() error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cpu, err := os.Create(filepath.Join(dir, "cpu.pprof"))
	if err != nil {
		t.Fatal(err)
	}
	runtime.SetBlockProfileRate(int(10 * time.Microsecond))
	runtime.SetMutexProfileFraction(5)
	if err := pprof.StartCPUProfile(cpu); err != nil {
		t.Fatal(err)
	}
	err = f()
	pprof.StopCPUProfile()
	cpu.Close()
	runtime.SetBlockProfileRate(0)
	runtime.SetMutexProfileFraction(0)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"block", "mutex"} {
		out, err := os.Create(filepath.Join(dir, name+".pprof"))
		if err != nil {
			t.Fatal(err)
		}
		if err := pprof.Lookup(name).WriteTo(out, 0); err != nil {
			t.Fatal(err)
		}
		out.Close()
	}
	for _, name := range []string{"cpu", "block", "mutex"} {
		cmd := exec.Command("go", "tool", "pprof", "-top", "-nodecount=25", os.Args[0], filepath.Join(dir, name+".pprof"))
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Logf("pprof %s: %v\n%s", name, err, b)
			continue
		}
		t.Logf("%s profile (top 25, flat):\n%s", name, b)
	}
}
