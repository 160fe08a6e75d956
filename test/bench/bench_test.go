//go:build linux

package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
)

var (
	backends     = []string{"tmpfs", "dir", "loop"}
	concurrency  = []int{1, 16}
	heapVolumes  = 1000
	maxBatchSize = 1000 // volumes mounted at once in a Go benchmark
)

// volumesFor is how many volumes one measured run of backend publishes at
// concurrency c. EPHEMERA_BENCH_N overrides the values. Loop volumes run mkfs
// (about 15 ms each), so fewer of them keep the run short.
func volumesFor(backend string, c int) int {
	if n, err := strconv.Atoi(os.Getenv("EPHEMERA_BENCH_N")); err == nil && n > 0 {
		return n
	}
	n := 300
	if c > 1 {
		n = 800
	}
	if backend == "loop" {
		n /= 4
	}
	return n
}

type row struct {
	backend            string
	conc               int
	n                  int
	driver, rpc, floor sample
}

// TestLatencyTable measures every backend x concurrency for the driver and the
// floor and prints one table with ratios. It only runs with EPHEMERA_BENCH=1 or
// -bench, and as root.
func TestLatencyTable(t *testing.T) {
	if !enabled() {
		t.Skip("set EPHEMERA_BENCH=1 (or pass -bench) to measure")
	}
	requireRoot(t)
	e := newEnv(t)
	ctx := context.Background()
	began := time.Now()

	// Warm up sockets, bbolt, the dentry cache and the allocator.
	for _, b := range backends {
		for _, kind := range []string{kindFloor, kindRPC, kindDriver} {
			if _, err := measure(ctx, e.load(kind, b, 64), 64, 16); err != nil {
				t.Fatalf("warm-up %s %s: %v", kind, b, err)
			}
		}
	}

	var rows []row
	for _, b := range backends {
		for _, c := range concurrency {
			n := volumesFor(b, c)
			r := row{backend: b, conc: c, n: n}
			// Two halves, the second in reverse order, so that drift in the
			// machine's load hits every kind alike.
			for _, kind := range []string{kindFloor, kindRPC, kindDriver, kindDriver, kindRPC, kindFloor} {
				s, err := measure(ctx, e.load(kind, b, n/2), n/2, c)
				if err != nil {
					t.Fatalf("%s %s c=%d: %v", kind, b, c, err)
				}
				switch kind {
				case kindFloor:
					r.floor = r.floor.merge(s)
				case kindRPC:
					r.rpc = r.rpc.merge(s)
				default:
					r.driver = r.driver.merge(s)
				}
			}
			rows = append(rows, r)
		}
	}

	syncs, err := fdatasyncLatency(e.h.Options.Node.StateDir, 200)
	if err != nil {
		t.Fatal(err)
	}

	// The framework's heap per volume does not depend on the backend; loop is
	// left out because 1000 mkfs runs would dominate the run.
	heapBackends := []string{"tmpfs", "dir"}
	heap := map[string][2]float64{}
	for _, b := range heapBackends {
		inuse, alloc := heapPerVolume(t, e, b, heapVolumes, 16)
		heap[b] = [2]float64{inuse, alloc}
	}

	if ms, err := mountsUnder(filepath.Dir(e.h.Options.Node.KubeletRootDir)); err != nil || len(ms) > 0 {
		t.Errorf("mounts left after the run (err %v): %v", err, ms)
	}

	var sb strings.Builder
	printTable(&sb, rows)
	fmt.Fprintf(&sb, "\nfdatasync of a 4 KiB pwrite in the state dir (concurrency 1, n=%d): p50 %s, p99 %s.\n", len(syncs), ms(pct(syncs, .5)), ms(pct(syncs, .99)))
	fmt.Fprintln(&sb, "A publish or unpublish is two bbolt commits; each commit is two fdatasyncs (pages, then meta).")
	fmt.Fprintf(&sb, "\nGo heap after %d published volumes (concurrency 16, one client connection):\n", heapVolumes)
	for _, b := range heapBackends {
		fmt.Fprintf(&sb, "  %-5s HeapInuse %+.0f B/volume, HeapAlloc %+.0f B/volume\n", b, heap[b][0], heap[b][1])
	}
	fmt.Fprintf(&sb, "\n%s, %d CPUs, %s %s; run took %v\n", cpuModel(), runtime.NumCPU(), runtime.GOOS, kernel(), time.Since(began).Round(time.Second))
	t.Log("\n" + sb.String())
}

