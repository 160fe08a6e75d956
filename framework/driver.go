package framework

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/framework/internal/logkeys"
	"github.com/ephemera-csi/ephemera/framework/internal/metrics"
	"github.com/ephemera-csi/ephemera/framework/internal/unixsock"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/registration"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// StateFile is the name of the bbolt file in Options.StateDir.
const StateFile = "state.db"

// Driver is an ephemeral inline CSI node plugin: the CSI Identity and Node
// services, durable per-volume state, and the startup reconcile. Create it with
// New and serve with Run.
type Driver struct {
	opts    Options
	mounter mount.Interface
	store   store.Store

	locks     volumeLocks
	inflight  chan struct{}
	capacity  *capacity
	refresher *refresher
	// contentBudget is Options.ContentBytesInFlight.
	contentBudget *budget
	orphans       orphans
	stats         *statsCache // walks of directory volumes (statswalk.go)
	ready         atomic.Bool
	running       atomic.Bool

	capabilities *csi.NodeGetCapabilitiesResponse
	nodeInfo     *csi.NodeGetInfoResponse
	pluginInfo   *csi.GetPluginInfoResponse

	metrics *metrics.Metrics // observability.go
	http    httpState

	mu     sync.Mutex
	server *grpc.Server // set while serving, for tests
}

// New validates opts and returns a Driver. It starts nothing and does no I/O; call
// Run to serve.
func New(opts Options) (*Driver, error) {
	opts.setDefaults()
	if err := opts.validate(); err != nil {
		return nil, fmt.Errorf("invalid driver options: %w", err)
	}
	d := &Driver{
		opts:     opts,
		mounter:  opts.Mounter,
		store:    opts.Store,
		inflight: make(chan struct{}, opts.MaxInFlight),
		capacity: newCapacity(opts.MaxVolumesPerNode, opts.Capacity),
		capabilities: &csi.NodeGetCapabilitiesResponse{
			Capabilities: nodeCapabilities(),
		},
		nodeInfo: &csi.NodeGetInfoResponse{
			NodeId:            opts.NodeID,
			MaxVolumesPerNode: opts.MaxVolumesPerNode,
		},
		pluginInfo: &csi.GetPluginInfoResponse{
			Name:          opts.DriverName,
			VendorVersion: opts.Version,
		},
	}
	if d.mounter == nil && opts.WindowsMode == WindowsCSIProxy {
		m, err := mount.NewCSIProxy(mount.CSIProxyOptions{})
		if err != nil {
			return nil, err
		}
		d.mounter = m
	}
	if d.mounter == nil {
		d.mounter = mount.New()
	}
	d.refresher = newRefresher(d, opts.RefreshConcurrency)
	d.contentBudget = newBudget(opts.ContentBytesInFlight)
	d.stats = newStatsCache(opts.StatsWalk)
	d.initObservability()
	d.stats.observe = func(b walkBound) { d.metrics.StatsWalked(b.names()...) } // before Run: no lock needed
	return d, nil
}

// nodeCapabilities lists what the driver really implements. Ephemeral inline
// volumes are never staged or expanded.
func nodeCapabilities() []*csi.NodeServiceCapability {
	var caps []*csi.NodeServiceCapability
	for _, c := range []csi.NodeServiceCapability_RPC_Type{
		csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
		csi.NodeServiceCapability_RPC_GET_VOLUME_HEALTH,
		legacyVolumeCondition,
		csi.NodeServiceCapability_RPC_VOLUME_MOUNT_GROUP,
	} {
		caps = append(caps, &csi.NodeServiceCapability{
			Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: c}},
		})
	}
	return caps
}

// Options returns the options after defaults were applied.
func (d *Driver) Options() Options { return d.opts }

// Ready reports whether the startup reconcile finished and the driver serves.
func (d *Driver) Ready() bool { return d.ready.Load() }

