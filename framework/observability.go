package framework

import (
	"context"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/csiserver"
	"github.com/ephemera-csi/ephemera/framework/internal/daemon"
	"github.com/ephemera-csi/ephemera/framework/internal/httpserver"
	"github.com/ephemera-csi/ephemera/framework/internal/metrics"
)

// initObservability creates the driver's metrics (in its own registry) and its
// HTTP handler. Called once by New; starts nothing.
func (d *Driver) initObservability() {
	cfg := metrics.Config{
		DriverName: d.opts.DriverName,
		Version:    d.opts.Node.Version,
		Backends:   backendNames(d.opts.Backends),
		Capacity:   d.opts.Limits.Capacity,
		Methods:    csiserver.Methods(),
		Usage:      d.engine.Usage,
		Inflight:   d.engine.InFlight,
	}
	if d.engine.AnyContent() {
		cfg.ContentHeld, cfg.ContentCapacity = d.engine.HeldContent, d.opts.Volumes.ContentCapacity
		mode, _ := d.engine.Charging()
		cfg.ContentCharging = string(mode)
	}
	d.metrics = metrics.New(cfg)
	sock, _ := daemon.SocketPath(d.opts.Node.Endpoint) // validated by New
	d.health = &httpserver.Health{
		Serving:  d.ready.Load,
		Healthy:  d.healthy,
		Socket:   sock,
		Endpoint: d.opts.Node.Endpoint,
	}
	var volumes func(context.Context) (*api.VolumeList, error)
	if d.opts.Observability.VolumesEndpoint == nil || *d.opts.Observability.VolumesEndpoint {
		volumes = d.volumeList
	}
	d.handler = httpserver.Handler(d.metrics.Handler(), d.health, volumes)
}

// Handler serves the driver's metrics and health, for authors who run their
// own HTTP server instead of setting Options.Observability.MetricsAddress:
//
//   - /metrics: Prometheus metrics (see package framework/metrics);
//   - /healthz: liveness. 200 before the driver serves (a startup reconcile
//     on a full node may take long) and, once it serves, when a CSI Probe
//     sent through the driver's own socket answers ready within 4 seconds (as
//     the livenessprobe sidecar judges): the listener, the gRPC server, the
//     interceptor and the state store all take part, so a wedged server, a
//     hung or a failing store fails it; 503 with the reason otherwise;
//   - /readyz: 200 once the startup reconcile is done and while the state store
//     answers, 503 with the reason otherwise (readiness; the same condition as
//     a ready CSI Probe);
//   - /volumes: the volumes the driver holds on this node, as a [api.VolumeList]
//     in JSON (pod namespace, name and UID, volume name, backend, size,
//     phase, creation time, and the usage of mounted volumes; never
//     attributes or secrets); 503 until the driver serves; not served (404)
//     with Options.Observability.VolumesEndpoint false.
//
// It may be mounted before Run starts; /readyz then says not ready.
func (d *Driver) Handler() http.Handler { return d.handler }

// MetricsAddr returns the address the Options.Observability.MetricsAddress server listens
// on, with the port it got (useful with ":0" in tests), or "" when it is not
// serving.
func (d *Driver) MetricsAddr() string { return d.daemon.MetricsAddr() }

// MetricsRegistry is the driver's Prometheus registry. A driver may register
// its own collectors there; they are served with the framework's metrics.
func (d *Driver) MetricsRegistry() prometheus.Registerer { return d.metrics.Registry() }