func printTable(w io.Writer, rows []row) {
	fmt.Fprintln(w, "Latency per operation. driver: kubelet simulator -> gRPC -> driver (dial per RPC, 2x NodeGetCapabilities")
	fmt.Fprintln(w, "per publish, vol_data.json; bbolt fsync; real mounts). rpc: the driver's NodePublish/NodeUnpublish alone")
	fmt.Fprintln(w, "on one connection. floor: the same mkdir/mount/umount/rmdir syscalls without the driver")
	fmt.Fprintln(w, "(loop: the loop backend's Create/Delete, i.e. file + LOOP_CONFIGURE + mkfs.ext4 + detach, plus the mount syscalls).")
	fmt.Fprintln(w, "ratio = driver / floor; ops/s = volumes / wall time of the phase.")
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "backend\tconc\top\tn\tdriver p50\tp99\trpc p50\tp99\tfloor p50\tp99\tratio p50\tp99\tdriver ops/s\tfloor ops/s\t")
	for _, r := range rows {
		line := func(op string, d, rpc, f []time.Duration, dw, fw time.Duration) {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%.1fx\t%.1fx\t%.0f\t%.0f\t\n",
				r.backend, r.conc, op, r.n,
				ms(pct(d, .5)), ms(pct(d, .99)), ms(pct(rpc, .5)), ms(pct(rpc, .99)), ms(pct(f, .5)), ms(pct(f, .99)),
				ratio(pct(d, .5), pct(f, .5)), ratio(pct(d, .99), pct(f, .99)),
				float64(r.n)/dw.Seconds(), float64(r.n)/fw.Seconds())
		}
		line("publish", r.driver.pub, r.rpc.pub, r.floor.pub, r.driver.pubWall, r.floor.pubWall)
		line("unpublish", r.driver.unpub, r.rpc.unpub, r.floor.unpub, r.driver.unpubWall, r.floor.unpubWall)
	}
	tw.Flush()
}

// fdatasyncLatency times n pwrite(4 KiB)+fdatasync pairs on a file in dir,
// the unit of a bbolt commit.
func fdatasyncLatency(dir string, n int) ([]time.Duration, error) {
	f, err := os.CreateTemp(dir, "fsync-*")
	if err != nil {
		return nil, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	buf := make([]byte, 4096)
	out := make([]time.Duration, n)
	for i := range n {
		t0 := time.Now()
		if _, err := f.WriteAt(buf, int64(i%16)*4096); err != nil {
			return nil, err
		}
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			return nil, err
		}
		out[i] = time.Since(t0)
	}
	slices.Sort(out)
	return out, nil
}

func ms(d time.Duration) string { return fmt.Sprintf("%.3fms", float64(d)/float64(time.Millisecond)) }

func ratio(a, b time.Duration) float64 {
	if b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// heapPerVolume publishes n volumes of backend through the driver's gRPC API on
// one connection (requests and pod directories prepared beforehand, so only
// what the driver keeps per volume is counted) and returns the growth of
// HeapInuse and HeapAlloc per volume, after a GC, while they are published.
// Then it unpublishes them.
func heapPerVolume(t *testing.T, e *env, backend string, n, conc int) (inuse, alloc float64) {
	t.Helper()
	ctx := context.Background()
	l := newRPCLoad(e.h, backend, n)
	if err := parallel(n, conc, l.setup); err != nil {
		t.Fatal(err)
	}
	if _, err := e.h.Node.NodeGetCapabilities(ctx, &csi.NodeGetCapabilitiesRequest{}); err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&before)
	if err := parallel(n, conc, func(i int) error { return l.publish(ctx, i) }); err != nil {
		t.Fatalf("heap run, publish %s: %v", backend, err)
	}
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&after)
	if err := parallel(n, conc, func(i int) error { return l.unpublish(ctx, i) }); err != nil {
		t.Fatalf("heap run, unpublish %s: %v", backend, err)
	}
	if err := parallel(n, conc, l.done); err != nil {
		t.Fatal(err)
	}
	return float64(int64(after.HeapInuse)-int64(before.HeapInuse)) / float64(n),
		float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n)
}

func cpuModel() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	for line := range strings.SplitSeq(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}

func kernel() string {
	b, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return strings.TrimSpace(string(b))
}

// BenchmarkPublishUnpublish runs the same workloads as Go benchmarks: one op is
// one volume published and unpublished (ns/op is wall time per volume at that
// concurrency); the latency percentiles are reported as extra metrics. At most
// maxBatchSize volumes are mounted at once.
func BenchmarkPublishUnpublish(b *testing.B) {
	requireRoot(b)
	e := newEnv(b)
	ctx := context.Background()
	for _, kind := range []string{kindDriver, kindRPC, kindFloor} {
		for _, backend := range backends {
			for _, c := range concurrency {
				b.Run(fmt.Sprintf("%s/%s/c%d", kind, backend, c), func(b *testing.B) {
					var pub, unpub []time.Duration
					for done := 0; done < b.N; {
						n := min(b.N-done, maxBatchSize)
						s, err := measure(ctx, e.load(kind, backend, n), n, c)
						if err != nil {
							b.Fatal(err)
						}
						pub, unpub = append(pub, s.pub...), append(unpub, s.unpub...)
						done += n
					}
					slices.Sort(pub)
					slices.Sort(unpub)
					b.ReportMetric(us(pct(pub, .5)), "pub-p50-µs")
					b.ReportMetric(us(pct(pub, .99)), "pub-p99-µs")
					b.ReportMetric(us(pct(unpub, .5)), "unpub-p50-µs")
					b.ReportMetric(us(pct(unpub, .99)), "unpub-p99-µs")
				})
			}
		}
	}
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
