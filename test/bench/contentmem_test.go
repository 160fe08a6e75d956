//go:build linux

package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/content"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/plugin"
	"github.com/ephemera-csi/ephemera/framework/pluginserver"
)

// TestDriverContentMemory measures the scratch driver's peak RSS (VmHWM, and
// VmRSS after the burst) as a subprocess, the image's binary as
// TestDriverMemory runs it, while a content-only plugin (this test binary
// re-executed, see TestMain) answers every Content call with the worst answer
// the driver's default bounds allow (plugin.DefaultMaxContentBytes of Cost,
// content.DefaultMaxFiles files, paths of content.DefaultMaxPathBytes):
//
//   - bytes: one file whose Cost is the bound (16 MiB of data);
//   - files: 10,000 files whose Cost is the bound (about 1.1 KiB each);
//   - empty: 10,000 empty files (the most files at the least bytes);
//   - paths: 10,000 empty files with paths of 1,024 bytes, 32 levels deep.
//
// N pods (8 and 16) publish a volume of the plugin's backend at once
// (backend: content, size 64Mi), more than the 3 answers that
// --content-bytes-in-flight (48Mi) admits: the others wait for the budget. A
// publish refused with ResourceExhausted (the budget not free within
// ContentTimeout) is retried after 500 ms, as the kubelet would. Each row is a
// driver and a plugin of their own, so VmHWM is that row's peak. With a
// memory cgroup the driver runs in one of its own, and its peak charge (the
// content it writes to tmpfs is charged to it) is shown too. Rows with
// --content-bytes-in-flight=256Mi (16 answers at once) show what the budget
// saves; they are not asserted. The rows with the default budget must stay
// under 256 MiB, what the DaemonSet's plan leaves the answers beside the
// content capacity; the driver gets --memory-limit=256Mi and
// --content-capacity=-1 (if it has the flags), so that its Go limit is the
// one of the DaemonSet's plan and every volume can be held.
//
// EPHEMERA_BENCH_CONTENT_MAX (bytes) builds the answers for another bound,
// e.g. 67108864 to measure a driver from before the bounds (64 MiB then); a
// driver without --content-bytes-in-flight runs without it and is not
// asserted.
//
//	EPHEMERA_BENCH=1 go test ./test/bench -run TestDriverContentMemory -v
func TestDriverContentMemory(t *testing.T) {
	if !enabled() {
		t.Skip("set EPHEMERA_BENCH=1 to measure")
	}
	requireRoot(t)
	bin := driverBinary(t)
	help, _ := exec.Command(bin, "-h").CombinedOutput()
	hasBudget := bytes.Contains(help, []byte("content-bytes-in-flight"))
	// The DaemonSet passes its container's limit, 256Mi, as --memory-limit.
	if bytes.Contains(help, []byte("memory-limit")) {
		memoryLimitArgs = []string{"--memory-limit=256Mi"}
	}
	// The answers in flight alone: every volume is published and held, so
	// the content capacity is off, and the Go limit is the 192Mi it gives
	// the answers in the DaemonSet's plan (320Mi less the 64Mi capacity is
	// 256Mi). TestDriverHeldMemory runs the plan whole.
	if bytes.Contains(help, []byte("content-capacity")) {
		memoryLimitArgs = append(memoryLimitArgs, "--content-capacity=-1")
	}
	// The driver writes the content itself (its cgroup is charged), also on
	// a machine with pod cgroups.
	memoryLimitArgs = append(memoryLimitArgs, chargeDriverArgs(help)...)
	maxBytes := contentMax()
	t.Logf("driver %s; answers built for a bound of %s; --content-bytes-in-flight known: %v; %q", bin, sizeString(maxBytes), hasBudget, memoryLimitArgs)

	type row struct {
		shape  string
		budget string // --content-bytes-in-flight, "" for the default
		pods   int
	}
	var rows []row
	for _, shape := range worstShapes {
		for _, pods := range []int{8, 16} {
			rows = append(rows, row{shape: shape, pods: pods})
		}
	}
	if hasBudget {
		for _, shape := range []string{"bytes", "files"} {
			rows = append(rows, row{shape: shape, budget: "256Mi", pods: 16})
		}
	}

	var out strings.Builder
	tw := tabwriter.NewWriter(&out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "shape\tbudget\tpods at once\tfiles\tdata per answer\tCost per answer\tVmHWM\tVmRSS after\tcgroup peak\tcgroup after\tof it tmpfs\tretries\twall s")
	for _, r := range rows {
		files := worstAnswer(r.shape, maxBytes)
		var data, cost int64
		for name, f := range files {
			data += int64(len(f.Data))
			cost += content.Cost(name, len(f.Data))
		}
		budget := r.budget
		if budget == "" {
			budget = "default (48Mi)"
			if !hasBudget {
				budget = "none"
			}
		}
		res := measureContentMemory(t, bin, r.shape, r.budget, r.pods, maxBytes)
		if res == nil {
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%.1f MiB\t%.1f MiB\t%s\t%s\t%s\t%d\t%.1f\n",
			r.shape, budget, r.pods, len(files), sizeString(data), sizeString(cost),
			mib(res.status["VmHWM"]), mib(res.status["VmRSS"]), cgroupString(res.cgroupPeak), cgroupString(res.cgroupAfter), cgroupString(res.cgroupShmem), res.retries, res.wall.Seconds())
		if r.budget == "" && hasBudget && res.status["VmHWM"] >= 256<<10 {
			t.Errorf("%s, %d pods at once: VmHWM %.1f MiB, not under the DaemonSet's memory limit of 256 MiB", r.shape, r.pods, mib(res.status["VmHWM"]))
		}
	}
	_ = tw.Flush()
	t.Logf("driver memory under the worst content answers (kB from /proc/<pid>/status, in MiB; %s, %s):\n%s", cpuModel(), kernel(), out.String())
}

