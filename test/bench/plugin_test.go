//go:build linux

package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/drivers/tmpfs"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/plugin"
	"github.com/ephemera-csi/ephemera/framework/pluginserver"
)

// The plugin overhead (issue 12): the kubelet-shaped cycles of
// TestKubeletShaped against one driver whose volumes are tmpfs with content,
// provided three ways, alternated round by round in one run:
//
//   - in-process: the tmpfs backend and an in-process ContentProvider
//     (Options.Content);
//   - plugin: the tmpfs backend and the same content served by a plugin in its
//     own process (pluginserver with Backend and Content; per publish
//     Validate, Create and Content cross the socket, per unpublish Delete);
//   - content-only: the driver's tmpfs and the plugin's Content (pluginserver
//     with Content only; one Content call per publish, nothing at unpublish),
//     the common shape of a plugin;
//   - intent: in process as the first, but the tmpfs backend without Finder
//     and MountOnly, which the backend of a plugin that creates storage does
//     not have either: its records are durable (fdatasync) instead of
//     relaxed, and a first publish writes an intent record before Create
//     (docs/design.md, needsIntent and "Durability"). The plugin row's
//     distance to this row is what crossing the socket costs; its distance
//     to in-process adds that store policy. A content-only plugin's backend
//     is a Finder and MountOnly (its volumes are the driver's tmpfs): its
//     distance to in-process is the socket alone.
//
// The plugins are this test binary re-executed (TestMain, EPHEMERA_BENCH_PLUGIN),
// killed at cleanup. The driver is the same for all three (one bbolt file),
// selected per volume by the "backend" attribute.
//
//	EPHEMERA_BENCH=1 go test -run TestPluginOverhead -v ./test/bench/
//
// EPHEMERA_BENCH_KUBELET_N (default 200 volumes per round), EPHEMERA_BENCH_CONC
// (16; concurrency 1 runs too), EPHEMERA_BENCH_ROUNDS (8: each kind in each
// position of the order twice).

// The child process's environment: which plugin to serve, and where.
const (
	pluginModeEnv   = "EPHEMERA_BENCH_PLUGIN"
	pluginSocketEnv = "EPHEMERA_BENCH_PLUGIN_SOCKET"
)

// Plugin modes (pluginModeEnv) and the kinds of TestPluginOverhead.
const (
	kindInProcess   = "in-process"
	kindPlugin      = "plugin"       // backend and content in the plugin
	kindContentOnly = "content-only" // content in the plugin, the driver's tmpfs
	kindIntent      = "intent"       // in process, without Finder and MountOnly
)

// backendOf is the driver's backend name for each kind.
var backendOf = map[string]string{kindInProcess: "tmpfs", kindPlugin: "plugin", kindContentOnly: "plugin-content", kindIntent: "tmpfs-intent"}

// pluginKinds are the kinds of TestPluginOverhead, the reference first.
var pluginKinds = []string{kindInProcess, kindPlugin, kindContentOnly, kindIntent}

// intentTmpfs is the tmpfs backend as the framework sees the backend of a
// plugin that creates storage: a Validator without Finder and MountOnly, so
// that its records are durable and a first publish writes an intent record.
type intentTmpfs struct{ b *tmpfs.Backend }

func (t intentTmpfs) Validate(v *api.Volume) error { return t.b.Validate(v) }

func (t intentTmpfs) Create(ctx context.Context, v *api.Volume) (api.Source, error) {
	return t.b.Create(ctx, v)
}

func (t intentTmpfs) Delete(ctx context.Context, v *api.Volume) error { return t.b.Delete(ctx, v) }

func TestMain(m *testing.M) {
	if mode := os.Getenv(pluginModeEnv); mode != "" {
		os.Exit(servePlugin(mode, os.Getenv(pluginSocketEnv)))
	}
	if sock := os.Getenv(statelessEnv); sock != "" {
		os.Exit(serveStatelessProcess(sock)) // TestKubeletShapedProcess
	}
	os.Exit(m.Run())
}

