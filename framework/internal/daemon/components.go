package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"sync"
	"time"

	"google.golang.org/grpc"
	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/framework/internal/exepages"
	"github.com/ephemera-csi/ephemera/framework/internal/logkeys"
	"github.com/ephemera-csi/ephemera/framework/internal/unixsock"
	"github.com/ephemera-csi/ephemera/framework/internal/words"
	"github.com/ephemera-csi/ephemera/framework/registration"
)

// component is one part of what Run starts, in the shape every part has:
// start (synchronous; its error fails the startup), run (serves until its
// context ends; an error before that stops the driver) and stop (releases
// what start took, after run returned). Any of the three may be nil.
type component struct {
	name  string
	start func(ctx context.Context) error
	run   func(ctx context.Context) error
	stop  func() error
}

// components are what Run starts, in order, and the logger of their
// failures.
type components struct {
	log  klog.Logger
	list []component
}

// run starts the components in order and stops them in reverse: when ctx ends,
// when one fails to start, or when one's run fails. This is the one place a
// component's failure is handled: it is logged with the component's name,
// the components started are stopped in reverse, and it is returned. Each
// component runs under a context of its own (ctx's values, and its
// cancellation only while starting), canceled when its turn to stop comes,
// so a component stops only after every component started after it has
// stopped. It returns the first error: the failure, else the first error of
// a stop. When ctx ends during the startup, no further component starts.
func (g components) run(ctx context.Context) (err error) {
	log, cs := g.log, g.list
	type failure struct {
		name string
		err  error
	}
	type running struct {
		component
		cancel context.CancelFunc
		done   chan struct{}
	}
	failed := make(chan failure, len(cs))
	var started []running
	startFailed := false
	for _, c := range cs {
		if ctx.Err() != nil {
			break // ended during the startup: start no more
		}
		cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		if c.start != nil {
			// A startup (the reconcile) ends early when ctx does.
			unwatch := context.AfterFunc(ctx, cancel)
			err := c.start(cctx)
			unwatch()
			if err != nil {
				cancel()
				failed <- failure{c.name, err}
				startFailed = true
				break
			}
		}
		r := running{c, cancel, make(chan struct{})}
		started = append(started, r)
		go func() {
			defer close(r.done)
			if r.run == nil {
				return
			}
			if err := r.run(cctx); err != nil && cctx.Err() == nil {
				failed <- failure{r.name, err}
			}
		}()
	}
	var f failure
	if startFailed {
		f = <-failed // the start's failure, or an earlier run's
	} else {
		select {
		case <-ctx.Done():
		case f = <-failed:
		}
	}
	if f.err != nil {
		log.Error(f.err, "Driver component failed; stopping the driver", logkeys.Component, f.name)
		err = f.err
	}
	for i := len(started) - 1; i >= 0; i-- {
		r := started[i]
		r.cancel()
		<-r.done
		if r.stop == nil {
			continue
		}
		if serr := r.stop(); serr != nil && err == nil {
			err = serr
		}
	}
	return err
}

// components returns what Run starts, in order: Go's memory limit, the state,
// the HTTP server (metrics and /healthz answer during the reconcile), the
// startup reconcile, the runnables (which the refresher and the GC use), the
// refresher, the orphan GC, the CSI server on sock, the kubelet registrar
// (once NodeGetInfo answers; it stops first, so the kubelet deregisters the
// driver before its socket goes), the release of the binary's startup pages,
// and readiness (set last, cleared first).
func (d *Daemon) components(log klog.Logger, sock string) components {
	return components{log, []component{
		d.memoryLimitComponent(log),
		d.stateComponent(log),
		d.httpComponent(log),
		{name: "reconcile", start: func(ctx context.Context) error {
			start := time.Now()
			if err := d.engine.Reconcile(klog.NewContext(ctx, log)); err != nil {
				return fmt.Errorf("startup reconcile: %w", err)
			}
			n, used := d.engine.Volumes()
			log.Info("Reconciled state", logkeys.Count, n, logkeys.BytesByBackend, used, logkeys.Duration, time.Since(start))
			// The orphan GC acts only on the pods directory seen now (reconcile.GC.CheckPodsDir, through Engine.CheckPodsDir).
			_ = d.engine.CheckPodsDir(filepath.Join(d.cfg.Node.KubeletRootDir, "pods"))
			return nil
		}},
		d.runnablesComponent(log),
		{
			name:  "refresher",
			start: func(ctx context.Context) error { d.engine.StartRefresher(klog.NewContext(ctx, log)); return nil },
			stop:  func() error { d.engine.StopRefresher(); return nil },
		},
		{name: "gc", run: func(ctx context.Context) error {
			if d.cfg.GC.Interval > 0 {
				d.engine.RunGC(ctx)
			}
			return nil
		}},
		{
			// Long provisioning: the background Creates stop after the CSI
			// server (internal/lifecycle/provisioning.go).
			name: "provisions",
			stop: func() error {
				if err := d.engine.StopProvisions(); err != nil {
					log.Error(err, "Background Creates did not return after their cancellation; the next start rolls their volumes back")
				}
				return nil
			},
		},
		d.grpcComponent(log, sock),
		d.registrarComponent(log, sock),
		d.binaryPagesComponent(log),
		{
			name:  "ready",
			start: func(context.Context) error { d.ready.Store(true); return nil },
			stop:  func() error { d.ready.Store(false); return nil },
		},
	}}
}

