//go:build e2e && linux

package e2e

import (
	"bufio"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const driverName = "scratch.csi.ephemera.dev"

// driver is an Ephemera driver binary running as a host process (as the
// DaemonSet's privileged container would, in the host mount namespace): the
// scratch driver (clu.drv), or an example driver a test runs beside it. Its
// stderr (klog) goes to logs/<proc>.log, appended across restarts.
type driver struct {
	c        *cluster
	n        *node // the node it serves (--nodeid, --kubelet-root)
	bin      string
	name     string
	proc     string // startProc's name: the log is logs/<proc>.log
	endpoint string
	stateDir string
	extra    []string // flags of this driver beyond the framework's (args)
	// memCgroup, when set, is a memory cgroup (cgroupfs path, made by the
	// caller) that start moves the process into, so that what the kernel
	// charges to the driver can be read apart from the test's own processes.
	memCgroup string
	// dropFlags are flag prefixes args leaves out (an older release started
	// on this driver's state dir lacks flags this tree's has).
	dropFlags []string
	p         *proc
	logPath   string
}

var (
	driverOnce sync.Once
	driverErr  error
)

// requireDriver builds and starts the scratch driver on first use (so harness-only
// tests run while the driver does not build) and fails the test when it cannot.
// A driver a previous test left stopped is started again.
func requireDriver(t *testing.T) *driver {
	t.Helper()
	driverOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		driverErr = clu.setupDriver(ctx)
	})
	if driverErr != nil {
		t.Fatalf("scratch driver: %v", driverErr)
	}
	d := clu.drv
	if d.p == nil || d.p.exited() {
		if d.p != nil {
			t.Logf("driver was not running (%v); starting it", d.p.exitErr())
		}
		if err := d.start(context.Background()); err != nil {
			t.Fatalf("start driver: %v", err)
		}
	}
	return d
}

func (c *cluster) setupDriver(ctx context.Context) error {
	t0 := time.Now()
	bin := os.Getenv("EPHEMERA_E2E_DRIVER_BIN")
	if bin == "" {
		bin = filepath.Join(c.root, "bin", "scratch")
		if err := c.goBuild(ctx, bin, "./drivers/scratch"); err != nil {
			return err
		}
		c.step("driver built (go build ./drivers/scratch)", t0)
	}
	var err error
	if c.drv, err = c.newDriver(&c.node, driverName, bin, filepath.Join(c.root, "driver"), "driver"); err != nil {
		return err
	}
	t1 := time.Now()
	if err := c.drv.start(ctx); err != nil {
		return err
	}
	c.step("driver start to CSINode lists it", t1)
	return nil
}

// newDriver describes (does not start) driver name, built at bin, on node n
// as its DaemonSet pod would run it there: its own --nodeid, kubelet root,
// state dir (<dir>/state, created) and CSI socket (<dir>/csi.sock). proc names
// its process and its log (logs/<proc>.log). A scratch driver (driverName), on
// any node, gets scratchFlags; extra flags go after those.
func (c *cluster) newDriver(n *node, name, bin, dir, proc string, extra ...string) (*driver, error) {
	d := &driver{
		c: c, n: n, bin: bin, name: name, proc: proc,
		endpoint: "unix://" + filepath.Join(dir, "csi.sock"),
		stateDir: filepath.Join(dir, "state"),
		logPath:  filepath.Join(c.logDir, proc+".log"),
	}
	if name == driverName {
		d.extra = c.scratchFlags()
	}
	d.extra = append(d.extra, extra...)
	if err := os.MkdirAll(d.stateDir, 0o700); err != nil {
		return nil, err
	}
	return d, nil
}

// scratchFlags are the scratch driver's own flags (drivers/scratch, not
// framework.BindFlags: an example driver such as tokenfile has neither these
// nor the fast GC) that every scratch driver of the harness runs with.
func (c *cluster) scratchFlags() []string {
	return []string{
		// A fast orphan GC (TestOrphanGCRemovesVolumeOfVanishedPod), confirming with
		// the API server (TestTwoNodes: node B's GC confirms through its own
		// node's informer). It only acts on volumes whose pod directory is gone,
		// which no other test produces.
		"--gc-interval=1s", "--orphan-grace-period=2s", "--gc-confirm-with-api",
		// Pod events (TestDriverEvents; TestTwoNodes' ResourceExhausted on node B),
		// through the admin kubeconfig.
		"--events", "--kubeconfig=" + filepath.Join(c.root, "admin.kubeconfig"),
	}
}