// worstShapes are the answers of TestDriverContentMemory.
var worstShapes = []string{"bytes", "files", "empty", "paths"}

// contentMax is the bound the worst answers are built for:
// EPHEMERA_BENCH_CONTENT_MAX or plugin.DefaultMaxContentBytes.
func contentMax() int64 {
	if n, err := strconv.ParseInt(os.Getenv("EPHEMERA_BENCH_CONTENT_MAX"), 10, 64); err == nil && n > 0 {
		return n
	}
	return plugin.DefaultMaxContentBytes
}

// worstAnswer is the answer of shape at bound (content.Cost), with
// the default file and path bounds.
func worstAnswer(shape string, bound int64) map[string]api.File {
	const n = content.DefaultMaxFiles
	name := func(i int) string { return fmt.Sprintf("d/f%05d", i) } // 8 bytes
	files := make(map[string]api.File, n)
	switch shape {
	case "bytes":
		files["data"] = api.File{Data: bytes.Repeat([]byte{'b'}, int(bound-content.Cost("data", 0)))}
	case "files":
		data := bytes.Repeat([]byte{'f'}, int((bound-n*content.Cost(name(0), 0))/n))
		for i := range n {
			files[name(i)] = api.File{Data: data}
		}
	case "empty":
		for i := range n {
			files[name(i)] = api.File{}
		}
	case "paths":
		// 31 directories of 30 bytes, then a name that makes the path
		// DefaultMaxPathBytes long: DefaultMaxDepth components.
		var prefix strings.Builder
		for d := range content.DefaultMaxDepth - 1 {
			fmt.Fprintf(&prefix, "p%02d%s/", d, strings.Repeat("x", 27))
		}
		for i := range n {
			f := fmt.Sprintf("f%05d", i)
			files[prefix.String()+f+strings.Repeat("y", content.DefaultMaxPathBytes-prefix.Len()-len(f))] = api.File{}
		}
	default:
		panic("unknown shape " + shape)
	}
	return files
}

// worstModePrefix is the plugin mode (pluginModeEnv) of a worst-answer plugin:
// the prefix and a shape.
const worstModePrefix = "worst-"