// planString is MemoryNeeded for a log: -1 is unbounded.
func planString(n int64) string {
	if n < 0 {
		return "unbounded (--content-capacity=-1)"
	}
	return words.Bytes(n)
}

// SetMemoryLimit is debug.SetMemoryLimit, replaced by tests.
var SetMemoryLimit = debug.SetMemoryLimit

// memoryLimitComponent sets the Go runtime's soft memory limit from
// Options.Limits.MemoryLimit, unless GOMEMLIMIT is set, and puts the previous
// one back when the driver stops.
func (d *Daemon) memoryLimitComponent(log klog.Logger) component {
	prev := int64(-1)
	return component{
		name: "memory-limit",
		start: func(context.Context) error {
			limit := d.cfg.Limits.MemoryLimit
			if limit == 0 {
				return nil
			}
			if env, set := os.LookupEnv("GOMEMLIMIT"); set {
				log.V(2).Info("GOMEMLIMIT is set; not deriving Go's memory limit from the container's", logkeys.Limit, env)
				return nil
			}
			if need := d.cfg.Limits.MemoryNeeded; need < 0 || need > limit {
				log.Info("The memory limit does not hold the driver's memory plan (docs/operations.md, \"The memory plan\"): the kernel may OOM-kill the driver under the load its bounds admit; raise the limit, or lower --content-capacity, --content-bytes-in-flight or --stats-max-walks",
					logkeys.ContainerLimit, words.Bytes(limit), logkeys.Limit, planString(need))
			}
			held := d.cfg.Limits.HeldCapacity
			goLimit := d.cfg.Limits.GoMemoryLimit
			prev = SetMemoryLimit(goLimit)
			if held > 0 {
				log.V(2).Info("Set Go's soft memory limit from the container's, less the content capacity", logkeys.Limit, words.Bytes(goLimit), logkeys.ContainerLimit, words.Bytes(limit), logkeys.ContentCapacity, words.Bytes(held))
			} else {
				log.V(2).Info("Set Go's soft memory limit from the container's", logkeys.Limit, words.Bytes(goLimit), logkeys.ContainerLimit, words.Bytes(limit))
			}
			return nil
		},
		stop: func() error {
			if prev >= 0 {
				SetMemoryLimit(prev)
			}
			return nil
		},
	}
}

// ReleaseBinaryPages is exepages.Release, replaced by tests.
var ReleaseBinaryPages = exepages.Release

// binaryPagesComponent gives back the pages of the executable that starting
// up touched, once the driver serves and before it says it is ready, unless
// Options.Limits.KeepBinaryPages. It never fails the driver: a kernel or
// platform that cannot is logged.
func (d *Daemon) binaryPagesComponent(log klog.Logger) component {
	return component{name: "binary-pages", start: func(context.Context) error {
		if d.cfg.Limits.KeepBinaryPages {
			return nil
		}
		res, err := ReleaseBinaryPages()
		switch {
		case errors.Is(err, exepages.ErrUnsupported):
			log.V(4).Info("Not releasing the binary's startup pages", logkeys.Reason, err.Error())
		case err != nil:
			log.Error(err, "Cannot release the binary's startup pages; they stay resident")
		default:
			log.V(2).Info("Released the binary's startup pages", logkeys.Mappings, res.Mappings,
				logkeys.ResidentBefore, words.Bytes(int64(res.ResidentBefore)), logkeys.ResidentAfter, words.Bytes(int64(res.ResidentAfter)))
		}
		return nil
	}}
}

// stateComponent opens the state, unless Options.State.Store is set, and
// closes what it opened.
func (d *Daemon) stateComponent(log klog.Logger) component {
	opened := false
	return component{
		name: "state",
		start: func(context.Context) error {
			if d.engine.Store() != nil {
				return nil
			}
			st, err := d.openState(log)
			if err != nil {
				return err
			}
			d.engine.SetStore(st)
			opened = true
			return nil
		},
		stop: func() error {
			if !opened {
				return nil
			}
			if err := d.engine.Store().Close(); err != nil {
				return fmt.Errorf("closing driver state: %w", err)
			}
			return nil
		},
	}
}

// httpComponent serves Options.Observability.MetricsAddress, if set.
func (d *Daemon) httpComponent(log klog.Logger) component {
	var stop func()
	return component{
		name: "http",
		start: func(context.Context) (err error) {
			stop, err = d.serveHTTP(log)
			return err
		},
		stop: func() error { stop(); return nil },
	}
}