// Run opens the state, reconciles it with the mount table and the backends, then
// serves the CSI endpoint (and the kubelet registration socket when enabled) until
// ctx ends. It then stops gracefully, removes its sockets (each only if it is
// still the one it created) and closes the state. Run returns an error when
// startup fails, among others at once when another process serves the
// endpoint, or when the kubelet refuses the registration; the process should
// then exit non-zero and be restarted.
func (d *Driver) Run(ctx context.Context) (err error) {
	if !d.running.CompareAndSwap(false, true) {
		return errors.New("driver is already running")
	}
	log := d.opts.Logger.WithValues(logkeys.Driver, d.opts.DriverName)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	// Fail fast, before opening the state or reconciling (which deletes backend
	// storage that this process has no record of), when another process serves
	// the endpoint. Listen below checks again.
	sock, _ := socketPath(d.opts.Endpoint)
	if err := unixsock.CheckNotServed(sock); err != nil {
		return d.endpointInUse(err)
	}

	if d.store == nil {
		st, err := d.openState(log)
		if err != nil {
			return err
		}
		d.store = st
		defer func() {
			if cerr := st.Close(); cerr != nil && err == nil {
				err = fmt.Errorf("closing driver state: %w", cerr)
			}
		}()
	}

	// Metrics and /healthz answer during the reconcile; /readyz says not ready.
	stopHTTP, err := d.serveHTTP(log)
	if err != nil {
		return err
	}
	defer stopHTTP()

	start := time.Now()
	if err := d.reconcile(ctx); err != nil {
		return fmt.Errorf("startup reconcile: %w", err)
	}
	n, used := d.capacity.snapshot()
	log.Info("Reconciled state", logkeys.Count, n, logkeys.BytesByBackend, used, logkeys.Duration, time.Since(start))
	// The orphan GC acts only on the pods directory seen now (see checkPodsDir).
	_ = d.checkPodsDir(filepath.Join(d.opts.KubeletRootDir, "pods"))

	// Runnables (an event recorder, a pod informer) run until the GC and the
	// refresher, which use them, have stopped.
	rctx, stopRunnables := context.WithCancel(context.WithoutCancel(ctx))
	var runnables sync.WaitGroup
	defer func() {
		stopRunnables()
		runnables.Wait()
	}()
	if d.opts.CSIDrivers != nil {
		runnables.Go(func() { d.checkCSIDriverObject(klog.NewContext(rctx, log)) })
	} else {
		log.Info("Not checking the CSIDriver object: no API access (Options.CSIDrivers is unset)")
	}
	for _, r := range d.opts.Runnables {
		runnables.Go(func() {
			if err := r.Run(rctx); err != nil && rctx.Err() == nil {
				log.Error(err, "A runnable of the driver stopped", logkeys.Runnable, fmt.Sprintf("%T", r))
			}
		})
	}

	if err := os.MkdirAll(filepath.Dir(sock), 0o700); err != nil {
		return fmt.Errorf("creating socket dir: %w", err)
	}
	lis, err := unixsock.Listen(sock, 0o600)
	if errors.Is(err, unixsock.ErrInUse) {
		return d.endpointInUse(err)
	}
	if err != nil {
		return fmt.Errorf("CSI endpoint %s: %w", d.opts.Endpoint, err)
	}
	// The gRPC server closes lis when it stops; this covers the returns before.
	// Close removes the socket only if it is still this process's.
	defer lis.Close()

	// The kubelet dials a new connection for every call, so a burst of
	// publishes is a burst of connections, each with gRPC's 32 KiB read and
	// write buffers by default. CSI messages are a few KiB: 4 KiB buffers take
	// a 64-publish burst from 12 to 9 MiB of anonymous memory
	// (docs/operations.md, "Memory and CPU of the driver"). gRPC already
	// returns the write buffer to a pool after each flush.
	srv := grpc.NewServer(grpc.UnaryInterceptor(d.intercept), grpc.ReadBufferSize(4<<10), grpc.WriteBufferSize(4<<10))
	csi.RegisterIdentityServer(srv, identityServer{d: d})
	csi.RegisterNodeServer(srv, nodeServer{d: d})
	d.mu.Lock()
	d.server = srv
	d.mu.Unlock()

	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(lis) }()
	d.ready.Store(true)
	d.refresher.start(klog.NewContext(ctx, log))
	gcDone := make(chan struct{})
	if d.opts.GCInterval > 0 {
		go func() {
			defer close(gcDone)
			d.runGC(ctx)
		}()
	} else {
		close(gcDone)
	}
	log.Info("Serving CSI", logkeys.Endpoint, d.opts.Endpoint, logkeys.Version, d.opts.Version, logkeys.Node, d.opts.NodeID)

	// The registrar starts only now that NodeGetInfo answers, and stops before
	// the CSI server so the kubelet deregisters the driver before its socket goes.
	regCtx, stopReg := context.WithCancel(ctx)
	regDone := make(chan struct{})
	if d.opts.RegisterWithKubelet {
		reg, err := registration.New(registration.Options{
			DriverName:      d.opts.DriverName,
			Endpoint:        sock,
			RegistrationDir: filepath.Join(d.opts.KubeletRootDir, "plugins_registry"),
			Logger:          log,
		})
		if err != nil {
			stopReg()
			srv.Stop()
			return err
		}
		go func() {
			defer close(regDone)
			if err := reg.Run(regCtx); err != nil {
				errc <- fmt.Errorf("kubelet registration: %w", err)
			}
		}()
	} else {
		close(regDone)
	}

	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	d.ready.Store(false)
	stopReg()
	<-regDone
	cancel()
	stopGracefully(srv, 10*time.Second)
	if removed, uerr := lis.Unlink(); uerr != nil {
		log.Error(uerr, "Cannot remove CSI socket")
	} else if !removed {
		log.Info("CSI socket was removed or replaced by another process; leaving the path alone", logkeys.Endpoint, d.opts.Endpoint)
	}
	<-gcDone
	d.refresher.stop()
	log.Info("Stopped serving")
	return err
}

// endpointInUse is Run's error when another process serves the endpoint.
func (d *Driver) endpointInUse(err error) error {
	return fmt.Errorf("CSI endpoint %s is served by another driver process (a second pod of this driver on the node, or a process left running); refusing to start: %w", d.opts.Endpoint, err)
}

// stopGracefully lets in-flight calls finish for up to grace, then cuts them off.
func stopGracefully(srv *grpc.Server, grace time.Duration) {
	done := make(chan struct{})
	go func() {
		srv.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(grace):
		srv.Stop()
		<-done
	}
}
