//go:build linux

package bench

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
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

// The out-of-process kubelet-shaped comparison (issue 22, item 7): the scratch
// driver binary as shipped (EPHEMERA_BENCH_DRIVER_BIN, make bench passes the
// image's; --v=2 into a log file, tmpfs backend) and the stateless reference
// driver (statelessDriver, this test binary re-executed with
// EPHEMERA_BENCH_STATELESS) each run as a process of their own, and this test
// process is the kubelet and nothing else. Per volume it does what the kubelet
// does for an inline CSI volume, no more:
//
//   - publish: MkdirAll of the target's parent
//     (pods/<uid>/volumes/kubernetes.io~csi/<name>), NodeGetCapabilities twice
//     and NodePublishVolume, each on a new gRPC connection, with the requests
//     the kubelet sends (drivertest.Kubelet.PublishRequest: volume_id
//     api.VolumeHandle(uid, name), the pod-info keys and
//     csi.storage.k8s.io/ephemeral in volume_context, the target path);
//   - unpublish: NodeUnpublishVolume on a new connection, then rmdir of the
//     target (when the driver left it) and of the directories the publish made.
//
// Unlike TestKubeletShaped, whose in-process simulator also writes and reads
// vol_data.json and keeps the kubelet's books (and shares the process, its
// CPU and its garbage collector with the driver), the client's cost here is
// the same small one for both drivers, and each driver's cost is its own
// process's. Rounds of each driver alternate; a warm-up is not counted.
//
//	EPHEMERA_BENCH=1 go test -run TestKubeletShapedProcess -v ./test/bench/
//
// EPHEMERA_BENCH_KUBELET_N (default 200 volumes per round), EPHEMERA_BENCH_CONC
// (16), EPHEMERA_BENCH_ROUNDS (10). Then, untimed, one more round of each
// driver under strace -c -f (attached before the round, detached after) gives
// the syscall budget row: the driver process's syscalls per cycle, in total and
// by name (EPHEMERA_BENCH_STRACE=0 skips it; without /usr/bin/strace it is
// skipped with a message). EPHEMERA_BENCH_DRIVER_ARGS adds flags to the
// driver's command line (space-separated), EPHEMERA_BENCH_KEEP=DIR copies the
// drivers' logs there. EPHEMERA_BENCH_PROFILE=DIR profiles a driver process
// built with -tags pprof (profileProcess). EPHEMERA_BENCH_BASELINE_BIN=<another scratch binary>
// runs it as a third process in the same rounds (its extra flags in
// EPHEMERA_BENCH_BASELINE_ARGS): the before and after of a change on the same
// machine state.
//
// Besides cycles/s and the latencies, each row has the driver process's CPU
// time per cycle (utime+stime of /proc/<pid>/stat) and the client's (this
// process, getrusage): on a shared machine the throughput of a round moves by
// ±20% with the load of the others, the CPU per cycle by a few percent.

// statelessEnv makes this test binary the stateless reference driver, serving
// on the socket it names (TestMain).
const statelessEnv = "EPHEMERA_BENCH_STATELESS"

// serveStatelessProcess is the stateless driver's process: statelessDriver on
// the UNIX socket sock until SIGTERM.
func serveStatelessProcess(sock string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	lis, err := net.Listen("unix", sock)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	srv := grpc.NewServer()
	csi.RegisterIdentityServer(srv, statelessDriver{})
	csi.RegisterNodeServer(srv, statelessDriver{})
	go func() {
		<-ctx.Done()
		srv.Stop()
	}()
	if err := srv.Serve(lis); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// procDriver is one driver process and the kubelet's view of it.
type procDriver struct {
	name    string
	pid     int
	sock    string
	metrics string              // its /metrics address; "" for the stateless driver
	k       *drivertest.Kubelet // only for its requests and paths; it sends nothing
	attrs   map[string]string
	log     string // its log file
}

// newUID is a pod UID as the API server makes them: a random lowercase UUID.
func newUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// dial opens a new gRPC connection to sock, as the kubelet does for every CSI
// call (no TLS, authority localhost).
func dial(sock string) (*grpc.ClientConn, error) {
	return grpc.NewClient("passthrough:///localhost",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithAuthority("localhost"),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}))
}

// node runs rpc on a new connection that is closed afterwards.
func (p *procDriver) node(rpc func(csi.NodeClient) error) error {
	conn, err := dial(p.sock)
	if err != nil {
		return err
	}
	defer conn.Close()
	return rpc(csi.NewNodeClient(conn))
}

