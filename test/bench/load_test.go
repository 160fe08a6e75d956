//go:build linux

package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/store"
	"github.com/ephemera-csi/ephemera/framework/store/memstore"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/drivers/dir"
	"github.com/ephemera-csi/ephemera/drivers/loop"
	"github.com/ephemera-csi/ephemera/drivers/tmpfs"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/drivertest"
)

// volSize is the "size" of every tmpfs volume, and the size= of the floor's.
const volSize = 16 << 20

// enabled reports whether the latency table should run: EPHEMERA_BENCH=1 or
// go test -bench.
func enabled() bool {
	if os.Getenv("EPHEMERA_BENCH") == "1" {
		return true
	}
	f := flag.Lookup("test.bench")
	return f != nil && f.Value.String() != ""
}

func requireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root: mounts tmpfs and bind mounts")
	}
}

// workload is one publish/unpublish pattern over n volumes numbered 0..n-1.
// setup and done are not timed (the kubelet creating and removing pod
// directories); publish and unpublish are.
type workload interface {
	setup(i int) error
	publish(ctx context.Context, i int) error
	unpublish(ctx context.Context, i int) error
	done(i int) error
}

// sample is the outcome of one measured run.
type sample struct {
	pub, unpub         []time.Duration // sorted
	pubWall, unpubWall time.Duration
}

// merge returns the union of two samples (sorted) with their wall times added.
func (s sample) merge(o sample) sample {
	pub, unpub := slices.Concat(s.pub, o.pub), slices.Concat(s.unpub, o.unpub)
	slices.Sort(pub)
	slices.Sort(unpub)
	return sample{pub: pub, unpub: unpub, pubWall: s.pubWall + o.pubWall, unpubWall: s.unpubWall + o.unpubWall}
}

// measure runs w over n volumes with conc workers in phases: set up all, publish
// all, unpublish all, finish all. Publishing everything before unpublishing
// lets the mount table grow to n entries, as on a busy node.
func measure(ctx context.Context, w workload, n, conc int) (sample, error) {
	var s sample
	if err := parallel(n, conc, func(i int) error { return w.setup(i) }); err != nil {
		return s, fmt.Errorf("setup: %w", err)
	}
	s.pub = make([]time.Duration, n)
	start := time.Now()
	err := parallel(n, conc, func(i int) error {
		t0 := time.Now()
		err := w.publish(ctx, i)
		s.pub[i] = time.Since(t0)
		return err
	})
	s.pubWall = time.Since(start)
	if err != nil {
		return s, fmt.Errorf("publish: %w", err)
	}
	s.unpub = make([]time.Duration, n)
	start = time.Now()
	err = parallel(n, conc, func(i int) error {
		t0 := time.Now()
		err := w.unpublish(ctx, i)
		s.unpub[i] = time.Since(t0)
		return err
	})
	s.unpubWall = time.Since(start)
	if err != nil {
		return s, fmt.Errorf("unpublish: %w", err)
	}
	if err := parallel(n, conc, func(i int) error { return w.done(i) }); err != nil {
		return s, fmt.Errorf("cleanup: %w", err)
	}
	slices.Sort(s.pub)
	slices.Sort(s.unpub)
	return s, nil
}

// parallel calls f(0..n-1) on conc workers and returns the first error; after
// an error no new indexes are started.
func parallel(n, conc int, f func(i int) error) error {
	var (
		next   atomic.Int64
		failed atomic.Bool
		mu     sync.Mutex
		first  error
		wg     sync.WaitGroup
	)
	for range min(conc, n) {
		wg.Go(func() {
			for !failed.Load() {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					mu.Lock()
					if first == nil {
						first = fmt.Errorf("volume %d: %w", i, err)
					}
					mu.Unlock()
					failed.Store(true)
				}
			}
		})
	}
	wg.Wait()
	return first
}

// pct returns the q-quantile (0 < q <= 1) of sorted durations (nearest rank).
func pct(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(i, 0)]
}

// driverLoad publishes one inline volume per pod through the kubelet simulator:
// per publish a fresh gRPC connection for each of NodeGetCapabilities x2 and
// NodePublishVolume, plus vol_data.json; per unpublish NodeUnpublishVolume and
// the kubelet's removeMountDir.
type driverLoad struct {
	k     *drivertest.Kubelet
	attrs map[string]string
	pods  []*drivertest.Pod
}

