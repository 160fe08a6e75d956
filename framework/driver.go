package framework

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/ephemera-csi/ephemera/framework/internal/csiserver"
	"github.com/ephemera-csi/ephemera/framework/internal/daemon"
	"github.com/ephemera-csi/ephemera/framework/internal/httpserver"
	"github.com/ephemera-csi/ephemera/framework/internal/lifecycle"
	"github.com/ephemera-csi/ephemera/framework/internal/metrics"
	"github.com/ephemera-csi/ephemera/framework/internal/volstats"
	"github.com/ephemera-csi/ephemera/framework/internal/words"
	"github.com/ephemera-csi/ephemera/framework/mount"
)

// StateFile is the name of the bbolt file in Options.Node.StateDir.
const StateFile = "state.db"

// Driver is an ephemeral inline CSI node plugin: the CSI Identity and Node
// services, durable per-volume state, and the startup reconcile. Create it with
// New and serve with Run.
type Driver struct {
	opts    Options
	words   words.Words       // the operator's words for opts' fields
	csi     *csiserver.Server // the CSI services (node.go)
	engine  *lifecycle.Engine // the volumes' lifecycle (internal/lifecycle)
	volumes *volstats.Reader  // volume stats and health (internal/volstats)
	daemon  *daemon.Daemon    // Run's components (internal/daemon)
	ready   atomic.Bool
	running atomic.Bool

	metrics *metrics.Metrics // observability.go
	handler http.Handler     // /metrics, /healthz, /readyz, /volumes
	health  *httpserver.Health
}

// New validates opts and returns a Driver. It starts nothing and does no I/O; call
// Run to serve.
func New(opts Options) (*Driver, error) {
	opts.setDefaults()
	w := words.New(opts.flagNames)
	if err := opts.validate(); err != nil {
		return nil, w.Err(fmt.Errorf("invalid driver options: %w", err))
	}
	mounter := opts.Volumes.Mounter
	if mounter == nil && opts.Volumes.WindowsMode == WindowsCSIProxy {
		m, err := mount.NewCSIProxy(mount.CSIProxyOptions{})
		if err != nil {
			return nil, err
		}
		mounter = m
	}
	if mounter == nil {
		mounter = mount.New()
	}
	d := &Driver{opts: opts, words: w}
	engine, err := lifecycle.New(*opts.engineConfig(), w, mounter, &d.running)
	if err != nil {
		return nil, w.Err(fmt.Errorf("invalid driver options: %w", err))
	}
	d.engine = engine
	d.volumes = &volstats.Reader{
		Store: engine.Store, Mounter: mounter, KubeletRootDir: opts.Node.KubeletRootDir, Windows: isWindows, Walks: engine.Stats(),
		HealthChecker: func(backend string) volstats.HealthChecker {
			if hc := engine.HealthChecker(backend); hc != nil {
				return hc
			}
			return nil
		},
		Volume: engine.Volume,
	}
	if opts.State.Store != nil {
		engine.SetStore(opts.State.Store)
	}
	d.initObservability()
	engine.SetMetrics(d.metrics)
	d.csi = &csiserver.Server{
		Node:    node{d},
		Parser:  opts.parser(),
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
		Capabilities: &csi.NodeGetCapabilitiesResponse{Capabilities: csiserver.NodeCapabilities()},
	}
	d.daemon = daemon.New(d.daemonConfig(), w, engine, d.csi, d.metrics, d.handler, &d.ready)
	return d, nil
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
	return d.daemon.Run(ctx)
}

// Refresh rewrites the content of one volume now (asynchronously, within the
// refresh concurrency cap), with the secrets and tokens of its last publish.
// It returns an error when the driver is not running or the volume is unknown.
func (d *Driver) Refresh(ctx context.Context, volumeID string) error {
	return d.engine.Refresh(ctx, volumeID)
}

// RefreshAll rewrites the content of every published volume, for an event such
// as a CA rotation. Volumes start at random offsets within spread (0: at once)
// and never more than Options.Volumes.RefreshConcurrency at a time.
func (d *Driver) RefreshAll(ctx context.Context, spread time.Duration) error {
	return d.engine.RefreshAll(ctx, spread)
}
