package registration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/logkeys"
	"github.com/ephemera-csi/ephemera/framework/internal/unixsock"
)

// ErrRegistrationFailed is wrapped by the error that Run returns when the
// kubelet reports that it could not register the driver. The error message
// includes the kubelet's reason.
var ErrRegistrationFailed = errors.New("kubelet failed to register the plugin")

// defaultVersions is the value Options.Versions defaults to. The kubelet
// requires the highest version to be 1.x.
var defaultVersions = []string{"1.0.0"}

const (
	// socketSuffix is appended to the driver name to build the socket name, as
	// node-driver-registrar does.
	socketSuffix = "-reg.sock"
	// maxSocketPathLen is the longest path that can be bound to a UNIX socket on
	// Linux and Windows (sun_path is 108 bytes, including a terminating NUL).
	maxSocketPathLen = 107
	// gracefulStopTimeout bounds how long Run waits for in-flight RPCs on exit.
	gracefulStopTimeout = 2 * time.Second
	// dirMode is the mode of RegistrationDir when Run creates it.
	dirMode = 0o750
	// socketMode is the mode of the registration socket (ignored on Windows).
	socketMode = 0o600
)

// Options configures a Registrar.
type Options struct {
	// DriverName is the CSI driver name, as returned by GetPluginInfo. It must
	// follow the CSI spec format (at most 63 characters, alphanumerics, '-' and
	// '.'). Required.
	DriverName string
	// Endpoint is the absolute host path of the driver's CSI UNIX socket, which
	// the kubelet dials. It is a plain path, without a "unix://" scheme, and must
	// be the path as seen by the kubelet on the host. Required.
	Endpoint string
	// RegistrationDir is the absolute path of the kubelet's plugin registration
	// directory, <kubelet-root>/plugins_registry (usually
	// /var/lib/kubelet/plugins_registry). Run creates it with mode 0750 if it is
	// missing. Required.
	RegistrationDir string
	// Versions are the CSI versions reported to the kubelet, which requires the
	// highest one to be 1.x. Defaults to ["1.0.0"].
	Versions []string
	// Logger receives the Registrar's log messages. Defaults to klog.Background().
	Logger klog.Logger
}

func (o *Options) setDefaults() {
	if len(o.Versions) == 0 {
		o.Versions = defaultVersions
	}
	// Copy so that later changes to the caller's slice do not affect us.
	o.Versions = append([]string(nil), o.Versions...)
	if o.Logger.GetSink() == nil {
		o.Logger = klog.Background()
	}
}

func (o *Options) validate() error {
	if o.DriverName == "" {
		return errors.New("registration: DriverName is required")
	}
	if err := api.ValidateDriverName(o.DriverName); err != nil {
		return fmt.Errorf("registration: DriverName %w", err)
	}
	if o.Endpoint == "" {
		return errors.New("registration: Endpoint is required")
	}
	if !filepath.IsAbs(o.Endpoint) {
		return fmt.Errorf("registration: Endpoint %q must be an absolute host path without a scheme", o.Endpoint)
	}
	if o.RegistrationDir == "" {
		return errors.New("registration: RegistrationDir is required")
	}
	if !filepath.IsAbs(o.RegistrationDir) {
		return fmt.Errorf("registration: RegistrationDir %q must be an absolute path", o.RegistrationDir)
	}
	for i, v := range o.Versions {
		if v == "" {
			return fmt.Errorf("registration: Versions[%d] is empty", i)
		}
	}
	if p := socketPath(o.RegistrationDir, o.DriverName); len(p) > maxSocketPathLen {
		return fmt.Errorf("registration: socket path %q is %d bytes long, longer than the UNIX socket limit of %d", p, len(p), maxSocketPathLen)
	}
	return nil
}

func socketPath(dir, driverName string) string {
	return filepath.Join(dir, driverName+socketSuffix)
}

// A Registrar serves the kubelet plugin registration socket for one CSI driver.
// Create it with New and start it with Run. Its methods are safe for concurrent
// use.
type Registrar struct {
	opts       Options
	socketPath string
	logger     klog.Logger

	running    atomic.Bool
	registered atomic.Bool

	mu      sync.Mutex // guards lastErr and writes to registered
	lastErr string
}

// New validates opts and returns a Registrar. It does no I/O and starts no
// goroutines.
func New(opts Options) (*Registrar, error) {
	opts.setDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	p := socketPath(opts.RegistrationDir, opts.DriverName)
	return &Registrar{
		opts:       opts,
		socketPath: p,
		logger:     klog.LoggerWithValues(klog.LoggerWithName(opts.Logger, "registration"), "driver", opts.DriverName, "socket", p),
	}, nil
}