func newDriverLoad(k *drivertest.Kubelet, backend string, n int) *driverLoad {
	attrs := map[string]string{api.ParamBackend: backend}
	if backend != "dir" {
		attrs[api.ParamSize] = strconv.Itoa(volSize)
	}
	return &driverLoad{k: k, attrs: attrs, pods: make([]*drivertest.Pod, n)}
}

func (l *driverLoad) setup(i int) error {
	l.pods[i] = l.k.NewPod("bench", "pod-"+strconv.Itoa(i))
	return nil
}

func (l *driverLoad) publish(ctx context.Context, i int) error {
	return l.k.Publish(ctx, l.pods[i], drivertest.InlineVolume{Name: "data", Attributes: l.attrs})
}

func (l *driverLoad) unpublish(ctx context.Context, i int) error {
	return l.k.Unpublish(ctx, l.pods[i], "data")
}

func (l *driverLoad) done(i int) error { return l.k.DeletePod(context.Background(), l.pods[i]) }

// rpcLoad sends only NodePublishVolume / NodeUnpublishVolume, kubelet-exact,
// on one long-lived connection: the driver's share of driverLoad without the
// kubelet's dials, NodeGetCapabilities calls and vol_data.json. Pod
// directories and requests are prepared in setup.
type rpcLoad struct {
	k    *drivertest.Kubelet // a second simulator on the driver's kubelet root
	node csi.NodeClient
	vol  drivertest.InlineVolume
	pods []*drivertest.Pod
	reqs []*csi.NodePublishVolumeRequest
}

func newRPCLoad(h *drivertest.Harness, backend string, n int) *rpcLoad {
	k := drivertest.NewKubelet(drivertest.KubeletOptions{
		Root: h.Options.Node.KubeletRootDir, Endpoint: h.Options.Node.Endpoint,
		DriverName: h.Options.DriverName, NodeName: h.Options.Node.ID,
	})
	return &rpcLoad{
		k: k, node: h.Node,
		vol:  drivertest.InlineVolume{Name: "data", Attributes: newDriverLoad(k, backend, 0).attrs},
		pods: make([]*drivertest.Pod, n), reqs: make([]*csi.NodePublishVolumeRequest, n),
	}
}

func (l *rpcLoad) setup(i int) error {
	l.pods[i] = l.k.NewPod("rpc", "pod-"+strconv.Itoa(i))
	l.reqs[i] = l.k.PublishRequest(l.pods[i], l.vol)
	return os.MkdirAll(filepath.Dir(l.reqs[i].TargetPath), 0o750)
}

func (l *rpcLoad) publish(ctx context.Context, i int) error {
	_, err := l.node.NodePublishVolume(ctx, l.reqs[i])
	return err
}

func (l *rpcLoad) unpublish(ctx context.Context, i int) error {
	_, err := l.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: l.reqs[i].VolumeId, TargetPath: l.reqs[i].TargetPath})
	return err
}

// done removes the pod directory; unpublish removed the target, so nothing
// below it is mounted.
func (l *rpcLoad) done(i int) error { return os.RemoveAll(l.k.PodDir(l.pods[i])) }

// floorLoad is the raw syscall floor: the same observable result as the driver
// without it. tmpfs: mkdir target + mount tmpfs (nosuid,nodev,size=,mode=);
// umount + rmdir. bind: mkdir+chmod source + mkdir target + bind mount + remount
// nosuid,nodev; umount + rmdir target + rmdir source. The parent of the target
// exists beforehand, as the kubelet creates it.
type floorLoad struct {
	root string
	bind bool
}

func (l *floorLoad) parent(i int) string { return filepath.Join(l.root, "pods", strconv.Itoa(i)) }
func (l *floorLoad) target(i int) string { return filepath.Join(l.parent(i), "mount") }
func (l *floorLoad) source(i int) string { return filepath.Join(l.root, "src", strconv.Itoa(i)) }

func (l *floorLoad) setup(i int) error {
	if l.bind {
		if err := os.MkdirAll(filepath.Dir(l.source(i)), 0o700); err != nil {
			return err
		}
	}
	return os.MkdirAll(l.parent(i), 0o750)
}