// servePlugin is the plugin process: the tmpfs backend (kindPlugin) and
// benchContent through pluginserver until SIGTERM, or a worst-answer plugin
// (worstModePrefix).
func servePlugin(mode, sock string) int {
	if shape, ok := strings.CutPrefix(mode, worstModePrefix); ok {
		return serveWorstContent(shape, sock) // TestDriverContentMemory
	}
	if mode == generationsMode {
		return serveGenerations(sock) // TestDriverPodMemory
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	opts := pluginserver.Options{
		Name: "bench-" + mode, Version: "bench", Endpoint: "unix://" + sock,
		Content: framework.ContentFunc(benchContent),
	}
	if mode == kindPlugin {
		mem, err := tmpfs.New(tmpfs.Options{})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		opts.Backend = mem
	}
	if err := pluginserver.Serve(ctx, opts); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// benchCA stands for a CA bundle: 1.5 KiB.
var benchCA = bytes.Repeat([]byte("MIIEpAIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gunVTLw7onLRnrq0/IzW7yWR7QkrmBL7jTKEn5u+qKhbwKfBstIs+bMY2Zkp18gnTxKLxoS2tFczGkPLPgizskuemMghRniWaoLcyehkd3qqGElvW/VDL5AaWTg0nLVkjRo9z+40RQzuVaE8AkAFmxZzow3x+VJYKdjykkJ0iT9wCS0DRTXu269V264Vf/3jvredZiKRkgwlL9xNAwxXFg0x/XFw005UWVRIkdgcKWTjpBP2dPwVZ4WWC+9aGVd+Gyn1o0CLelf4rEjGoXbAAEgAqeGUxrcIlbjXfbcmw\n"), 6)

// benchContent is every volume's content in TestPluginOverhead, in process and
// in the plugin: a per-pod token, a CA bundle and a small config, 2.2 KiB in
// three files, as a token or certificate provider writes.
func benchContent(_ context.Context, v *api.Volume) (map[string]api.File, error) {
	token := fmt.Appendf(nil, "%s.%s.%s.", v.Pod.Namespace, v.Pod.Name, v.Pod.UID)
	token = append(token, bytes.Repeat([]byte{'x'}, 600-len(token)%600)...)
	return map[string]api.File{
		"token":       {Data: token, Mode: 0o600},
		"ca.crt":      {Data: benchCA},
		"config.json": {Data: fmt.Appendf(nil, `{"volume":%q,"audience":"bench"}`+"\n", v.ID)},
	}, nil
}

// pluginEnv is one driver with the three backends of TestPluginOverhead and
// Options.Content for the in-process one, plus the two plugin processes.
type pluginEnv struct {
	h     *drivertest.Harness
	base  string
	loads map[string]cycleLoad
}

func newPluginEnv(tb testing.TB) *pluginEnv {
	tb.Helper()
	base := tb.TempDir()
	logAsShipped(tb, base)
	tb.Cleanup(func() {
		if err := unmountAllUnder(base); err != nil {
			tb.Errorf("cleaning mounts: %v", err)
		}
	})
	// Not below TempDir: a unix socket path has at most 107 bytes.
	sockDir, err := os.MkdirTemp("", "ephemera-plugin")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(sockDir) })
	const driverName = "bench.csi.ephemera.dev"
	mem, err := tmpfs.New(tmpfs.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	backends := map[string]framework.Backend{backendOf[kindInProcess]: mem, backendOf[kindIntent]: intentTmpfs{mem}}
	for _, mode := range []string{kindPlugin, kindContentOnly} {
		sock := filepath.Join(sockDir, mode+".sock")
		startPlugin(tb, mode, sock, filepath.Join(base, "plugin-"+mode+".log"))
		p, err := plugin.New(plugin.Options{
			Name: backendOf[mode], Endpoint: "unix://" + sock,
			DriverName: driverName, NodeID: "node-1", Logger: klog.Background(),
		})
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { p.Close() })
		backends[backendOf[mode]] = p
	}
	h := drivertest.Start(tb, framework.Options{
		DriverName: driverName,
		Backends:   backends,
		Content:    framework.ContentFunc(benchContent),
		Node: framework.NodeOptions{
			KubeletRootDir: filepath.Join(base, "kubelet"),
			StateDir:       filepath.Join(base, "state"),
		},
		Volumes:       framework.VolumeOptions{DefaultBackend: "tmpfs"},
		State:         framework.StateOptions{Store: benchStore()},
		Observability: framework.ObservabilityOptions{Logger: klog.Background()},
	})
	e := &pluginEnv{h: h, base: base, loads: map[string]cycleLoad{}}
	for kind, backend := range backendOf {
		e.loads[kind] = cycleLoad{k: h.Kubelet, attrs: map[string]string{api.ParamBackend: backend, api.ParamSize: strconv.Itoa(volSize)}}
	}
	return e
}

