package pluginserver

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/api"
	pb "github.com/ephemera-csi/ephemera/api/plugin/v1alpha1"
	"github.com/ephemera-csi/ephemera/framework"
	"github.com/ephemera-csi/ephemera/framework/internal/errkind"
	"github.com/ephemera-csi/ephemera/framework/internal/logkeys"
	"github.com/ephemera-csi/ephemera/framework/internal/unixsock"
	"github.com/ephemera-csi/ephemera/framework/plugin"
)

// Options configure a plugin server.
type Options struct {
	// Name and Version identify the plugin in the driver's logs. Name is
	// required.
	Name    string
	Version string
	// Endpoint is the socket to listen on: "unix:///path.sock" or an
	// absolute path. Required for Run.
	Endpoint string
	// SocketMode is the socket file's permission bits. Default 0o660: the
	// driver runs as root; a plugin running as another user shares a group.
	SocketMode fs.FileMode
	// Dir is the directory shared with the driver; directories Backend.Create
	// returns must lie below it.
	Dir string
	// Backend provides storage (CREATE, and VALIDATE, LIST, CHECK when it
	// implements Validator, Lister, HealthChecker). Nil: the plugin provides
	// content only and the driver mounts a tmpfs; a backend that does not
	// create anything (Create returning a tmpfs) may still validate.
	Backend framework.Backend
	// Content fills the volumes (CONTENT). A Backend that is a
	// ContentProvider is used when Content is nil.
	Content framework.ContentProvider
	// Authorizer approves volumes (AUTHORIZE). A Backend that is an
	// Authorizer is used when Authorizer is nil.
	Authorizer framework.Authorizer
	// Logger defaults to klog's. Requests are logged at V(4) as method,
	// volume ID, code and duration: never their secrets or tokens.
	Logger klog.Logger
}

// Server is a plugin server: New, then Run. Its calls are served only through
// Run, which recovers a handler's panic and answers every error by the
// module's one error table (framework/internal/errkind): a backend's error
// crosses the socket with its kind and has the same code in the driver as in
// process.
type Server struct {
	opts Options
	caps []pb.Capability
	val  bool // VALIDATE: the backend is a Validator or an AttributeDeclarer
	list framework.Lister
	hc   framework.HealthChecker
}

// New checks opts and returns a server; nothing listens before Run.
func New(opts Options) (*Server, error) {
	if opts.Name == "" {
		return nil, errors.New("pluginserver: Options.Name is required")
	}
	if opts.Dir != "" && !filepath.IsAbs(opts.Dir) {
		return nil, fmt.Errorf("pluginserver: Dir %q must be an absolute path", opts.Dir)
	}
	if opts.SocketMode == 0 {
		opts.SocketMode = 0o660
	}
	if opts.Logger.GetSink() == nil {
		opts.Logger = klog.Background()
	}
	s := &Server{opts: opts}
	if b := opts.Backend; b != nil {
		if opts.Content == nil {
			opts.Content, _ = framework.As[framework.ContentProvider](b)
		}
		if opts.Authorizer == nil {
			opts.Authorizer, _ = framework.As[framework.Authorizer](b)
		}
		s.caps = append(s.caps, pb.Capability_CAPABILITY_CREATE)
		var ok bool
		_, validates := framework.As[framework.Validator](b)
		_, declares := framework.As[framework.AttributeDeclarer](b)
		if s.val = validates || declares; s.val {
			s.caps = append(s.caps, pb.Capability_CAPABILITY_VALIDATE)
		}
		if s.list, ok = framework.As[framework.Lister](b); ok {
			s.caps = append(s.caps, pb.Capability_CAPABILITY_LIST)
		}
		if s.hc, ok = framework.As[framework.HealthChecker](b); ok {
			s.caps = append(s.caps, pb.Capability_CAPABILITY_CHECK)
		}
		if _, ok = framework.As[framework.LongProvisioner](b); ok {
			s.caps = append(s.caps, pb.Capability_CAPABILITY_LONG_PROVISIONING)
		}
	}
	if opts.Content != nil {
		s.caps = append(s.caps, pb.Capability_CAPABILITY_CONTENT)
	}
	if opts.Authorizer != nil {
		s.caps = append(s.caps, pb.Capability_CAPABILITY_AUTHORIZE)
	}
	if len(s.caps) == 0 {
		return nil, errors.New("pluginserver: nothing to serve: set Backend, Content or Authorizer")
	}
	slices.Sort(s.caps)
	s.opts = opts
	return s, nil
}

// Serve is New and Run.
func Serve(ctx context.Context, opts Options) error {
	s, err := New(opts)
	if err != nil {
		return err
	}
	return s.Run(ctx)
}

// service is the plugin service of a Server: unexported, so that every call
// goes through Run's interceptor.
type service struct {
	pb.UnimplementedPluginServer
	*Server
}