// runnablesComponent runs the CSIDriver check and Options.Runnables until
// it stops. An error a runnable returns is logged; the driver keeps serving.
func (d *Daemon) runnablesComponent(log klog.Logger) component {
	return component{name: "runnables", run: func(ctx context.Context) error {
		var wg sync.WaitGroup
		if check := d.cfg.Observability.CheckCSIDriver; check != nil {
			wg.Go(func() { check(klog.NewContext(ctx, log)) })
		} else {
			log.Info(d.cfg.Observability.NoCSIDriverCheck)
		}
		for _, r := range d.cfg.Runnables {
			wg.Go(func() {
				if err := r.Run(ctx); err != nil && ctx.Err() == nil {
					log.Error(err, "A runnable of the driver stopped", logkeys.Runnable, fmt.Sprintf("%T", r))
				}
			})
		}
		wg.Wait()
		return nil
	}}
}

// grpcComponent serves the CSI Identity and Node services on sock. Stopping
// it lets calls in flight finish (up to 10s), then removes the socket if it
// is still this process's.
func (d *Daemon) grpcComponent(log klog.Logger, sock string) component {
	var (
		lis *unixsock.Listener
		srv *grpc.Server
	)
	return component{
		name: "grpc",
		start: func(context.Context) (err error) {
			if err := os.MkdirAll(filepath.Dir(sock), 0o700); err != nil {
				return fmt.Errorf("creating socket dir: %w", err)
			}
			lis, err = unixsock.Listen(sock, 0o600)
			if errors.Is(err, unixsock.ErrInUse) {
				return d.endpointInUse(err)
			}
			if err != nil {
				return fmt.Errorf("CSI endpoint %s: %w", d.cfg.Node.Endpoint, err)
			}
			// The kubelet dials a new connection for every call, so a burst of
			// publishes is a burst of connections, each with gRPC's 32 KiB read and
			// write buffers by default. CSI messages are a few KiB: 4 KiB buffers
			// take a burst's anonymous memory down (docs/operations.md, "Memory
			// and CPU of the driver", has the numbers). gRPC already returns the
			// write buffer to a pool after each flush.
			//
			// Every call is a new stream, by default on a new goroutine whose
			// stack then grows, by copying, through the interceptor, the
			// validation, the store and the logging (runtime.newstack stood out
			// in the driver's CPU profile under the kubelet-shaped load).
			// GOMAXPROCS stream workers keep their grown stacks from call to
			// call, for less CPU per cycle in framework's
			// BenchmarkPublishUnpublish (test/bench/README.md, "Stream workers
			// and the records in memory", has the numbers). gRPC starts a
			// goroutine as before when they are all busy, so a slow call never
			// queues the others.
			srv = grpc.NewServer(grpc.UnaryInterceptor(d.csi.Intercept), grpc.ReadBufferSize(4<<10), grpc.WriteBufferSize(4<<10),
				grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))))
			d.csi.Register(srv)
			return nil
		},
		run: func(ctx context.Context) error {
			served := make(chan error, 1)
			go func() { served <- srv.Serve(lis) }()
			log.Info("Serving CSI", logkeys.Endpoint, d.cfg.Node.Endpoint, logkeys.Version, d.cfg.Node.Version, logkeys.Node, d.cfg.Node.ID)
			var err error
			select {
			case <-ctx.Done():
			case err = <-served:
			}
			stopGracefully(srv, 10*time.Second)
			if removed, uerr := lis.Unlink(); uerr != nil {
				log.Error(uerr, "Cannot remove CSI socket")
			} else if !removed {
				log.Info("CSI socket was removed or replaced by another process; leaving the path alone", logkeys.Endpoint, d.cfg.Node.Endpoint)
			}
			return err
		},
		// Serve closes lis when it stops; this covers a stop before Serve.
		// Close removes the socket only if it is still this process's.
		stop: func() error { lis.Close(); return nil },
	}
}

// registrarComponent serves the kubelet plugin registration socket when
// Options.Node.RegisterWithKubelet is set.
func (d *Daemon) registrarComponent(log klog.Logger, sock string) component {
	var reg *registration.Registrar
	return component{
		name: "registrar",
		start: func(context.Context) (err error) {
			if !d.cfg.Node.RegisterWithKubelet {
				return nil
			}
			reg, err = registration.New(registration.Options{
				DriverName:      d.cfg.DriverName,
				Endpoint:        sock,
				RegistrationDir: filepath.Join(d.cfg.Node.KubeletRootDir, "plugins_registry"),
				Logger:          log,
			})
			return err
		},
		run: func(ctx context.Context) error {
			if reg == nil {
				return nil
			}
			if err := reg.Run(ctx); err != nil {
				return fmt.Errorf("kubelet registration: %w", err)
			}
			return nil
		},
	}
}