// registrations counts the kubelet's "Register new plugin" lines for the driver.
func (d *driver) registrations() int {
	return countInFile(d.n.kubelet.logPath, "Register new plugin with name: "+d.name+" ")
}

// start starts the driver and waits until the kubelet has registered it (a new
// "Register new plugin" line in its log) and the CSINode object lists it.
func (d *driver) start(ctx context.Context) error {
	before := d.registrations()
	var err error
	d.p, err = d.c.startProc(d.proc, d.bin, d.args(true), nil)
	if err != nil {
		return err
	}
	if d.memCgroup != "" {
		// Before the driver serves: what it writes from then on is charged
		// there (what it allocated before stays where it was: cgroup v1 does
		// not move charges by default).
		if err := moveToMemoryCgroup(d.p.cmd.Process.Pid, d.memCgroup); err != nil {
			d.p.kill()
			return err
		}
	}
	return d.waitRegistered(ctx, before)
}

// args are the driver's flags: the framework's (framework.BindFlags, which every
// Ephemera driver has), then extra; register adds --register (the embedded
// registrar).
func (d *driver) args(register bool) []string {
	a := []string{
		"--endpoint=" + d.endpoint, "--nodeid=" + d.n.name, "--state-dir=" + d.stateDir,
		"--kubelet-root=" + d.n.kubeletRoot, "--v=" + envOr("EPHEMERA_E2E_DRIVER_V", "5"),
		// /metrics on a port of its own choosing (TestManyPods reads
		// ephemera_rpc_duration_seconds); the address is read back from the log.
		"--metrics-address=127.0.0.1:0",
	}
	if d.n.podCgroups {
		// Where the node's kubelet keeps its pods' cgroups, as a DaemonSet
		// on that node is told (the driver runs on the host: the host's
		// /sys/fs/cgroup is the default --pod-cgroup-mount). Without it the
		// driver looks below "/", where no kubelet of the harness has its
		// kubepods (see "Pod cgroups" in README.md), and charges content to
		// itself; with it, content in memory-backed volumes is written from
		// the pod's memory cgroup (TestPodCgroupCharging). A node with pod
		// cgroups off (TestTwoNodes' node B) keeps the default, as a node
		// whose kubelet has cgroupsPerQOS: false would.
		a = append(a, "--kubelet-cgroup-root="+d.n.cgroupRoot)
	}
	a = append(a, d.extra...)
	if register {
		a = append(a, "--register")
	}
	if len(d.dropFlags) > 0 {
		a = slices.DeleteFunc(a, func(f string) bool {
			return slices.ContainsFunc(d.dropFlags, func(p string) bool { return strings.HasPrefix(f, p) })
		})
	}
	return a
}

// waitRegistered waits for a kubelet registration of the driver newer than
// before and for the CSINode object to list it.
func (d *driver) waitRegistered(ctx context.Context, before int) error {
	return waitFor(ctx, 60*time.Second, 100*time.Millisecond, "kubelet registered "+d.name+" and CSINode lists it", func() (bool, error) {
		if d.p.exited() {
			return false, stop(fmt.Errorf("driver exited (%v), see %s", d.p.exitErr(), d.logPath))
		}
		if d.registrations() <= before {
			return false, nil
		}
		n, err := d.c.cs.StorageV1().CSINodes().Get(ctx, d.n.name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, x := range n.Spec.Drivers {
			if x.Name == d.name {
				return true, nil
			}
		}
		return false, nil
	})
}

// stop stops the driver gracefully (SIGTERM, SIGKILL after 10 s).
func (d *driver) stop() {
	if d != nil && d.p != nil {
		d.p.stop(10 * time.Second)
	}
}

// kill9 kills the driver with SIGKILL, as an OOM kill or node crash would.
func (d *driver) kill9() { d.p.kill() }

// logSize is an offset for logSince.
func (d *driver) logSize() int64 {
	st, err := os.Stat(d.logPath)
	if err != nil {
		return 0
	}
	return st.Size()
}

func (d *driver) log() string {
	b, _ := os.ReadFile(d.logPath)
	return string(b)
}

// logSince is the driver log from offset off (from logSize) on; only that part
// is read.
func (d *driver) logSince(off int64) string {
	f, err := os.Open(d.logPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return ""
	}
	b, _ := io.ReadAll(f)
	return string(b)
}

// volumeHandle is the kubelet's handle for an inline volume: csi-sha256(podUID+volName).
func volumeHandle(podUID, volName string) string {
	return fmt.Sprintf("csi-%x", sha256.Sum256([]byte(podUID+volName)))
}

// stateRecords opens the driver's bbolt state read-only and returns the keys of the
// "volumes" bucket. The driver holds bbolt's exclusive flock while it runs (a
// read-only open would block), so this needs the driver stopped: see
// withDriverStopped.
func (d *driver) stateRecords() ([]string, error) {
	return boltRecords(filepath.Join(d.stateDir, "state.db"))
}

// boltRecords returns the keys of the "volumes" bucket of a driver's state file,
// opened read-only (the driver that holds it must be stopped).
func boltRecords(path string) ([]string, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, err
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: 2 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("open %s read-only: %w", path, err)
	}
	defer db.Close()
	var keys []string
	err = db.View(func(tx *bolt.Tx) error {
		var buckets []string
		_ = tx.ForEach(func(name []byte, _ *bolt.Bucket) error {
			buckets = append(buckets, string(name))
			return nil
		})
		b := tx.Bucket([]byte("volumes"))
		if b == nil {
			return fmt.Errorf("no \"volumes\" bucket in %s (buckets: %v)", path, buckets)
		}
		return b.ForEach(func(k, _ []byte) error {
			keys = append(keys, string(k))
			return nil
		})
	})
	sort.Strings(keys)
	return keys, err
}