// startPlugin runs this binary as the plugin of mode on sock, its output in
// logPath, and waits for its socket. The process is killed at cleanup (and by
// the kernel if the test process dies first).
func startPlugin(tb testing.TB, mode, sock, logPath string) {
	tb.Helper()
	log, err := os.Create(logPath)
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), pluginModeEnv+"="+mode, pluginSocketEnv+"="+sock)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		tb.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	tb.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		log.Close()
	})
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, err := os.Stat(sock); err == nil {
			return
		}
		select {
		case <-exited:
			b, _ := os.ReadFile(logPath)
			tb.Fatalf("plugin %s exited before serving: %s\n%s", mode, cmd.ProcessState, b)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			tb.Fatalf("plugin %s: no socket at %s after 10s", mode, sock)
		}
	}
}

// checkContent publishes one volume of kind, checks that it holds
// benchContent and deletes the pod.
func (e *pluginEnv) checkContent(ctx context.Context, kind string) error {
	l := e.loads[kind]
	pod := l.k.NewPod("check", kind)
	if err := l.k.Publish(ctx, pod, drivertest.InlineVolume{Name: "data", Attributes: l.attrs}); err != nil {
		return err
	}
	defer l.k.DeletePod(ctx, pod)
	want, _ := benchContent(ctx, &api.Volume{ID: api.VolumeHandle(pod.UID, "data"), Pod: api.Pod{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}})
	for name, f := range want {
		got, err := os.ReadFile(filepath.Join(l.k.TargetPath(pod, "data"), name))
		if err != nil {
			return err
		}
		if !bytes.Equal(got, f.Data) {
			return fmt.Errorf("%s: %s holds %d bytes, not the %d of benchContent", kind, name, len(got), len(f.Data))
		}
	}
	return nil
}

func TestPluginOverhead(t *testing.T) {
	if !enabled() {
		t.Skip("set EPHEMERA_BENCH=1 (or pass -bench) to measure")
	}
	requireRoot(t)
	kinds := pluginKinds
	n, rounds := envInt("EPHEMERA_BENCH_KUBELET_N", 200), envInt("EPHEMERA_BENCH_ROUNDS", 2*len(kinds))
	concs := slices.Compact([]int{1, envInt("EPHEMERA_BENCH_CONC", 16)})
	e := newPluginEnv(t)
	ctx := t.Context()
	began := time.Now()

	for _, kind := range kinds {
		if err := e.checkContent(ctx, kind); err != nil {
			t.Fatalf("content of a %s volume: %v", kind, err)
		}
		// A warm-up of each, not counted.
		if _, _, _, err := e.loads[kind].cycles(ctx, n/4, 16); err != nil {
			t.Fatalf("warm-up %s: %v", kind, err)
		}
	}
	var b strings.Builder
	for _, conc := range concs {
		res := map[string]*cycleResult{}
		for _, kind := range kinds {
			res[kind] = &cycleResult{}
		}
		for r := range rounds {
			// Rotated, and reversed every other round: over 2 x len(kinds)
			// rounds each kind runs in each position twice.
			k := r / 2 % len(kinds)
			order := append(slices.Clone(kinds[k:]), kinds[:k]...)
			if r%2 == 1 {
				slices.Reverse(order)
			}
			for _, kind := range order {
				wall, pub, unpub, err := e.loads[kind].cycles(ctx, n, conc)
				if err != nil {
					t.Fatalf("concurrency %d, round %d, %s: %v", conc, r, kind, err)
				}
				res[kind].add(wall, n, pub, unpub)
			}
		}
		for _, r := range res {
			slices.Sort(r.pub)
			slices.Sort(r.unpub)
		}
		printPluginOverhead(&b, n, rounds, conc, kinds, res)
	}
	if ms, err := mountsUnder(e.base); err != nil || len(ms) > 0 {
		t.Errorf("mounts left after the run (err %v): %v", err, ms)
	}
	fmt.Fprintf(&b, "%s, %d CPUs; run took %v\n", cpuModel(), runtime.NumCPU(), time.Since(began).Round(time.Second))
	t.Log("\n" + b.String())
}

