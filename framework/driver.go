package framework

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"

	"github.com/ephemera-csi/ephemera/framework/internal/csiserver"
	"github.com/ephemera-csi/ephemera/framework/internal/logkeys"
	"github.com/ephemera-csi/ephemera/framework/internal/metrics"
	"github.com/ephemera-csi/ephemera/framework/internal/stats"
	"github.com/ephemera-csi/ephemera/framework/internal/unixsock"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// StateFile is the name of the bbolt file in Options.Node.StateDir.
const StateFile = "state.db"

// Driver is an ephemeral inline CSI node plugin: the CSI Identity and Node
// services, durable per-volume state, and the startup reconcile. Create it with
// New and serve with Run.
type Driver struct {
	opts    Options
	words   words             // the operator's words for opts' fields (words.go)
	csi     *csiserver.Server // the CSI services (node.go)
	mounter mount.Interface
	store   store.Store

	lanes     *lanes // the volume locks and the bulkheads (lanes.go)
	capacity  *capacity
	refresher *refresher
	orphans   orphans
	stats     *stats.Cache // walks of directory volumes (internal/stats)
	ready     atomic.Bool
	running   atomic.Bool

	provisions *provisionState // long provisioning (provisioning.go)

	metrics *metrics.Metrics // observability.go
	http    httpState
}

// New validates opts and returns a Driver. It starts nothing and does no I/O; call
// Run to serve.
func New(opts Options) (*Driver, error) {
	opts.setDefaults()
	w := newWords(opts.flagNames)
	if err := opts.validate(); err != nil {
		return nil, w.err(fmt.Errorf("invalid driver options: %w", err))
	}
	d := &Driver{
		opts:     opts,
		words:    w,
		mounter:  opts.Volumes.Mounter,
		store:    opts.State.Store,
		capacity: newCapacity(opts.Limits.MaxVolumesPerNode, opts.Limits.MaxVolumesPerPod, opts.Limits.Capacity).withWords(w),
	}
	if d.mounter == nil && opts.Volumes.WindowsMode == WindowsCSIProxy {
		m, err := mount.NewCSIProxy(mount.CSIProxyOptions{})
		if err != nil {
			return nil, err
		}
		d.mounter = m
	}
	if d.mounter == nil {
		d.mounter = mount.New()
	}
	d.refresher = newRefresher(d)
	d.provisions = newProvisions(&opts) // long provisioning (provisioning.go)
	lanes, err := newLanes(&opts)
	if err != nil {
		return nil, w.err(fmt.Errorf("invalid driver options: %w", err))
	}
	d.lanes = lanes
	d.stats = stats.NewCache(stats.Limits(opts.Limits.StatsWalk))
	d.initObservability()
	d.stats.Observe = func(b stats.Bound) { d.metrics.StatsWalked(b.Names()...) } // before Run: no lock needed
	d.csi = &csiserver.Server{
		Node:    node{d},
		Parser:  d.parser(),
		Logger:  opts.Observability.Logger,
		Metrics: d.metrics,
		PluginInfo: &csi.GetPluginInfoResponse{
			Name:          opts.DriverName,
			VendorVersion: opts.Node.Version,
		},
		NodeInfo: &csi.NodeGetInfoResponse{
			NodeId:            opts.Node.ID,
			MaxVolumesPerNode: opts.Limits.MaxVolumesPerNode,
		},
		Capabilities: &csi.NodeGetCapabilitiesResponse{Capabilities: nodeCapabilities()},
	}
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
func (d *Driver) Run(ctx context.Context) error {
	if !d.running.CompareAndSwap(false, true) {
		return errors.New("driver is already running")
	}
	log := d.opts.Observability.Logger.WithValues(logkeys.Driver, d.opts.DriverName)

	// Fail fast, before opening the state or reconciling (which deletes backend
	// storage that this process has no record of), when another process serves
	// the endpoint. Listen (the grpc component) checks again.
	sock, _ := socketPath(d.opts.Node.Endpoint)
	if err := unixsock.CheckNotServed(sock); err != nil {
		return d.endpointInUse(err)
	}
	err := d.components(log, sock).run(ctx)
	log.Info("Stopped serving")
	return err
}

// endpointInUse is Run's error when another process serves the endpoint.
func (d *Driver) endpointInUse(err error) error {
	return fmt.Errorf("CSI endpoint %s is served by another driver process (a second pod of this driver on the node, or a process left running); refusing to start: %w", d.opts.Node.Endpoint, err)
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