// withDriverStopped stops the driver (SIGTERM), runs fn and starts the driver again.
func (d *driver) withDriverStopped(t *testing.T, fn func()) {
	t.Helper()
	d.stop()
	defer func() {
		if err := d.start(context.Background()); err != nil {
			t.Fatalf("restart driver: %v", err)
		}
	}()
	fn()
}

// assertNoRecords checks, with the driver stopped, that none of the handles has a
// bbolt record left.
func (d *driver) assertNoRecords(t *testing.T, handles ...string) {
	t.Helper()
	d.withDriverStopped(t, func() {
		keys, err := d.stateRecords()
		if err != nil {
			t.Errorf("read driver state: %v", err)
			return
		}
		left := 0
		for _, h := range handles {
			for _, k := range keys {
				// Tolerate key encodings that prefix or suffix the handle.
				if strings.Contains(k, h) {
					t.Errorf("bbolt record %q for %s still present after unpublish", k, h)
					left++
				}
			}
		}
		t.Logf("driver state.db: %d volume records in total, %d of the %d checked handles", len(keys), left, len(handles))
	})
}

// servingRE matches the framework's log line for --metrics-address; every start
// writes it before the driver registers with the kubelet.
var servingRE = regexp.MustCompile(`"Serving metrics and health".* address="([^"]+)"`)

// metricsAddr is the current process's metrics address: the last "Serving
// metrics and health" line of the driver log (appended across restarts).
func (d *driver) metricsAddr() (string, error) {
	m := servingRE.FindAllStringSubmatch(d.log(), -1)
	if len(m) == 0 {
		return "", fmt.Errorf("no \"Serving metrics and health\" line in %s", d.logPath)
	}
	return m[len(m)-1][1], nil
}

// sample is one line of the Prometheus text format.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

var (
	sampleRE = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)(?: \S+)?$`)
	labelRE  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)
)

// scrape is one GET of the driver's /metrics, parsed.
type scrape []sample

// scrapeMetrics reads the driver's /metrics (text format, parsed by hand: the
// lines the framework writes are simple, and the module does not otherwise
// need prometheus/common).
func (d *driver) scrapeMetrics(ctx context.Context) (scrape, error) {
	addr, err := d.metricsAddr()
	if err != nil {
		return nil, err
	}
	return scrapeAt(ctx, addr)
}

// scrapeAt reads and parses /metrics at addr (host:port), e.g. a node plugin
// pod's on the host network.
func scrapeAt(ctx context.Context, addr string) (scrape, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/plain; version=0.0.4")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET http://%s/metrics: %s", addr, resp.Status)
	}
	var out scrape
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		m := sampleRE.FindStringSubmatch(l)
		if m == nil {
			return nil, fmt.Errorf("unparsable metrics line %q", l)
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", l, err)
		}
		s := sample{name: m[1], labels: map[string]string{}, value: v}
		for _, lm := range labelRE.FindAllStringSubmatch(m[2], -1) {
			s.labels[lm[1]] = lm[2]
		}
		out = append(out, s)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// sum adds the values of the samples named name whose labels include match.
func (s scrape) sum(name string, match map[string]string) float64 {
	var v float64
	for _, x := range s {
		if x.name != name {
			continue
		}
		ok := true
		for k, want := range match {
			if x.labels[k] != want {
				ok = false
				break
			}
		}
		if ok {
			v += x.value
		}
	}
	return v
}