func printPluginOverhead(b *strings.Builder, n, rounds, conc int, kinds []string, res map[string]*cycleResult) {
	fmt.Fprintf(b, "plugin overhead, kubelet-shaped load: %d tmpfs volumes with content (3 files, 2.2 KiB) x %d rounds, concurrency %d, alternated; a cycle = new pod, publish (3 RPCs, 3 connections), delete the pod\n", n, rounds, conc)
	fmt.Fprintf(b, "  %-12s %12s %12s %12s %12s %12s\n", "", "cycles/s", "publish p50", "publish p99", "unpub p50", "unpub p99")
	for _, kind := range kinds {
		r := res[kind]
		fmt.Fprintf(b, "  %-12s %12.0f %12s %12s %12s %12s\n", kind, r.perSecond(),
			ms(pct(r.pub, 0.5)), ms(pct(r.pub, 0.99)), ms(pct(r.unpub, 0.5)), ms(pct(r.unpub, 0.99)))
	}
	for _, c := range []struct{ kind, ref, target string }{
		{kindPlugin, kindInProcess, " (target <= 1ms)"}, {kindContentOnly, kindInProcess, " (target <= 1ms)"},
		{kindPlugin, kindIntent, ""}, {kindContentOnly, kindIntent, ""},
	} {
		r, in := res[c.kind], res[c.ref]
		if r == nil || in == nil {
			continue
		}
		fmt.Fprintf(b, "  %s - %s: publish p50 %s%s, p99 %s; unpublish p50 %s, p99 %s\n", c.kind, c.ref,
			msDelta(pct(r.pub, 0.5)-pct(in.pub, 0.5)), c.target, msDelta(pct(r.pub, 0.99)-pct(in.pub, 0.99)),
			msDelta(pct(r.unpub, 0.5)-pct(in.unpub, 0.5)), msDelta(pct(r.unpub, 0.99)-pct(in.unpub, 0.99)))
		fmt.Fprintf(b, "  %s / %s: publish p50 %.2fx, p99 %.2fx; unpublish p50 %.2fx, p99 %.2fx; throughput %.2fx\n", c.kind, c.ref,
			ratio(pct(r.pub, 0.5), pct(in.pub, 0.5)), ratio(pct(r.pub, 0.99), pct(in.pub, 0.99)),
			ratio(pct(r.unpub, 0.5), pct(in.unpub, 0.5)), ratio(pct(r.unpub, 0.99), pct(in.unpub, 0.99)),
			r.perSecond()/in.perSecond())
	}
	b.WriteString("\n")
}

// msDelta is a signed difference in milliseconds.
func msDelta(d time.Duration) string {
	return fmt.Sprintf("%+.3fms", float64(d)/float64(time.Millisecond))
}

// BenchmarkPluginPublish runs TestPluginOverhead's cycles at concurrency 1 as
// Go benchmarks: one op is one cycle (new pod, publish, delete the pod); the
// latency percentiles are extra metrics.
func BenchmarkPluginPublish(b *testing.B) {
	requireRoot(b)
	e := newPluginEnv(b)
	ctx := context.Background()
	for _, kind := range pluginKinds {
		b.Run(kind, func(b *testing.B) {
			_, pub, unpub, err := e.loads[kind].cycles(ctx, b.N, 1)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(us(pct(pub, .5)), "pub-p50-µs")
			b.ReportMetric(us(pct(pub, .99)), "pub-p99-µs")
			b.ReportMetric(us(pct(unpub, .5)), "unpub-p50-µs")
			b.ReportMetric(us(pct(unpub, .99)), "unpub-p99-µs")
		})
	}
}
