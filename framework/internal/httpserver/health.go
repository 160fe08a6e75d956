package httpserver

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"

	"github.com/ephemera-csi/ephemera/framework/internal/unixsock"
)

// DefaultLivenessTimeout bounds the Probe of /healthz; below the deploy's
// livenessProbe timeoutSeconds (5), so the kubelet gets the reason.
const DefaultLivenessTimeout = 4 * time.Second

// Health answers the driver's /healthz (ServeHealthz) and /readyz
// (ServeReadyz).
type Health struct {
	// Serving reports whether the driver serves: its startup reconcile
	// finished and its shutdown did not begin.
	Serving func() bool
	// Healthy reports whether the driver's state store answers.
	Healthy func(context.Context) error
	// Socket is the path of the driver's CSI socket, Endpoint the endpoint
	// it names (for messages).
	Socket, Endpoint string
	// LivenessTimeout bounds the Probe of Liveness; 0 is
	// DefaultLivenessTimeout.
	LivenessTimeout time.Duration
}

// Readiness is nil when the driver serves and its state store answers.
// Serving is asked first, so the store is never touched before the driver
// has opened it.
func (h *Health) Readiness(ctx context.Context) error {
	if !h.Serving() {
		return fmt.Errorf("not serving: the startup reconcile has not finished, or the driver is stopping")
	}
	return h.Healthy(ctx)
}

// Liveness probes the driver through its own CSI socket, as the kubelet and
// the registrar reach it: the listener, the gRPC server, its interceptor and
// the state store all take part. It is nil before the driver serves (a
// startup reconcile on a full node may take long).
func (h *Health) Liveness(ctx context.Context) error {
	if !h.Serving() {
		return nil
	}
	timeout := h.LivenessTimeout
	if timeout <= 0 {
		timeout = DefaultLivenessTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := unixsock.DialGRPC(h.Socket, nil)
	if err != nil {
		return fmt.Errorf("CSI Probe over %s: %w", h.Endpoint, err)
	}
	defer conn.Close()
	// Judged as the livenessprobe sidecar judges: an error or "not ready"
	// (a store that fails) is unhealthy; a restart reopens the store.
	resp, err := csi.NewIdentityClient(conn).Probe(ctx, &csi.ProbeRequest{}, grpc.WaitForReady(true))
	if err != nil {
		return fmt.Errorf("CSI Probe over %s: %w", h.Endpoint, err)
	}
	if !resp.GetReady().GetValue() && h.Serving() {
		return fmt.Errorf("CSI Probe over %s: not ready", h.Endpoint)
	}
	return nil
}

// ServeHealthz is /healthz: 200 "ok", or 503 with Liveness's reason.
func (h *Health) ServeHealthz(w http.ResponseWriter, r *http.Request) {
	respond(w, h.Liveness(r.Context()))
}

// ServeReadyz is /readyz: 200 "ok", or 503 with Readiness's reason (the
// state store given 5 seconds to answer).
func (h *Health) ServeReadyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	respond(w, h.Readiness(ctx))
}

func respond(w http.ResponseWriter, err error) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, err)
		return
	}
	fmt.Fprintln(w, "ok")
}
