package drivertest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2/ktesting"

	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/mount"
)

// Harness is a driver running in-process for one test, with a connected CSI
// client and a kubelet simulator pointed at it.
type Harness struct {
	// Node and Identity are clients of the running driver.
	Node     csi.NodeClient
	Identity csi.IdentityClient
	// Kubelet sends kubelet-exact requests to the driver.
	Kubelet *Kubelet
	// Options are the driver's options after Start filled in the test defaults.
	Options framework.Options

	t      testing.TB
	fake   *mount.Fake     // Options.Volumes.Mounter, when it is a mount.Fake
	before map[string]bool // mount points below the kubelet root at Start
	conn   *grpc.ClientConn
	driver *framework.Driver
	cancel context.CancelFunc
	done   chan error
}

// Start runs a driver built from opts until the test ends and returns a harness
// for it. Options left empty get test values: DriverName "test.csi.ephemera.dev",
// NodeID "node-1", KubeletRootDir and StateDir in t.TempDir(), an Endpoint in
// a short temporary directory (unix socket paths are limited to 107 bytes), and
// a Logger that writes to t.Log (klog's ktesting with its DefaultConfig:
// verbosity 5, or -testing.v=N when the test imports k8s.io/klog/v2/ktesting/init),
// so the driver's log shows beside the test that produced it. What the driver
// logs after the test ended goes to klog's global logger instead.
// Limits.KeepBinaryPages is always set: the test process keeps its pages.
// Observability.CSIDriverCheckJitter left zero becomes none: the startup
// check of the CSIDriver object reads at once.
//
// When opts.Mounter is a *mount.Fake, whose directories exist only in memory,
// the directories the Kubelet creates (a pod's, the parent of a target) are
// added to the Fake as well, so that Kubelet.Publish works without root (see
// "Tests without root" in the package documentation).
//
// Start fails the test if the driver does not become ready. At cleanup the
// driver is stopped and its Run error, if any, fails the test.
func Start(t testing.TB, opts framework.Options) *Harness {
	t.Helper()
	if opts.DriverName == "" {
		opts.DriverName = "test.csi.ephemera.dev"
	}
	if opts.Node.ID == "" {
		opts.Node.ID = "node-1"
	}
	if opts.Observability.CSIDriverCheckJitter == 0 {
		// One driver, not a fleet: the startup check reads at once.
		opts.Observability.CSIDriverCheckJitter = -1
	}
	if opts.Node.KubeletRootDir == "" {
		opts.Node.KubeletRootDir = filepath.Join(t.TempDir(), "kubelet")
	}
	if opts.Node.StateDir == "" {
		opts.Node.StateDir = filepath.Join(t.TempDir(), "state")
	}
	if opts.Node.Endpoint == "" {
		dir, err := os.MkdirTemp("", "ephemera-sock")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		opts.Node.Endpoint = "unix://" + filepath.Join(dir, "csi.sock")
	}
	if err := os.MkdirAll(filepath.Join(opts.Node.KubeletRootDir, "pods"), 0o750); err != nil {
		t.Fatal(err)
	}
	// A test process has no use for giving back its binary's pages, and each
	// driver it starts would do it again.
	opts.Limits.KeepBinaryPages = true
	if opts.Observability.Logger.GetSink() == nil {
		// Before the cleanup below, so the driver's last lines still reach t.
		opts.Observability.Logger = ktesting.NewLogger(t, ktesting.DefaultConfig)
	}
	h := &Harness{t: t, Options: opts}
	h.fake, _ = opts.Volumes.Mounter.(*mount.Fake)
	// Not left behind by the test: RequireClean ignores them. An error here
	// shows again in RequireClean.
	if root, err := filepath.Abs(opts.Node.KubeletRootDir); err == nil {
		h.before, _ = mountPointsUnder(root)
	}
	h.start()
	conn, err := grpc.NewClient(opts.Node.Endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	h.conn = conn
	h.Node = csi.NewNodeClient(conn)
	h.Identity = csi.NewIdentityClient(conn)
	h.Kubelet = NewKubelet(KubeletOptions{
		Root:       opts.Node.KubeletRootDir,
		Endpoint:   opts.Node.Endpoint,
		DriverName: opts.DriverName,
		NodeName:   opts.Node.ID,
	})
	if h.fake != nil {
		h.Kubelet.madeDir = h.fake.AddDir
	}
	t.Cleanup(func() {
		conn.Close()
		h.stop()
		if h.fake == nil {
			h.detachLeftovers()
		}
	})
	return h
}

// Driver returns the running driver.
func (h *Harness) Driver() *framework.Driver { return h.driver }

func (h *Harness) start() {
	h.t.Helper()
	d, err := framework.New(h.Options)
	if err != nil {
		h.t.Fatalf("framework.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.driver, h.cancel, h.done = d, cancel, make(chan error, 1)
	go func() { h.done <- d.Run(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	sock := h.Options.Node.Endpoint[len("unix://"):]
	for !d.Ready() || !exists(sock) {
		select {
		case err := <-h.done:
			cancel()
			h.done = nil
			h.t.Fatalf("driver stopped during startup: %v", err)
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			h.t.Fatal("driver not ready after 30s")
		}
	}
}

// Stop stops the driver gracefully, as at the end of the test. Stopping a
// stopped driver does nothing; RestartDriver starts it again.
func (h *Harness) Stop() { h.stop() }

func (h *Harness) stop() {
	if h.done == nil {
		return
	}
	h.cancel()
	err := <-h.done
	h.done = nil
	if err != nil && !errors.Is(err, context.Canceled) {
		h.t.Errorf("driver Run: %v", err)
	}
}

// RestartDriver stops the driver gracefully and starts a new one with the same
// options and state, as after a driver container restart. Clients keep working.
// (Kubelet.Restart restarts the simulated kubelet instead.)
func (h *Harness) RestartDriver() {
	h.t.Helper()
	h.Stop()
	h.start()
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}
