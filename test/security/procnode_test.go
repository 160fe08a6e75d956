//go:build linux

package security

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ephemera-csi/ephemera/framework/drivertest"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/test/internal/hostile"
)

// The bulkhead tests (issue 32) run the scratch driver as shipped, a process
// of its own with its plugins in processes of their own, and this test
// process as the kubelet: they see the driver only through its CSI socket,
// the mount table, and the files below the kubelet root and the directories
// it shares with plugins. So they hold whatever the framework's packages
// become.
//
// Their timeouts are the driver's defaults scaled by scale (a content
// timeout of 2s for the default 30s), and the kubelet's retries
// (drivertest.KubeletBackoff) and CSI deadline are scaled alike, so that the
// load has the shape it has on a node, fifteen times faster.
const (
	contentTimeout = 2 * time.Second
	scale          = float64(contentTimeout) / float64(30*time.Second)
)

// scaled is d scaled.
func scaled(d time.Duration) time.Duration { return time.Duration(float64(d) * scale) }

// operationTimeout is the driver's default --operation-timeout (90s), scaled.
var operationTimeout = scaled(90 * time.Second)

// kubeletBackoff is the kubelet's retry schedule, scaled.
var kubeletBackoff = drivertest.KubeletBackoff(scale)

var (
	driverBinOnce sync.Once
	driverBin     string
	driverBinErr  error
	driverBinDir  string
)

// driverBinary is EPHEMERA_SECURITY_DRIVER_BIN (another build of the scratch
// driver: a fix, or the commit before one), or else ./drivers/scratch built
// once per test binary as make builds everything but the -race tests
// (CGO_ENABLED=0, -trimpath, the Makefile's tags from EPHEMERA_GOTAGS), so
// that it is a build cache hit in make test.
func driverBinary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("EPHEMERA_SECURITY_DRIVER_BIN"); bin != "" {
		return bin
	}
	driverBinOnce.Do(func() {
		if driverBinDir, driverBinErr = os.MkdirTemp("", "security-bin"); driverBinErr != nil {
			return
		}
		driverBin = filepath.Join(driverBinDir, "ephemera-scratch")
		args := []string{"build", "-trimpath", "-o", driverBin}
		if tags := os.Getenv("EPHEMERA_GOTAGS"); tags != "" {
			args = append(args, "-tags", tags)
		}
		cmd := exec.Command("go", append(args, "../../drivers/scratch")...)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			driverBinErr = fmt.Errorf("go build ./drivers/scratch: %w\n%s", err, out)
		}
	})
	if driverBinErr != nil {
		t.Fatal(driverBinErr)
	}
	return driverBin
}

// removeDriverBinary removes what driverBinary built (TestMain).
func removeDriverBinary() {
	if driverBinDir != "" {
		_ = os.RemoveAll(driverBinDir)
	}
}

// pluginSpec is one plugin of a procNode: --plugin NAME=unix://…/NAME.sock,
// with dir=<base>/shared/NAME for a plugin that creates directories.
type pluginSpec struct {
	name     string
	mode     hostile.Mode
	restart  time.Duration // after a crash; 0: not restarted
	maxBytes int64         // its answers' bound (max-content-bytes); 0: the default, 16Mi
	// rotateBytes is a rotate plugin's blob (hostile.Options.RotateBytes).
	rotateBytes int64
}

func (s pluginSpec) creates() bool { return s.mode == hostile.Dir || s.mode == hostile.HangDelete }

// procNode is one test's node: a tmpfs of its own in a short temporary
// directory (socket paths have at most 107 bytes) holding the kubelet root,
// the driver's state, sockets, logs and the directories shared with
// plugins; the driver process and the plugin processes; and the kubelet.
type procNode struct {
	t       *testing.T
	base    string
	root    string // kubelet root
	sock    string // the driver's CSI socket
	k       *drivertest.Kubelet
	plugins map[string]*hostile.Process
	specs   map[string]pluginSpec

	// ctx ends at cleanup, before the processes stop; the goroutines of
	// goRun are waited for then.
	ctx context.Context
	wg  sync.WaitGroup
	led ledger

	// The driver: how it is started, and its process (nil when stopped).
	driverBin, driverCgroup string
	driverArgs              []string
	driver                  *driverProc
}

// procNodeOptions are a procNode's settings beyond its plugins and flags.
type procNodeOptions struct {
	// driverCgroup, when set, is the directory of the cgroup (v1 memory, or
	// v2) the driver runs in from its first instruction: a shell joins it
	// and execs the driver, so that every page the driver ever allocates is
	// charged there. Its log is then copied into driver.log by this process,
	// whose pages the log's are, not the driver's.
	driverCgroup string
}

