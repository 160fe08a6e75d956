package daemon

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/framework/internal/csiserver"
	"github.com/ephemera-csi/ephemera/framework/internal/httpserver"
	"github.com/ephemera-csi/ephemera/framework/internal/lifecycle"
	"github.com/ephemera-csi/ephemera/framework/internal/logkeys"
	"github.com/ephemera-csi/ephemera/framework/internal/metrics"
	"github.com/ephemera-csi/ephemera/framework/internal/unixsock"
	"github.com/ephemera-csi/ephemera/framework/internal/words"
)

// Config is what a driver process needs of framework.Options, validated and
// with defaults applied; the fields keep Options' names and paths.
type Config struct {
	DriverName    string
	Node          NodeConfig
	State         StateConfig
	Limits        LimitConfig
	GC            GCConfig
	Observability ObservabilityConfig
	Runnables     []Runnable
}

// NodeConfig is Options.Node's part the process reads.
type NodeConfig struct {
	ID, Version, Endpoint string
	Socket                string // the path of Endpoint
	StateDir              string
	StateFile             string // the name of the bbolt file in StateDir
	KubeletRootDir        string
	RegisterWithKubelet   bool
}

// StateConfig is Options.State's part the process reads.
type StateConfig struct {
	LockTimeout time.Duration
	// RefuseDamaged fails the startup on a damaged state file instead of
	// recovering it (framework.StateRecoveryRefuse; Recovery is its name).
	RefuseDamaged bool
	Recovery      string
}

// LimitConfig is the memory plan of Options.Limits.
type LimitConfig struct {
	MemoryLimit     int64 // the container's; 0: not set
	MemoryNeeded    int64 // framework.MemoryNeeded of the options; -1: unbounded
	HeldCapacity    int64 // the content capacity Go's limit leaves out
	GoMemoryLimit   int64 // framework.GoMemoryLimit(MemoryLimit - HeldCapacity)
	KeepBinaryPages bool
}

// GCConfig is Options.GC's part the process reads.
type GCConfig struct {
	Interval time.Duration
}

// ObservabilityConfig is Options.Observability's part the process reads.
type ObservabilityConfig struct {
	Logger         klog.Logger
	MetricsAddress string
	// CheckCSIDriver is the startup check of the CSIDriver object; nil: no
	// API access, and NoCSIDriverCheck is logged instead.
	CheckCSIDriver   func(ctx context.Context)
	NoCSIDriverCheck string
}

// Runnable is framework.Runnable.
type Runnable interface {
	Run(ctx context.Context) error
}

// Daemon runs one driver process: its components in order (components.go),
// the state file (state.go) and the metrics server.
type Daemon struct {
	cfg     Config
	words   words.Words
	engine  *lifecycle.Engine
	csi     *csiserver.Server
	metrics *metrics.Metrics
	handler http.Handler
	ready   *atomic.Bool

	mu     sync.Mutex
	server *httpserver.Server // set while Run serves Observability.MetricsAddress
}

// New builds the process of cfg around the engine and the CSI server;
// handler serves the metrics address, ready is set while the driver serves.
func New(cfg Config, w words.Words, engine *lifecycle.Engine, csi *csiserver.Server, m *metrics.Metrics, handler http.Handler, ready *atomic.Bool) *Daemon {
	return &Daemon{cfg: cfg, words: w, engine: engine, csi: csi, metrics: m, handler: handler, ready: ready}
}

// Run opens the state, reconciles it with the mount table and the backends,
// then serves until ctx ends (framework.Driver.Run).
func (d *Daemon) Run(ctx context.Context) error {
	log := d.cfg.Observability.Logger.WithValues(logkeys.Driver, d.cfg.DriverName)

	// Fail fast, before opening the state or reconciling (which deletes backend
	// storage that this process has no record of), when another process serves
	// the endpoint. Listen (the grpc component) checks again.
	if err := unixsock.CheckNotServed(d.cfg.Node.Socket); err != nil {
		return d.endpointInUse(err)
	}
	err := d.components(log, d.cfg.Node.Socket).run(ctx)
	log.Info("Stopped serving")
	return err
}

// endpointInUse is Run's error when another process serves the endpoint.
func (d *Daemon) endpointInUse(err error) error {
	return fmt.Errorf("CSI endpoint %s is served by another driver process (a second pod of this driver on the node, or a process left running); refusing to start: %w", d.cfg.Node.Endpoint, err)
}

// MetricsAddr is the address the metrics server listens on, "" when it is
// not serving.
func (d *Daemon) MetricsAddr() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.server == nil {
		return ""
	}
	return d.server.Addr()
}

// serveHTTP starts the Observability.MetricsAddress server, if any. The
// returned func stops it gracefully.
func (d *Daemon) serveHTTP(log klog.Logger) (stop func(), err error) {
	if d.cfg.Observability.MetricsAddress == "" {
		return func() {}, nil
	}
	srv, err := httpserver.Start(d.cfg.Observability.MetricsAddress, d.handler, log)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.server = srv
	d.mu.Unlock()
	log.Info("Serving metrics and health", logkeys.Address, srv.Addr())
	return func() {
		srv.Stop(5 * time.Second)
		d.mu.Lock()
		d.server = nil
		d.mu.Unlock()
	}, nil
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