// cycle publishes and unpublishes one volume of a new pod the kubelet's way
// and returns how long each half took.
func (p *procDriver) cycle(ctx context.Context, i int) (pub, unpub time.Duration, err error) {
	pod := &drivertest.Pod{Namespace: "bench", Name: "pod-" + strconv.Itoa(i), UID: newUID(), ServiceAccount: "default"}
	vol := drivertest.InlineVolume{Name: "data", Attributes: p.attrs}
	target := p.k.TargetPath(pod, vol.Name)
	parent := filepath.Dir(target)
	t0 := time.Now()
	if err := os.MkdirAll(parent, 0o750); err != nil {
		return 0, 0, err
	}
	var caps []*csi.NodeServiceCapability
	for range 2 { // VOLUME_MOUNT_GROUP, then the access-mode mapper
		if err := p.node(func(c csi.NodeClient) error {
			resp, err := c.NodeGetCapabilities(ctx, &csi.NodeGetCapabilitiesRequest{})
			caps = resp.GetCapabilities()
			return err
		}); err != nil {
			return 0, 0, fmt.Errorf("NodeGetCapabilities: %w", err)
		}
	}
	req := p.k.PublishRequest(pod, vol, caps...)
	if err := p.node(func(c csi.NodeClient) error {
		_, err := c.NodePublishVolume(ctx, req)
		return err
	}); err != nil {
		return 0, 0, fmt.Errorf("NodePublishVolume: %w", err)
	}
	t1 := time.Now()
	if err := p.node(func(c csi.NodeClient) error {
		_, err := c.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: req.VolumeId, TargetPath: target})
		return err
	}); err != nil {
		return 0, 0, fmt.Errorf("NodeUnpublishVolume: %w", err)
	}
	// removeMountDir, then the pod's directories this publish made.
	for d := target; d != filepath.Join(p.k.Root(), "pods"); d = filepath.Dir(d) {
		if err := os.Remove(d); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return 0, 0, err
		}
	}
	return t1.Sub(t0), time.Since(t1), nil
}

// cycles runs n cycles on conc workers: the wall time and the sorted
// latencies.
func (p *procDriver) cycles(ctx context.Context, n, conc int) (time.Duration, []time.Duration, []time.Duration, error) {
	pub, unpub := make([]time.Duration, n), make([]time.Duration, n)
	start := time.Now()
	err := parallel(n, conc, func(i int) error {
		var err error
		pub[i], unpub[i], err = p.cycle(ctx, i)
		return err
	})
	wall := time.Since(start)
	slices.Sort(pub)
	slices.Sort(unpub)
	return wall, pub, unpub, err
}

// scratchArgs is the scratch driver's command line below base: driverArgs
// (as deploy/base runs it, without the API server) with the tmpfs flags and
// budget, plus the flags in the environment variable extra (space-separated).
func scratchArgs(base, metrics, extra string) []string {
	args := append(driverArgs(base, filepath.Join(base, "csi.sock"), metrics),
		"--default-size=64Mi", "--max-volume-size=4Gi", "--tmpfs-max-inodes=1048576", "--capacity=tmpfs=2Gi")
	return append(args, strings.Fields(os.Getenv(extra))...)
}

// benchAttrs are the volume attributes of every volume: a 16Mi tmpfs.
var benchAttrs = map[string]string{api.ParamBackend: "tmpfs", api.ParamSize: strconv.Itoa(volSize)}

// startScratch runs the scratch driver binary bin as a process below base
// (its kubelet root, state and log there) and waits until it is ready.
func startScratch(t *testing.T, name, bin, base, extraArgs string) *procDriver {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(base, "kubelet", "pods"), 0o750); err != nil {
		t.Fatal(err)
	}
	metrics := freeAddr(t)
	pid, _ := startDriverProcess(t, bin, scratchArgs(base, metrics, extraArgs), base, nil)
	waitReady(t, metrics, base)
	return &procDriver{
		name: name, pid: pid, sock: filepath.Join(base, "csi.sock"), metrics: metrics, attrs: benchAttrs, log: filepath.Join(base, "driver.log"),
		k: drivertest.NewKubelet(drivertest.KubeletOptions{Root: filepath.Join(base, "kubelet"), DriverName: memDriver, NodeName: memNode}),
	}
}