// startProcNode starts the plugins and the driver (tmpfs and the plugins as
// backends, content timeout and operation timeout scaled, flags added) and
// waits until the driver is ready. Everything is stopped, unmounted and
// removed at cleanup, also when the test fails.
func startProcNode(t *testing.T, specs []pluginSpec, flags ...string) *procNode {
	t.Helper()
	return startProcNodeWith(t, procNodeOptions{}, specs, flags...)
}

// startProcNodeWith is startProcNode with opts.
func startProcNodeWith(t *testing.T, opts procNodeOptions, specs []pluginSpec, flags ...string) *procNode {
	t.Helper()
	requireRoot(t)
	bin := driverBinary(t)
	base, err := os.MkdirTemp("", "ephemera-bulkhead")
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("bulkhead-node", base, "tmpfs", 0, "size=512m"); err != nil {
		os.Remove(base)
		t.Fatal(err)
	}
	n := &procNode{t: t, base: base, root: filepath.Join(base, "kubelet"), sock: filepath.Join(base, "csi.sock"),
		plugins: map[string]*hostile.Process{}, specs: map[string]pluginSpec{}}
	t.Cleanup(n.cleanup) // runs last: after the processes stopped
	t.Cleanup(n.dumpLogsOnFailure)
	if err := os.MkdirAll(filepath.Join(n.root, "pods"), 0o750); err != nil {
		t.Fatal(err)
	}
	for _, s := range specs {
		n.startPlugin(s)
	}
	args := []string{
		"--endpoint=unix://" + n.sock, "--nodeid=node-1", "--driver-name=" + driverName,
		"--kubelet-root=" + n.root, "--state-dir=" + filepath.Join(base, "state"),
		"--backends=tmpfs", "--v=2",
		"--content-timeout=" + contentTimeout.String(), "--operation-timeout=" + operationTimeout.String(),
	}
	for _, s := range specs {
		p := "--plugin=" + s.name + "=" + n.plugins[s.name].Endpoint
		if s.creates() {
			p += ",dir=" + n.shared(s.name)
		}
		if s.maxBytes > 0 {
			p += ",max-content-bytes=" + strconv.FormatInt(s.maxBytes, 10)
		}
		args = append(args, p)
	}
	// EPHEMERA_SECURITY_DRIVER_ARGS adds flags (space-separated), after the
	// test's own: to run the tests against a driver tuned otherwise.
	args = append(append(args, flags...), strings.Fields(os.Getenv("EPHEMERA_SECURITY_DRIVER_ARGS"))...)
	n.startDriver(bin, args, opts.driverCgroup)
	ctx, cancel := context.WithCancel(context.Background())
	n.ctx = ctx
	t.Cleanup(func() { // runs first: the test's goroutines end before anything stops
		cancel()
		n.wg.Wait()
	})
	n.k = drivertest.NewKubelet(drivertest.KubeletOptions{
		Root: n.root, Endpoint: "unix://" + n.sock, DriverName: driverName, Timeout: kubeletBackoff.Timeout,
	})
	return n
}

// shared is the directory the driver shares with plugin name.
func (n *procNode) shared(name string) string { return filepath.Join(n.base, "shared", name) }

// startPlugin starts the plugin of s (again, after stopPlugin).
func (n *procNode) startPlugin(s pluginSpec) {
	n.t.Helper()
	opts := hostile.Options{Mode: s.mode, Endpoint: "unix://" + filepath.Join(n.base, s.name+".sock"), MaxContentBytes: s.maxBytes, RotateBytes: s.rotateBytes}
	if s.creates() {
		opts.Dir = n.shared(s.name)
		if err := os.MkdirAll(opts.Dir, 0o750); err != nil {
			n.t.Fatal(err)
		}
	}
	n.plugins[s.name] = hostile.Start(n.t, opts, hostile.StartOptions{Log: filepath.Join(n.base, s.name+".log"), RestartDelay: s.restart})
	n.specs[s.name] = s
}

// driverProc is a driver process of a procNode.
type driverProc struct {
	cmd    *exec.Cmd
	exited chan struct{}
}

// startDriver runs the driver binary with args, its output in driver.log,
// killed with the test process (Pdeathsig), stopped at cleanup (SIGTERM,
// SIGKILL after 10s), and waits until it answers Probe with ready. With
// cgroup, it runs in that cgroup (procNodeOptions.driverCgroup).
func (n *procNode) startDriver(bin string, args []string, cgroup string) {
	n.t.Helper()
	n.driverBin, n.driverArgs, n.driverCgroup = bin, args, cgroup
	n.t.Cleanup(n.stopDriver)
	n.launchDriver()
}

// restartDriver stops the driver (SIGTERM) and starts it again as it was
// started, in the same cgroup, and waits until it is ready.
func (n *procNode) restartDriver() {
	n.t.Helper()
	n.stopDriver()
	n.launchDriver()
}