// SocketPath returns the path of the registration socket,
// RegistrationDir/<DriverName>-reg.sock.
func (r *Registrar) SocketPath() string { return r.socketPath }

// Registered reports whether the kubelet has reported a successful
// registration since Run created the socket.
func (r *Registrar) Registered() bool { return r.registered.Load() }

// Status returns whether the driver is registered and the error message of the
// kubelet's most recent failed registration. A successful registration clears
// lastErr.
func (r *Registrar) Status() (registered bool, lastErr string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.registered.Load(), r.lastErr
}

func (r *Registrar) setStatus(registered bool, lastErr string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.registered.Store(registered)
	r.lastErr = lastErr
}

func (r *Registrar) setUnregistered() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.registered.Store(false)
}

// Run creates the registration socket and serves the kubelet until ctx ends or
// the kubelet reports a failed registration. Start it only once the driver's
// CSI server answers NodeGetInfo.
//
// It returns nil when ctx ends, and an error wrapping ErrRegistrationFailed
// when the kubelet rejects the driver; the caller should then exit non-zero. On
// every return after the socket was created, it removes the socket (so the
// kubelet deregisters the driver), unless another process has replaced it.
// Run may be called again after it returns, but not concurrently.
func (r *Registrar) Run(ctx context.Context) error {
	if !r.running.CompareAndSwap(false, true) {
		return errors.New("registration: Run is already running")
	}
	defer r.running.Store(false)
	if ctx.Err() != nil {
		return nil
	}
	logger := r.logger

	if err := os.MkdirAll(r.opts.RegistrationDir, dirMode); err != nil {
		return fmt.Errorf("registration: create registration directory: %w", err)
	}
	lis, err := unixsock.Listen(r.socketPath, socketMode)
	if errors.Is(err, unixsock.ErrInUse) {
		return fmt.Errorf("registration: %w; is this driver running twice on the node, or node-driver-registrar deployed for it as well?", err)
	}
	if err != nil {
		return fmt.Errorf("registration: %w", err)
	}
	// gRPC also closes lis when it stops; Close is idempotent and removes the
	// socket only if it is still ours.
	defer lis.Close()

	r.setUnregistered()
	defer r.setUnregistered()

	failed := make(chan error, 1)
	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, &service{r: r, logger: logger, failed: failed})

	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	logger.Info("Serving kubelet plugin registration", logkeys.Endpoint, r.opts.Endpoint, logkeys.Versions, r.opts.Versions)

	var runErr error
	serveDone := false
	select {
	case <-ctx.Done():
		logger.V(2).Info("Stopping kubelet plugin registration")
	case runErr = <-failed:
	case err := <-served:
		// Serve returned without Stop: the listener failed.
		serveDone = true
		runErr = fmt.Errorf("registration: serve: %w", err)
	}
	// Remove the socket first, so the kubelet deregisters the driver; RPCs in
	// flight on established connections still complete. Only a socket that is
	// still ours is removed: a newer instance's survives.
	if removed, err := lis.Unlink(); err != nil {
		logger.Error(err, "Cannot remove registration socket")
	} else if !removed {
		logger.Info("Registration socket was removed or replaced by another process; leaving the path alone")
	}
	stopServer(srv)
	if !serveDone {
		<-served
	}
	return runErr
}

// stopServer stops srv gracefully, giving in-flight RPCs (such as the
// kubelet's NotifyRegistrationStatus) a short time to finish.
func stopServer(srv *grpc.Server) {
	done := make(chan struct{})
	go func() {
		srv.GracefulStop()
		close(done)
	}()
	t := time.NewTimer(gracefulStopTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		srv.Stop()
		<-done
	}
}

// service implements the kubelet's Registration gRPC service.
type service struct {
	registerapi.UnimplementedRegistrationServer

	r      *Registrar
	logger klog.Logger
	failed chan<- error
}

func (s *service) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	s.logger.V(4).Info("Kubelet called GetInfo")
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              s.r.opts.DriverName,
		Endpoint:          s.r.opts.Endpoint,
		SupportedVersions: append([]string(nil), s.r.opts.Versions...),
	}, nil
}

func (s *service) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if st.GetPluginRegistered() {
		s.r.setStatus(true, "")
		s.logger.Info("Registered with the kubelet")
		return &registerapi.RegistrationStatusResponse{}, nil
	}
	msg := st.GetError()
	if msg == "" {
		msg = "no reason given"
	}
	s.r.setStatus(false, msg)
	err := fmt.Errorf("%w: %s", ErrRegistrationFailed, msg)
	s.logger.Error(err, "Kubelet failed to register the plugin")
	select {
	case s.failed <- err:
	default: // Run is already stopping because of an earlier failure.
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}