func (l *floorLoad) publish(_ context.Context, i int) error {
	target := l.target(i)
	if !l.bind {
		if err := unix.Mkdir(target, 0o750); err != nil {
			return err
		}
		return unix.Mount("bench-tmpfs", target, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV,
			"size="+strconv.Itoa(volSize)+",mode=1777")
	}
	src := l.source(i)
	if err := unix.Mkdir(src, 0o700); err != nil {
		return err
	}
	if err := unix.Chmod(src, 0o777); err != nil {
		return err
	}
	if err := unix.Mkdir(target, 0o750); err != nil {
		return err
	}
	if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
		return err
	}
	return unix.Mount("", target, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_NOSUID|unix.MS_NODEV, "")
}

func (l *floorLoad) unpublish(_ context.Context, i int) error {
	target := l.target(i)
	if err := unix.Unmount(target, unix.UMOUNT_NOFOLLOW); err != nil {
		return err
	}
	if err := unix.Rmdir(target); err != nil {
		return err
	}
	if l.bind {
		return unix.Rmdir(l.source(i))
	}
	return nil
}

func (l *floorLoad) done(i int) error { return os.Remove(l.parent(i)) }

// loopFloorLoad is the loop backend without the framework: the backend's own
// Create (backing file, LOOP_CONFIGURE, mkfs.ext4) + mkdir target + mount; umount +
// rmdir + the backend's Delete (detach, remove file). What the driver adds on top
// is the framework's share.
type loopFloorLoad struct {
	floorLoad
	b    *loop.Backend
	vols []*api.Volume
}

func newLoopFloorLoad(root string, n int) (*loopFloorLoad, error) {
	b, err := loop.New(loop.Options{Dir: filepath.Join(root, "files")})
	if err != nil {
		return nil, err
	}
	return &loopFloorLoad{floorLoad: floorLoad{root: root}, b: b, vols: make([]*api.Volume, n)}, nil
}

func (l *loopFloorLoad) setup(i int) error {
	l.vols[i] = &api.Volume{ID: api.VolumeHandle("floor", strconv.Itoa(i)), Size: volSize, Params: api.Params{}}
	if err := l.b.Validate(l.vols[i]); err != nil {
		return err
	}
	return l.floorLoad.setup(i)
}

func (l *loopFloorLoad) publish(ctx context.Context, i int) error {
	src, err := l.b.Create(ctx, l.vols[i])
	if err != nil {
		return err
	}
	target := l.target(i)
	if err := unix.Mkdir(target, 0o750); err != nil {
		return err
	}
	return unix.Mount(src.Path, target, src.FSType, unix.MS_NOSUID|unix.MS_NODEV, "")
}

func (l *loopFloorLoad) unpublish(ctx context.Context, i int) error {
	if err := l.floorLoad.unpublish(ctx, i); err != nil {
		return err
	}
	return l.b.Delete(ctx, l.vols[i])
}

// env is one driver with a tmpfs and a dir backend, real mounter and bbolt
// state (fsync on the root filesystem), plus a directory for the floor.
type env struct {
	h     *drivertest.Harness
	floor string
}