// stopDriver stops the driver process, if it runs: SIGTERM, SIGKILL after
// 10s.
func (n *procNode) stopDriver() {
	d := n.driver
	if d == nil {
		return
	}
	n.driver = nil
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(10 * time.Second):
		n.t.Errorf("the driver did not stop within 10s of SIGTERM: killed")
		_ = d.cmd.Process.Kill()
		<-d.exited
	}
}

// launchDriver starts the driver process and waits until it is ready.
func (n *procNode) launchDriver() {
	n.t.Helper()
	logf, err := os.OpenFile(filepath.Join(n.base, "driver.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		n.t.Fatal(err)
	}
	cmd := exec.Command(n.driverBin, n.driverArgs...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if n.driverCgroup != "" {
		// The shell's pages are freed by the exec; the driver's first are
		// the cgroup's. A writer that is no *os.File: exec copies the
		// output through a pipe, in this process.
		cmd = exec.Command("/bin/sh", append([]string{"-c", `echo $$ >"$0" && exec "$@"`, filepath.Join(n.driverCgroup, "cgroup.procs"), n.driverBin}, n.driverArgs...)...)
		w := struct{ io.Writer }{logf}
		cmd.Stdout, cmd.Stderr = w, w
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		n.t.Fatal(err)
	}
	d := &driverProc{cmd: cmd, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(d.exited)
	}()
	n.driver = d
	deadline := time.Now().Add(30 * time.Second)
	for {
		ready, err := n.probe()
		if ready {
			return
		}
		select {
		case <-d.exited:
			n.t.Fatalf("the driver exited: %v\n%s", cmd.ProcessState, n.logTail("driver.log", 4000))
		default:
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("the driver is not ready after 30s: %v\n%s", err, n.logTail("driver.log", 4000))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// probe asks the driver whether it is ready.
func (n *procNode) probe() (bool, error) {
	if _, err := os.Stat(n.sock); err != nil {
		return false, err
	}
	conn, err := grpc.NewClient("unix://"+n.sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return false, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	resp, err := csi.NewIdentityClient(conn).Probe(ctx, &csi.ProbeRequest{})
	return resp.GetReady().GetValue(), err
}

// logTail is the last max bytes of a log in base.
func (n *procNode) logTail(name string, max int) string {
	b, _ := os.ReadFile(filepath.Join(n.base, name))
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}

// dumpLogsOnFailure logs the ends of the driver's and the plugins' logs when
// the test failed (once the processes stopped: it is registered before them).
func (n *procNode) dumpLogsOnFailure() {
	if !n.t.Failed() {
		return
	}
	n.t.Logf("driver.log (end):\n%s", n.logTail("driver.log", 6000))
	for name := range n.specs {
		n.t.Logf("%s.log (end):\n%s", name, n.logTail(name+".log", 1500))
	}
}

// cleanup unmounts everything below base, then base, and removes it.
func (n *procNode) cleanup() {
	if _, err := unmountBelow(n.base, false); err != nil {
		n.t.Errorf("cleanup: %v", err)
	}
	if err := unix.Unmount(n.base, unix.MNT_DETACH); err != nil {
		n.t.Errorf("cleanup: unmounting the node's tmpfs: %v", err)
	}
	_ = os.RemoveAll(n.base)
}

// stopPlugin kills plugin name.
func (n *procNode) stopPlugin(name string) { n.plugins[name].Stop() }

// goRun runs f on a goroutine of the node, waited for at cleanup.
func (n *procNode) goRun(f func()) { n.wg.Go(f) }

// mounts returns the mounts below dir. It may be called from any goroutine.
func (n *procNode) mounts(dir string) []mount.MountInfo {
	infos, err := mount.ReadMountInfo()
	if err != nil {
		n.t.Errorf("reading the mount table: %v", err)
		return nil
	}
	return mount.MountsUnder(infos, dir)
}

// wantClean fails the test when anything is left on the node: a mount
// below the kubelet root, a pod directory, a directory a plugin created.
func (n *procNode) wantClean() {
	n.t.Helper()
	if ms := n.mounts(n.root); len(ms) > 0 {
		var at []string
		for _, m := range ms {
			at = append(at, m.MountPoint)
		}
		n.t.Errorf("%d mounts left below the kubelet root: %s", len(ms), strings.Join(at[:min(len(at), 5)], ", "))
	}
	if pods, _ := os.ReadDir(filepath.Join(n.root, "pods")); len(pods) > 0 {
		n.t.Errorf("%d pod directories left below the kubelet root (%s, ...)", len(pods), pods[0].Name())
	}
	for name, s := range n.specs {
		if !s.creates() {
			continue
		}
		entries, _ := os.ReadDir(n.shared(name))
		for _, e := range entries {
			if !strings.HasPrefix(e.Name(), ".") {
				n.t.Errorf("plugin %s's directory left: %s", name, e.Name())
			}
		}
	}
}