// serveWorstContent is the plugin process of TestDriverContentMemory: Content
// only, every call answered with the same worst answer of shape, built once.
func serveWorstContent(shape, sock string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	files := worstAnswer(shape, contentMax())
	err := pluginserver.Serve(ctx, pluginserver.Options{
		Name: "bench-" + worstModePrefix + shape, Version: "bench", Endpoint: "unix://" + sock,
		Content: framework.ContentFunc(func(context.Context, *api.Volume) (map[string]api.File, error) { return files, nil }),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// contentReading is one row's outcome.
type contentReading struct {
	status                  map[string]int64 // kB, after the burst
	cgroupPeak, cgroupAfter int64            // bytes, -1 without a memory cgroup
	cgroupShmem             int64            // of cgroupAfter, tmpfs pages
	retries                 int64
	wall                    time.Duration
}

// memoryLimitArgs are the deploy/base's --memory-limit, for a driver that
// has the flag.
var memoryLimitArgs []string

// measureContentMemory runs one driver with a worst-answer plugin of shape
// and publishes pods volumes of it at once; budget is
// --content-bytes-in-flight ("" to leave it out).
func measureContentMemory(t *testing.T, bin, shape, budget string, pods int, maxBytes int64) *contentReading {
	t.Helper()
	base := shortTempDir(t, "ephemera-rss")
	pluginSock := filepath.Join(base, "p.sock")
	startPlugin(t, worstModePrefix+shape, pluginSock, filepath.Join(base, "plugin.log"))

	size := max(64<<20, 4*maxBytes) // 64Mi for the default bound: 16,384 inodes
	sock := filepath.Join(base, "csi.sock")
	metrics := freeAddr(t)
	args := append(driverArgs(base, sock, metrics),
		"--plugin=content=unix://"+pluginSock, "--default-size="+strconv.FormatInt(size, 10))
	if budget != "" {
		args = append(args, "--content-bytes-in-flight="+budget)
	}
	args = append(args, memoryLimitArgs...)
	// The cgroup's cleanup is registered before the driver's stop, so it
	// runs after it: a cgroup with a process in it cannot be removed.
	var cg *memCgroup
	pid, stop := startDriverProcess(t, bin, args, base, func(pid int) { cg = newMemCgroup(t, pid) })
	waitReady(t, metrics, base)

	k := drivertest.NewKubelet(drivertest.KubeletOptions{
		Root: filepath.Join(base, "kubelet"), Endpoint: "unix://" + sock, DriverName: memDriver, NodeName: memNode,
	})
	ps := make([]*drivertest.Pod, pods)
	for i := range ps {
		ps[i] = k.NewPod("rss", "pod-"+strconv.Itoa(i))
	}
	vol := drivertest.InlineVolume{Name: "content", Attributes: map[string]string{
		api.ParamBackend: "content", api.ParamSize: strconv.FormatInt(size, 10)}}
	ctx := t.Context()

	var retries atomic.Int64
	start := time.Now()
	err := parallel(pods, pods, func(i int) error {
		for {
			err := k.Publish(ctx, ps[i], vol)
			if status.Code(err) != codes.ResourceExhausted || time.Since(start) > 5*time.Minute {
				return err
			}
			retries.Add(1)
			time.Sleep(500 * time.Millisecond) // the kubelet's first backoff
		}
	})
	wall := time.Since(start)
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(base, "driver.log"))
		t.Errorf("%s, %d pods at once: %v\n%s", shape, pods, err, tail(log, 4000))
		return nil
	}
	r := &contentReading{status: procStatus(t, pid), retries: retries.Load(), wall: wall}
	r.cgroupPeak, r.cgroupAfter, r.cgroupShmem = cg.read(t)
	if err := checkWorstContent(k.TargetPath(ps[0], vol.Name), worstAnswer(shape, maxBytes)); err != nil {
		t.Errorf("%s: content of the first pod: %v", shape, err)
	}
	if err := parallel(pods, pods, func(i int) error { return k.DeletePod(ctx, ps[i]) }); err != nil {
		t.Errorf("%s: deleting the pods: %v", shape, err)
	}
	stop()
	return r
}

// checkWorstContent checks that dir holds want: every name, with its size.
func checkWorstContent(dir string, want map[string]api.File) error {
	for name, f := range want {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		if st.Size() != int64(len(f.Data)) {
			return fmt.Errorf("%s has %d bytes, not %d", name, st.Size(), len(f.Data))
		}
	}
	return nil
}

// memCgroup is a memory cgroup of one process (v1, or v2 with memory.peak),
// removed at cleanup; dir is empty without one.
type memCgroup struct{ dir, peak, current, limit string }

// setLimit limits the cgroup's memory to n bytes, as a container's limit.
func (c *memCgroup) setLimit(t *testing.T, n int64) {
	t.Helper()
	if c.dir == "" {
		return
	}
	if err := os.WriteFile(filepath.Join(c.dir, c.limit), []byte(strconv.FormatInt(n, 10)), 0o644); err != nil {
		t.Fatalf("limiting %s to %d bytes: %v", c.dir, n, err)
	}
}

// add moves pid into the cgroup too (a driver restarted in its container).
func (c *memCgroup) add(t *testing.T, pid int) {
	t.Helper()
	if c.dir == "" {
		return
	}
	if err := os.WriteFile(filepath.Join(c.dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		t.Fatalf("moving %d into %s: %v", pid, c.dir, err)
	}
}

// newMemCgroup moves pid into a memory cgroup of its own, if the machine
// lets it; otherwise the readings are -1.
func newMemCgroup(t *testing.T, pid int) *memCgroup {
	t.Helper()
	name := fmt.Sprintf("ephemera-rss-%d", pid)
	var cg *memCgroup
	if _, err := os.Stat("/sys/fs/cgroup/memory/cgroup.procs"); err == nil {
		cg = &memCgroup{dir: "/sys/fs/cgroup/memory/" + name, peak: "memory.max_usage_in_bytes", current: "memory.usage_in_bytes", limit: "memory.limit_in_bytes"}
	} else if b, err := os.ReadFile("/sys/fs/cgroup/cgroup.subtree_control"); err == nil && bytes.Contains(b, []byte("memory")) {
		cg = &memCgroup{dir: "/sys/fs/cgroup/" + name, peak: "memory.peak", current: "memory.current", limit: "memory.max"}
	} else {
		t.Logf("no memory cgroup to measure in: %v", err)
		return &memCgroup{}
	}
	if err := os.Mkdir(cg.dir, 0o755); err != nil {
		t.Logf("no memory cgroup to measure in: %v", err)
		return &memCgroup{}
	}
	t.Cleanup(func() {
		// The driver has exited (its stop runs first); its charges stay with
		// the parent.
		for range 50 {
			if err := os.Remove(cg.dir); err == nil || errors.Is(err, os.ErrNotExist) {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Errorf("removing cgroup %s: %v", cg.dir, os.Remove(cg.dir))
	})
	if err := os.WriteFile(filepath.Join(cg.dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		t.Logf("moving the driver into %s: %v", cg.dir, err)
		return &memCgroup{}
	}
	return cg
}

// read returns the cgroup's peak and current charge and the shmem (tmpfs)
// pages of the latter, in bytes (-1 without).
func (c *memCgroup) read(t *testing.T) (peak, current, shmem int64) {
	t.Helper()
	if c.dir == "" {
		return -1, -1, -1
	}
	get := func(file string) int64 {
		b, err := os.ReadFile(filepath.Join(c.dir, file))
		if err != nil {
			t.Logf("cgroup: %v", err)
			return -1
		}
		n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		return n
	}
	shmem = -1
	if b, err := os.ReadFile(filepath.Join(c.dir, "memory.stat")); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "shmem "); ok {
				shmem, _ = strconv.ParseInt(v, 10, 64)
			}
		}
	}
	return get(c.peak), get(c.current), shmem
}

func cgroupString(b int64) string {
	if b < 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
}

// sizeString is b in MiB or KiB.
func sizeString(b int64) string {
	if b >= 1<<20 {
		return fmt.Sprintf("%.2f MiB", float64(b)/(1<<20))
	}
	return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
}

// tail is the last n bytes of b.
func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