// newEnv starts the driver. Every mount left below its directories is
// unmounted at cleanup, deepest first, before the directories are removed.
func newEnv(tb testing.TB) *env {
	tb.Helper()
	base := tb.TempDir()
	logAsShipped(tb, base)
	tb.Cleanup(func() {
		if err := unmountAllUnder(base); err != nil {
			tb.Errorf("cleaning mounts: %v", err)
		}
	})
	state := filepath.Join(base, "state")
	volumes, err := dir.New(dir.Options{Root: filepath.Join(state, "volumes")})
	if err != nil {
		tb.Fatal(err)
	}
	loops, err := loop.New(loop.Options{Dir: filepath.Join(state, "loop")})
	if err != nil {
		tb.Fatal(err)
	}
	mem, err := tmpfs.New(tmpfs.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	h := drivertest.Start(tb, framework.Options{
		DriverName: "bench.csi.ephemera.dev",
		Backends: map[string]framework.Backend{
			"tmpfs": mem,
			"dir":   volumes,
			"loop":  loops,
		},
		Node: framework.NodeOptions{
			KubeletRootDir: filepath.Join(base, "kubelet"),
			StateDir:       state,
		},
		Volumes: framework.VolumeOptions{DefaultBackend: "tmpfs"},
		State:   framework.StateOptions{Store: benchStore()},
		// As in production: klog at its default verbosity (drivertest would
		// send every request's log lines to t.Log, which is not what is measured).
		Observability: framework.ObservabilityOptions{Logger: klog.Background()},
	})
	return &env{h: h, floor: filepath.Join(base, "floor")}
}

// logAsShipped makes klog log as the shipped manifests run the driver (--v=2,
// EPHEMERA_BENCH_V to change it) into a file, so the driver's logging is part
// of what is measured.
func logAsShipped(tb testing.TB, dir string) {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	v := os.Getenv("EPHEMERA_BENCH_V")
	if v == "" {
		v = "2"
	}
	f, err := os.Create(filepath.Join(dir, "driver.log"))
	if err != nil {
		tb.Fatal(err)
	}
	for name, val := range map[string]string{"v": v, "logtostderr": "false", "alsologtostderr": "false", "stderrthreshold": "FATAL"} {
		if err := fs.Set(name, val); err != nil {
			tb.Fatal(err)
		}
	}
	klog.SetOutput(f)
	tb.Cleanup(func() {
		klog.Flush()
		_ = fs.Set("v", "0")
		f.Close()
	})
}

// Kinds of workload.
const (
	kindDriver = "driver" // kubelet simulator -> driver
	kindRPC    = "rpc"    // NodePublish/NodeUnpublish only, one connection
	kindFloor  = "floor"  // syscalls only
)

// load returns a workload of kind for backend ("tmpfs" or "dir").
func (e *env) load(kind, backend string, n int) workload {
	switch kind {
	case kindFloor:
		if backend == "loop" {
			l, err := newLoopFloorLoad(filepath.Join(e.floor, backend), n)
			if err != nil {
				panic(err) // only for an invalid Dir, which this code builds
			}
			return l
		}
		return &floorLoad{root: filepath.Join(e.floor, backend), bind: backend == "dir"}
	case kindRPC:
		return newRPCLoad(e.h, backend, n)
	}
	return newDriverLoad(e.h.Kubelet, backend, n)
}

// mountsUnder returns the mount points strictly below dir, deepest (and, for
// stacked mounts, most recent) first.
func mountsUnder(dir string) ([]string, error) {
	infos, err := mount.ReadMountInfo()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, mi := range mount.MountsUnder(infos, dir) {
		if mi.MountPoint != dir {
			out = append(out, mi.MountPoint)
		}
	}
	slices.Reverse(out) // mountinfo lists in mount order: later mounts stack on top
	sort.SliceStable(out, func(i, j int) bool {
		return strings.Count(out[i], "/") > strings.Count(out[j], "/")
	})
	return out, nil
}

// unmountAllUnder unmounts everything below dir, deepest first; a busy mount is
// detached lazily so the run never leaves anything mounted.
// shortTempDir is a new directory in the system's temporary directory, not
// below TempDir: a unix socket path in it has at most 107 bytes. Every mount
// left below it is unmounted at cleanup, deepest first, before it is removed.
func shortTempDir(t *testing.T, prefix string) string {
	t.Helper()
	base, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unmountAllUnder(base); err != nil {
			t.Errorf("cleaning mounts: %v", err)
		}
		_ = os.RemoveAll(base)
	})
	return base
}

func unmountAllUnder(dir string) error {
	dir, err := filepath.EvalSymlinks(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	var errs []error
	for range 4 { // stacked mounts show up again after the top one is gone
		ms, err := mountsUnder(dir)
		if err != nil || len(ms) == 0 {
			return errors.Join(append(errs, err)...)
		}
		for _, m := range ms {
			if err := unix.Unmount(m, unix.UMOUNT_NOFOLLOW); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				if err := unix.Unmount(m, unix.UMOUNT_NOFOLLOW|unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
					errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
				}
			}
		}
	}
	ms, err := mountsUnder(dir)
	if len(ms) > 0 {
		errs = append(errs, fmt.Errorf("still mounted: %v", ms))
	}
	return errors.Join(append(errs, err)...)
}

// benchStore is the driver's store: bbolt (nil, the default), or with
// EPHEMERA_BENCH_MEMSTORE=1 the in-memory one, to measure what the state file
// costs.
func benchStore() store.Store {
	if os.Getenv("EPHEMERA_BENCH_MEMSTORE") == "1" {
		return memstore.New()
	}
	return nil
}