// Run listens on Options.Endpoint and serves until ctx ends, then stops
// gracefully (calls in flight finish) and removes the socket.
func (s *Server) Run(ctx context.Context) error {
	p, err := unixsock.EndpointPath(s.opts.Endpoint)
	if err != nil {
		return fmt.Errorf("pluginserver: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
		return fmt.Errorf("pluginserver: %w", err)
	}
	ln, err := unixsock.Listen(p, s.opts.SocketMode)
	if err != nil {
		return fmt.Errorf("pluginserver: %w", err)
	}
	g := grpc.NewServer(grpc.ChainUnaryInterceptor(s.logCalls))
	pb.RegisterPluginServer(g, service{Server: s})
	s.opts.Logger.Info("Serving plugin", logkeys.Plugin, s.opts.Name, logkeys.Version, s.opts.Version,
		logkeys.Endpoint, p, logkeys.Capabilities, capNames(s.caps))
	done := make(chan error, 1)
	go func() { done <- g.Serve(listener{ln}) }()
	select {
	case <-ctx.Done():
		g.GracefulStop()
		<-done
		_, _ = ln.Unlink()
		return nil
	case err := <-done:
		_, _ = ln.Unlink()
		return err
	}
}

// listener adapts unixsock's listener to net.Listener.
type listener struct{ *unixsock.Listener }

var _ net.Listener = listener{}

// logCalls logs each call's method, volume, code and duration at V(4); a
// panic in a handler becomes Internal instead of killing the plugin, and
// every error is answered with its kind (errkind.WireStatus).
func (s *Server) logCalls(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	start := time.Now()
	defer func() {
		if r := recover(); r != nil {
			err = errkind.With(errkind.ErrInternal, fmt.Errorf("plugin %s: %s panicked: %v", s.opts.Name, info.FullMethod, r))
			s.opts.Logger.Error(nil, "Plugin call panicked", logkeys.Method, info.FullMethod, logkeys.Err, fmt.Sprint(r))
		}
		err = errkind.WireStatus(err)
		var id string
		if r, ok := req.(interface{ GetVolume() *pb.Volume }); ok {
			id = r.GetVolume().GetId()
		}
		s.opts.Logger.V(4).Info("Plugin call", logkeys.Method, info.FullMethod, logkeys.VolumeID, id,
			logkeys.Code, status.Code(err).String(), logkeys.Duration, time.Since(start))
	}()
	return handler(ctx, req)
}

func capNames(cs []pb.Capability) []string {
	out := make([]string, 0, len(cs))
	for _, c := range cs {
		out = append(out, strings.TrimPrefix(c.String(), "CAPABILITY_"))
	}
	return out
}

// unimplemented is the answer to a call the handshake did not offer.
func (s *Server) unimplemented(c pb.Capability) error {
	return errkind.Bare(codes.Unimplemented, "plugin %s does not implement %s", s.opts.Name, strings.TrimPrefix(c.String(), "CAPABILITY_"))
}

// Handshake implements the protocol's handshake.
func (s service) Handshake(_ context.Context, req *pb.HandshakeRequest) (*pb.HandshakeResponse, error) {
	if !slices.Contains(req.GetProtocolVersions(), plugin.ProtocolVersion) {
		return nil, errkind.Bare(codes.FailedPrecondition, "plugin %s speaks protocol %s; the driver offered %q",
			s.opts.Name, plugin.ProtocolVersion, req.GetProtocolVersions())
	}
	return &pb.HandshakeResponse{Name: s.opts.Name, Version: s.opts.Version, ProtocolVersion: plugin.ProtocolVersion, Capabilities: s.caps}, nil
}

// Validate runs the backend's Validator.
func (s service) Validate(_ context.Context, req *pb.ValidateRequest) (*pb.ValidateResponse, error) {
	if !s.val {
		return nil, s.unimplemented(pb.Capability_CAPABILITY_VALIDATE)
	}
	v := plugin.FromProto(req.GetVolume(), s.opts.Name)
	if err := framework.ValidateVolume(s.opts.Backend, v); err != nil {
		return nil, err
	}
	return &pb.ValidateResponse{SizeBytes: v.Size}, nil
}

// Create runs the backend's Create and turns its source into the protocol's.
func (s service) Create(ctx context.Context, req *pb.CreateRequest) (*pb.CreateResponse, error) {
	if s.opts.Backend == nil {
		return nil, s.unimplemented(pb.Capability_CAPABILITY_CREATE)
	}
	v := plugin.FromProto(req.GetVolume(), s.opts.Name)
	v.Secrets, v.Tokens = req.GetSecrets(), plugin.TokensFromProto(req.GetTokens())
	if ad, ok := framework.As[framework.AttributeDeclarer](s.opts.Backend); ok {
		// As the framework hands Create a volume: declared attributes in Values.
		if err := ad.Attributes().Apply(v); err != nil {
			return nil, err
		}
	}
	src, err := s.opts.Backend.Create(ctx, v)
	if err != nil {
		return nil, err
	}
	ps, err := s.source(src)
	if err != nil {
		return nil, err
	}
	return &pb.CreateResponse{Source: ps, State: v.State}, nil
}

// source is src as the protocol carries it.
func (s *Server) source(src api.Source) (*pb.Source, error) {
	if src.IsDir() {
		rel, err := filepath.Rel(s.opts.Dir, src.Path)
		if s.opts.Dir == "" || err != nil || !filepath.IsLocal(rel) {
			return nil, errkind.Bare(codes.Internal, "plugin %s: the backend returned directory %q, which is not below the directory shared with the driver (Options.Dir %q)",
				s.opts.Name, src.Path, s.opts.Dir)
		}
		return &pb.Source{Kind: &pb.Source_Directory{Directory: &pb.Directory{Path: filepath.ToSlash(rel)}}}, nil
	}
	if src.FSType != "tmpfs" {
		return nil, errkind.Bare(codes.Internal, "plugin %s: the backend returned a %s filesystem on %q; protocol %s carries directories and tmpfs only",
			s.opts.Name, src.FSType, src.Path, plugin.ProtocolVersion)
	}
	if src.Tmpfs == nil {
		return nil, errkind.Bare(codes.Internal, "plugin %s: the backend returned a tmpfs source without its settings (api.Source.Tmpfs); return what tmpfs.Backend's Create returns",
			s.opts.Name)
	}
	t := &pb.Tmpfs{Mode: uint32(api.ModeBits(src.Tmpfs.Mode)), Uid: src.Tmpfs.UID, Gid: src.Tmpfs.GID}
	return &pb.Source{Kind: &pb.Source_Tmpfs{Tmpfs: t}}, nil
}

// Delete runs the backend's Delete.
func (s service) Delete(ctx context.Context, req *pb.DeleteRequest) (*pb.DeleteResponse, error) {
	if s.opts.Backend == nil {
		return nil, s.unimplemented(pb.Capability_CAPABILITY_CREATE)
	}
	if err := s.opts.Backend.Delete(ctx, plugin.FromProto(req.GetVolume(), s.opts.Name)); err != nil {
		return nil, err
	}
	return &pb.DeleteResponse{}, nil
}

// List runs the backend's Lister.
func (s service) List(ctx context.Context, _ *pb.ListRequest) (*pb.ListResponse, error) {
	if s.list == nil {
		return nil, s.unimplemented(pb.Capability_CAPABILITY_LIST)
	}
	ids, err := s.list.List(ctx)
	if err != nil {
		return nil, err
	}
	return &pb.ListResponse{VolumeIds: ids}, nil
}

// Check runs the backend's HealthChecker.
func (s service) Check(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	if s.hc == nil {
		return nil, s.unimplemented(pb.Capability_CAPABILITY_CHECK)
	}
	if err := s.hc.Check(ctx, plugin.FromProto(req.GetVolume(), s.opts.Name)); err != nil {
		return &pb.CheckResponse{Abnormal: true, Message: err.Error()}, nil
	}
	return &pb.CheckResponse{}, nil
}

// Content runs the content provider.
func (s service) Content(ctx context.Context, req *pb.ContentRequest) (*pb.ContentResponse, error) {
	if s.opts.Content == nil {
		return nil, s.unimplemented(pb.Capability_CAPABILITY_CONTENT)
	}
	v := plugin.FromProto(req.GetVolume(), s.opts.Name)
	v.Secrets, v.Tokens = req.GetSecrets(), plugin.TokensFromProto(req.GetTokens())
	files, err := s.opts.Content.Content(ctx, v)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(files))
	for p := range files {
		names = append(names, p)
	}
	slices.Sort(names)
	resp := &pb.ContentResponse{Files: make([]*pb.File, 0, len(files))}
	for _, p := range names {
		f := files[p]
		resp.Files = append(resp.Files, &pb.File{Path: filepath.ToSlash(p), Data: f.Data, Mode: api.ModeBits(f.Mode)})
	}
	return resp, nil
}

// Authorize runs the authorizer: a refusal wrapping api.ErrPermissionDenied
// is an answer, any other error a failed call.
func (s service) Authorize(ctx context.Context, req *pb.AuthorizeRequest) (*pb.AuthorizeResponse, error) {
	if s.opts.Authorizer == nil {
		return nil, s.unimplemented(pb.Capability_CAPABILITY_AUTHORIZE)
	}
	err := s.opts.Authorizer.Authorize(ctx, plugin.FromProto(req.GetVolume(), s.opts.Name))
	switch {
	case err == nil:
		return &pb.AuthorizeResponse{Allowed: true}, nil
	case errors.Is(err, api.ErrPermissionDenied):
		return &pb.AuthorizeResponse{Reason: strings.TrimPrefix(err.Error(), api.ErrPermissionDenied.Error()+": ")}, nil
	default:
		return nil, err
	}
}