// startStateless runs this test binary as the stateless driver below base and
// waits until it serves. It is stopped at cleanup.
func startStateless(t *testing.T, base string) *procDriver {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(base, "kubelet", "pods"), 0o750); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(base, "csi.sock")
	logf, err := os.Create(filepath.Join(base, "driver.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), statelessEnv+"="+sock)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		logf.Close()
	})
	waitServing(t, sock)
	return &procDriver{
		name: "stateless", pid: cmd.Process.Pid, sock: sock, attrs: benchAttrs, log: filepath.Join(base, "driver.log"),
		k: drivertest.NewKubelet(drivertest.KubeletOptions{Root: filepath.Join(base, "kubelet"), DriverName: "stateless.bench", NodeName: memNode}),
	}
}

// waitServing waits until Probe on sock answers (the stateless driver leaves
// ready unset: ready, by the CSI spec).
func waitServing(t *testing.T, sock string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; {
		conn, err := dial(sock)
		if err == nil {
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			_, err = csi.NewIdentityClient(conn).Probe(ctx, &csi.ProbeRequest{})
			cancel()
			conn.Close()
			if err == nil {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s does not answer Probe after 30s: %v", sock, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// selfCPU is the user+system CPU time of this process (the client).
func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procResult is what the rounds of one driver measured.
type procResult struct {
	cycleResult
	cpu, client time.Duration // the driver's and the client's CPU time
	alloc, gcs  float64       // the driver's heap allocations (bytes) and GC cycles
	gcPause     float64       // the longest GC stop-the-world pause seen (seconds)
	// server counts the driver's own NodePublishVolume durations (its
	// ephemera_rpc_duration_seconds, from the interceptor) by bucket upper
	// bound: the handler's time, without the connection and the scheduling
	// around it that the client sees.
	server map[float64]float64
}

// goStats reads the Go runtime's allocated bytes, GC cycles and longest GC
// pause so far, and the publish duration histogram, from a scratch driver's
// /metrics (zero for the stateless driver, which has none).
func goStats(t *testing.T, p *procDriver) (alloc, gcs, pause float64, server map[float64]float64) {
	t.Helper()
	server = map[float64]float64{}
	if p.metrics == "" {
		return 0, 0, 0, server
	}
	resp, err := http.Get("http://" + p.metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, v, _ := strings.Cut(sc.Text(), " ")
		switch {
		case name == "go_memstats_alloc_bytes_total":
			alloc, _ = strconv.ParseFloat(v, 64)
		case name == "go_gc_duration_seconds_count":
			gcs, _ = strconv.ParseFloat(v, 64)
		case name == `go_gc_duration_seconds{quantile="1"}`:
			pause, _ = strconv.ParseFloat(v, 64)
		case strings.HasPrefix(name, "ephemera_rpc_duration_seconds_bucket{") &&
			strings.Contains(name, `method="NodePublishVolume"`) && strings.Contains(name, `code="OK"`):
			_, le, _ := strings.Cut(name, `le="`)
			le, _, _ = strings.Cut(le, `"`)
			bound, err := strconv.ParseFloat(le, 64)
			if err != nil { // +Inf
				bound = math.Inf(1)
			}
			n, _ := strconv.ParseFloat(v, 64)
			server[bound] = n
		}
	}
	return alloc, gcs, pause, server
}

// serverQuantile is the upper bound of the bucket of the histogram h
// (cumulative counts by upper bound) that holds quantile q.
func serverQuantile(h map[float64]float64, q float64) string {
	bounds := slices.Sorted(maps.Keys(h))
	if len(bounds) == 0 || h[bounds[len(bounds)-1]] == 0 {
		return "-"
	}
	total := h[bounds[len(bounds)-1]]
	for _, b := range bounds {
		if h[b] >= q*total {
			return fmt.Sprintf("<= %s", ms(time.Duration(b*float64(time.Second))))
		}
	}
	return "-"
}

func TestKubeletShapedProcess(t *testing.T) {
	if !enabled() {
		t.Skip("set EPHEMERA_BENCH=1 (or pass -bench) to measure")
	}
	requireRoot(t)
	n, conc, rounds := envInt("EPHEMERA_BENCH_KUBELET_N", 200), envInt("EPHEMERA_BENCH_CONC", 16), envInt("EPHEMERA_BENCH_ROUNDS", 10)
	base := shortTempDir(t, "ephemera-kp")
	drivers := []*procDriver{startScratch(t, "ephemera", driverBinary(t), filepath.Join(base, "d"), "EPHEMERA_BENCH_DRIVER_ARGS")}
	if bin := os.Getenv("EPHEMERA_BENCH_BASELINE_BIN"); bin != "" {
		// A second scratch binary (an older build) in the same rounds: the
		// before/after of a change, measured on the same machine state.
		drivers = append(drivers, startScratch(t, "baseline", bin, filepath.Join(base, "b"), "EPHEMERA_BENCH_BASELINE_ARGS"))
	}
	stl := startStateless(t, filepath.Join(base, "s"))
	drivers = append(drivers, stl)
	t.Cleanup(func() {
		if dir := os.Getenv("EPHEMERA_BENCH_KEEP"); dir != "" {
			for _, p := range drivers {
				if b, err := os.ReadFile(p.log); err == nil {
					_ = os.WriteFile(filepath.Join(dir, p.name+".log"), b, 0o644)
				}
			}
		}
	})

	ctx := t.Context()
	for _, p := range drivers { // warm-up, not counted
		if _, _, _, err := p.cycles(ctx, n/4, conc); err != nil {
			t.Fatalf("warm-up %s: %v", p.name, err)
		}
	}
	res := map[*procDriver]*procResult{}
	for _, p := range drivers {
		res[p] = &procResult{}
	}
	for r := range rounds {
		// Each driver in each position of the order alike: rotated, and
		// reversed every other round.
		order := slices.Clone(drivers)
		order = append(order[r/2%len(order):], order[:r/2%len(order)]...)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, p := range order {
			alloc0, gcs0, _, server0 := goStats(t, p)
			cpu0, client0 := cpuTime(t, p.pid), selfCPU()
			wall, pub, unpub, err := p.cycles(ctx, n, conc)
			if err != nil {
				t.Fatalf("round %d, %s: %v", r, p.name, err)
			}
			pr := res[p]
			pr.cpu += cpuTime(t, p.pid) - cpu0
			pr.client += selfCPU() - client0
			alloc1, gcs1, pause, server1 := goStats(t, p)
			pr.alloc += alloc1 - alloc0
			pr.gcs += gcs1 - gcs0
			pr.gcPause = max(pr.gcPause, pause)
			if pr.server == nil {
				pr.server = map[float64]float64{}
			}
			for b, n := range server1 {
				pr.server[b] += n - server0[b]
			}
			pr.add(wall, n, pub, unpub)
		}
	}
	for _, r := range res {
		slices.Sort(r.pub)
		slices.Sort(r.unpub)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "kubelet-shaped load, out of process: %d tmpfs volumes x %d rounds, concurrency %d, alternated; a cycle = mkdir, 2x NodeGetCapabilities + NodePublishVolume, NodeUnpublishVolume, rmdir (a new connection per RPC)\n", n, rounds, conc)
	fmt.Fprintf(&b, "  %-10s %10s %12s %12s %12s %12s %12s %12s %12s %10s\n", "", "cycles/s", "publish p50", "publish p99", "unpub p50", "unpub p99", "CPU/cycle", "client CPU", "alloc/cycle", "GC/1000")
	for _, p := range drivers {
		r := res[p]
		allocs, gcs := "-", "-"
		if p.metrics != "" {
			allocs, gcs = fmt.Sprintf("%.1f KiB", r.alloc/float64(r.n)/1024), fmt.Sprintf("%.1f", r.gcs*1000/float64(r.n))
		}
		fmt.Fprintf(&b, "  %-10s %10.0f %12s %12s %12s %12s %12s %12s %12s %10s\n", p.name, r.perSecond(),
			ms(pct(r.pub, 0.5)), ms(pct(r.pub, 0.99)), ms(pct(r.unpub, 0.5)), ms(pct(r.unpub, 0.99)),
			ms(r.cpu/time.Duration(r.n)), ms(r.client/time.Duration(r.n)), allocs, gcs)
	}
	s := res[stl]
	for _, p := range drivers[:len(drivers)-1] {
		d := res[p]
		thr, p99 := d.perSecond()/s.perSecond(), ratio(pct(d.pub, 0.99), pct(s.pub, 0.99))
		fmt.Fprintf(&b, "  %s/stateless: throughput %.2fx (target >= 0.9: %s), publish p99 %.2fx (target <= 1.2: %s), publish p50 %.2fx, unpublish p50 %.2fx, p99 %.2fx, driver CPU per cycle %.2fx\n",
			p.name, thr, met(thr >= 0.9), p99, met(p99 <= 1.2), ratio(pct(d.pub, 0.5), pct(s.pub, 0.5)),
			ratio(pct(d.unpub, 0.5), pct(s.unpub, 0.5)), ratio(pct(d.unpub, 0.99), pct(s.unpub, 0.99)), ratio(d.cpu, s.cpu))
	}
	// Where the publish tail comes from: the handler's own time (the
	// interceptor's histogram) against what the client saw, and the longest
	// GC pause. A handler p99 far below the client's puts the tail outside
	// the handler: the new connection per RPC and the scheduling of the
	// client's and the driver's goroutines on the machine's cores.
	for _, p := range drivers[:len(drivers)-1] {
		d := res[p]
		fmt.Fprintf(&b, "  %s publish tail: client p50 %s p99 %s; in the handler p50 %s p99 %s; longest GC pause %s\n", p.name,
			ms(pct(d.pub, 0.5)), ms(pct(d.pub, 0.99)), serverQuantile(d.server, 0.5), serverQuantile(d.server, 0.99),
			ms(time.Duration(d.gcPause*float64(time.Second))))
	}
	t.Log("\n" + b.String())

	if dir := os.Getenv("EPHEMERA_BENCH_PROFILE"); dir != "" {
		profileProcess(t, dir, n, conc, filepath.Join(base, "p"))
	}
	if os.Getenv("EPHEMERA_BENCH_STRACE") == "0" {
		return
	}
	syscallBudget(t, n, conc, drivers)
}

// profileProcess builds the scratch driver with the pprof tag
// (drivers/scratch/pprof.go: net/http/pprof on EPHEMERA_PPROF_ADDR, never in
// a shipped binary), runs it below base, and profiles it (CPU for 10 s of
// cycles, then the heap allocations of those cycles), writing the profiles
// to dir and logging the top of each.
func profileProcess(t *testing.T, dir string, n, conc int, base string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "ephemera-scratch-pprof")
	tags := "pprof"
	if gt := os.Getenv("EPHEMERA_GOTAGS"); gt != "" {
		tags = gt + ",pprof"
	}
	if out, err := exec.Command("go", "build", "-trimpath", "-tags", tags, "-o", bin, "../../drivers/scratch").CombinedOutput(); err != nil {
		t.Fatalf("go build -tags %s: %v\n%s", tags, err, out)
	}
	addr := freeAddr(t)
	t.Setenv("EPHEMERA_PPROF_ADDR", addr) // the driver process's environment
	p := startScratch(t, "profiled", bin, base, "EPHEMERA_BENCH_DRIVER_ARGS")
	ctx := t.Context()
	if _, _, _, err := p.cycles(ctx, n/4, conc); err != nil { // warm-up
		t.Fatal(err)
	}
	get := func(path, file string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		f, err := os.Create(filepath.Join(dir, file))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := io.Copy(f, resp.Body); err != nil {
			t.Fatal(err)
		}
	}
	get("/debug/pprof/allocs", "allocs-before.pprof")
	done := make(chan struct{})
	go func() {
		defer close(done)
		get("/debug/pprof/profile?seconds=10", "cpu.pprof")
	}()
	cycles := 0
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); cycles += n {
		if _, _, _, err := p.cycles(ctx, n, conc); err != nil {
			t.Fatal(err)
		}
	}
	<-done
	get("/debug/pprof/allocs", "allocs.pprof")
	for _, args := range [][]string{
		{"-top", "-nodecount=40", bin, filepath.Join(dir, "cpu.pprof")},
		{"-top", "-cum", "-nodecount=60", bin, filepath.Join(dir, "cpu.pprof")},
		{"-top", "-sample_index=alloc_space", "-base", filepath.Join(dir, "allocs-before.pprof"), "-nodecount=30", bin, filepath.Join(dir, "allocs.pprof")},
	} {
		out, err := exec.Command("go", append([]string{"tool", "pprof"}, args...)...).CombinedOutput()
		if err != nil {
			t.Logf("pprof %v: %v\n%s", args, err, out)
			continue
		}
		t.Logf("driver process, %d cycles at concurrency %d, pprof %s:\n%s", cycles, conc, strings.Join(args[:len(args)-2], " "), out)
	}
}

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

// syscallBudget runs one untimed round of n cycles of each driver under
// strace -c -f, attached to the driver process before the round and detached
// after it, and logs the syscalls per cycle of each (the last is the
// stateless reference).
func syscallBudget(t *testing.T, n, conc int, drivers []*procDriver) {
	t.Helper()
	strace, err := exec.LookPath("strace")
	if err != nil {
		t.Logf("syscall budget: skipped, no strace in PATH (%v); install strace for the syscalls per cycle", err)
		return
	}
	counts := make([]map[string]int, len(drivers))
	for i, p := range drivers {
		c, err := straceRound(t, strace, p, n, conc)
		if err != nil {
			t.Fatalf("syscall budget of %s: %v", p.name, err)
		}
		counts[i] = c
	}
	d, s := counts[0], counts[len(counts)-1]
	names := map[string]bool{}
	for _, c := range counts {
		for k := range c {
			names[k] = true
		}
	}
	list := make([]string, 0, len(names))
	for k := range names {
		if k != "total" {
			list = append(list, k)
		}
	}
	// The largest differences first, then the largest counts.
	slices.SortFunc(list, func(a, b string) int {
		da, db := abs(d[a]-s[a]), abs(d[b]-s[b])
		if da != db {
			return db - da
		}
		if d[a]+s[a] != d[b]+s[b] {
			return d[b] + s[b] - d[a] - s[a]
		}
		return strings.Compare(a, b)
	})
	per := func(x int) string { return strconv.FormatFloat(float64(x)/float64(n), 'f', 1, 64) }
	var b strings.Builder
	fmt.Fprintf(&b, "syscall budget (untimed, strace -c -f of each driver process over %d cycles at concurrency %d): syscalls per cycle\n", n, conc)
	row := func(name string) {
		fmt.Fprintf(&b, "  %-18s", name)
		for _, c := range counts {
			fmt.Fprintf(&b, " %10s", per(c[name]))
		}
		fmt.Fprintf(&b, " %+10.1f\n", float64(d[name]-s[name])/float64(n))
	}
	fmt.Fprintf(&b, "  %-18s", "")
	for _, p := range drivers {
		fmt.Fprintf(&b, " %10s", p.name)
	}
	fmt.Fprintf(&b, " %10s\n", "difference")
	row("total")
	rows := 0
	for _, k := range list {
		if rows < 30 && slices.ContainsFunc(counts, func(c map[string]int) bool { return c[k] >= n/10 }) {
			row(k)
			rows++
		}
	}
	t.Log("\n" + b.String())
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// straceRound attaches strace -c -f to p's process (all its threads), runs n
// cycles, detaches and returns the calls per syscall name (and "total").
func straceRound(t *testing.T, strace string, p *procDriver, n, conc int) (map[string]int, error) {
	out := filepath.Join(t.TempDir(), p.name+".strace")
	cmd := exec.Command(strace, "-c", "-f", "-o", out, "-p", strconv.Itoa(p.pid))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		_ = cmd.Process.Signal(syscall.SIGINT) // detach and write the summary
		return cmd.Wait()
	}
	defer stop()
	if err := waitTraced(p.pid, cmd.Process.Pid, 10*time.Second); err != nil {
		return nil, fmt.Errorf("%w; strace: %s", err, stderr.String())
	}
	// Under strace everything is slower; no RPC may time out for it.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	if _, _, _, err := p.cycles(ctx, n, conc); err != nil {
		return nil, err
	}
	if err := stop(); err != nil {
		if ee := (*exec.ExitError)(nil); !errors.As(err, &ee) {
			return nil, fmt.Errorf("strace: %w: %s", err, stderr.String())
		}
	}
	return parseStraceSummary(out)
}

// waitTraced waits until every thread of pid is traced by tracer.
func waitTraced(pid, tracer int, timeout time.Duration) error {
	want := "TracerPid:\t" + strconv.Itoa(tracer)
	for deadline := time.Now().Add(timeout); ; {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			return err
		}
		all := len(tasks) > 0
		for _, task := range tasks {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/status", pid, task.Name()))
			if err != nil || !strings.Contains(string(b), want) {
				all = false
				break
			}
		}
		if all {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("strace did not attach to every thread of %d within %v", pid, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// parseStraceSummary reads strace -c's table: "% time seconds usecs/call
// calls [errors] syscall" rows between dashed lines, then the total row.
func parseStraceSummary(path string) (map[string]int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	counts := map[string]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		cols := strings.Fields(sc.Text())
		if len(cols) < 5 || strings.HasPrefix(cols[0], "-") || cols[0] == "%" {
			continue
		}
		calls, err := strconv.Atoi(cols[3])
		if err != nil {
			continue
		}
		counts[cols[len(cols)-1]] += calls
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if counts["total"] == 0 {
		return nil, fmt.Errorf("no strace summary in %s", path)
	}
	return counts, nil
}
