// Package httpserver runs the driver's small HTTP endpoint (metrics, health
// and /volumes): [Handler] routes it, [Health] answers /healthz and /readyz,
// [Start] binds before it returns a [Server], so the caller knows the
// address and a bad address fails startup, and the Server stops gracefully.
package httpserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/framework/internal/logkeys"
)

// Server is a started HTTP server.
type Server struct {
	srv  *http.Server
	addr string
	done chan struct{}
}

// Start listens on addr ("host:port"; port 0 picks a free one) and serves h in
// the background.
func Start(addr string, h http.Handler, log klog.Logger) (*Server, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening for metrics and health on %s: %w", addr, err)
	}
	s := &Server{
		srv: &http.Server{
			Handler:           h,
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       10 * time.Second,
			WriteTimeout:      30 * time.Second,
			IdleTimeout:       60 * time.Second,
			MaxHeaderBytes:    16 << 10,
		},
		addr: lis.Addr().String(),
		done: make(chan struct{}),
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error(err, "HTTP server stopped", logkeys.Address, s.addr)
		}
	}()
	return s, nil
}

// Addr is the address the server listens on, with the port it got.
func (s *Server) Addr() string { return s.addr }

// Stop lets requests in progress finish for up to grace, then closes every
// connection, and waits for the server to end.
func (s *Server) Stop(grace time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if err := s.srv.Shutdown(ctx); err != nil {
		s.srv.Close()
	}
	<-s.done
}
