package csiserver

import (
	"context"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-lib-utils/protosanitizer"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"k8s.io/klog/v2"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/errkind"
	"github.com/ephemera-csi/ephemera/framework/internal/logkeys"
	"github.com/ephemera-csi/ephemera/framework/internal/metrics"
)

// Node is what the services call for the volume requests: the framework
// root's volume lifecycle and state. Requests reach it read and checked.
type Node interface {
	// Publish is NodePublishVolume of a parsed request.
	Publish(ctx context.Context, p *Publish) error
	// Unpublish is NodeUnpublishVolume of a checked volume ID and target
	// path (the handle matches the target path's pod and volume).
	Unpublish(ctx context.Context, volumeID, targetPath string) error
	VolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error)
	VolumeHealth(ctx context.Context, req *csi.NodeGetVolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error)
	// Healthy reports whether the driver can serve (its state store
	// answers); Ready whether it is done starting (the startup reconcile).
	Healthy(ctx context.Context) error
	Ready() bool
}

// Server holds what the services answer. Its fields are set once, before
// Register.
type Server struct {
	Node    Node
	Parser  *Parser
	Logger  klog.Logger
	Metrics *metrics.Metrics
	// The answers of the calls about the driver, built once.
	PluginInfo   *csi.GetPluginInfoResponse
	NodeInfo     *csi.NodeGetInfoResponse
	Capabilities *csi.NodeGetCapabilitiesResponse
}

// Register puts the Identity and Node services on srv, which must have been
// made with s.Intercept as its unary interceptor.
func (s *Server) Register(srv *grpc.Server) {
	csi.RegisterIdentityServer(srv, identityServer{s: s})
	csi.RegisterNodeServer(srv, nodeServer{s: s})
}

// Intercept wraps every RPC: it attaches a contextual logger carrying the
// volume's identity, logs the sanitized request and the outcome, turns panics into
// Internal and maps every error through errkind.Status.
//
// Outcomes are logged by what they mean to an operator: a failure of the driver
// or the node (Internal, Unavailable, DeadlineExceeded, Unknown, DataLoss) is an
// error; a refused request (bad input, a busy volume, a full budget: the pod's
// author or the kubelet's retry deals with it) is Info at V(2); success is
// logged by the handler (publish, unpublish) at V(2), and here at V(4). The two
// calls the kubelet makes around every publish (NodeGetCapabilities) and
// probes are counted, never logged.
func (s *Server) Intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	start := time.Now()
	if info.FullMethod == "/csi.v1.Node/NodeGetCapabilities" || info.FullMethod == "/csi.v1.Identity/Probe" {
		defer func() {
			if p := recover(); p != nil {
				s.Logger.Error(fmt.Errorf("panic: %v", p), "Handler panicked", logkeys.Method, info.FullMethod, logkeys.Stack, string(debug.Stack()))
				err = errkind.Errorf(errkind.ErrInternal, "internal error in %s: %v", info.FullMethod, p)
			}
			err = errkind.Status(err)
			s.Metrics.ObserveRPC(info.FullMethod, status.Code(err), time.Since(start))
		}()
		return handler(ctx, req)
	}
	log := s.requestLogger(info.FullMethod, req)
	ctx = klog.NewContext(ctx, log)
	if v := log.V(4); v.Enabled() {
		v.Info("Request", logkeys.Request, sanitize(req))
	}
	defer func() {
		if p := recover(); p != nil {
			log.Error(fmt.Errorf("panic: %v", p), "Handler panicked", logkeys.Stack, string(debug.Stack()))
			err = errkind.Errorf(errkind.ErrInternal, "internal error in %s: %v", info.FullMethod, p)
		}
		err = errkind.Status(err)
		code := status.Code(err)
		s.Metrics.ObserveRPC(info.FullMethod, code, time.Since(start))
		switch code {
		case codes.OK:
			log.V(4).Info("Request done", logkeys.Duration, time.Since(start))
		case codes.Internal, codes.Unavailable, codes.DeadlineExceeded, codes.Unknown, codes.DataLoss:
			log.Error(err, "Request failed", logkeys.Code, code, logkeys.Duration, time.Since(start))
		default:
			log.V(2).Info("Request refused", logkeys.Code, code, logkeys.Reason, status.Convert(err).Message(), logkeys.Duration, time.Since(start))
		}
	}()
	return handler(ctx, req)
}

// requestLogger is the logger of one request, with its method and, when
// set, the volume ID, target path and pod: in one WithValues for the volume
// requests (each call copies the values so far into a new logger), key by
// key for the others.
func (s *Server) requestLogger(method string, req any) klog.Logger {
	var id, target, ns, name, uid string
	if r, ok := req.(interface{ GetVolumeId() string }); ok {
		id = r.GetVolumeId()
	}
	if r, ok := req.(interface{ GetTargetPath() string }); ok {
		target = r.GetTargetPath()
	}
	if r, ok := req.(*csi.NodePublishVolumeRequest); ok {
		vc := r.GetVolumeContext()
		ns, name, uid = vc[api.KeyPodNamespace], vc[api.KeyPodName], vc[api.KeyPodUID]
	}
	base := s.Logger
	switch {
	case id != "" && target != "" && name != "":
		return base.WithValues(logkeys.Method, method, logkeys.VolumeID, id, logkeys.TargetPath, target,
			logkeys.Pod, klog.KRef(ns, name), logkeys.PodUID, uid)
	case id != "" && target != "":
		return base.WithValues(logkeys.Method, method, logkeys.VolumeID, id, logkeys.TargetPath, target)
	}
	log := base.WithValues(logkeys.Method, method)
	if id != "" {
		log = log.WithValues(logkeys.VolumeID, id)
	}
	if target != "" {
		log = log.WithValues(logkeys.TargetPath, target)
	}
	if name != "" {
		log = log.WithValues(logkeys.Pod, klog.KRef(ns, name), logkeys.PodUID, uid)
	}
	return log
}

// sanitize returns a log-safe view of a request: secrets stripped by
// protosanitizer, and service-account tokens (which arrive in volume_context,
// not a secret field, before Kubernetes 1.35) replaced too.
func sanitize(req any) fmt.Stringer {
	if r, ok := req.(*csi.NodePublishVolumeRequest); ok {
		if _, has := r.GetVolumeContext()[api.KeyServiceAccountTokens]; has {
			c := proto.Clone(r).(*csi.NodePublishVolumeRequest)
			c.VolumeContext[api.KeyServiceAccountTokens] = "***stripped***"
			req = c
		}
	}
	return protosanitizer.StripSecrets(req)
}

// identityServer and nodeServer are the CSI services Register puts on the
// gRPC server. They are unexported, so every CSI call reaches the driver
// through the gRPC server and its interceptor (codes, metrics, logging),
// never around it.
type identityServer struct {
	csi.UnimplementedIdentityServer
	s *Server
}

type nodeServer struct {
	csi.UnimplementedNodeServer
	s *Server
}

func (i identityServer) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return i.s.PluginInfo, nil
}

// GetPluginCapabilities: a node-only plugin has no controller service and no
// topology.
func (i identityServer) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{}, nil
}

// Probe is not ready until the startup reconcile finished, and fails when
// the state store is unusable.
func (i identityServer) Probe(ctx context.Context, _ *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	if err := i.s.Node.Healthy(ctx); err != nil {
		return nil, errkind.Errorf(errkind.ErrFailedPrecondition, "driver not healthy: %w", err)
	}
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(i.s.Node.Ready())}, nil
}

func (n nodeServer) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return n.s.NodeInfo, nil
}

// NodeGetCapabilities: the kubelet calls it twice per publish; the response
// is built once.
func (n nodeServer) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	return n.s.Capabilities, nil
}

func (n nodeServer) NodeStageVolume(context.Context, *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	return nil, errkind.Errorf(errkind.ErrUnimplemented, "NodeStageVolume: ephemeral inline volumes are never staged")
}

func (n nodeServer) NodeUnstageVolume(context.Context, *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	return nil, errkind.Errorf(errkind.ErrUnimplemented, "NodeUnstageVolume: ephemeral inline volumes are never staged")
}

func (n nodeServer) NodeExpandVolume(context.Context, *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	return nil, errkind.Errorf(errkind.ErrUnimplemented, "NodeExpandVolume: ephemeral inline volumes cannot be expanded")
}

// NodePublishVolume reads the request (Parser.Publish), then publishes.
func (n nodeServer) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	p, err := n.s.Parser.Publish(req)
	if err != nil {
		return nil, err
	}
	if err := n.s.Node.Publish(ctx, p); err != nil {
		return nil, err
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

// NodeUnpublishVolume checks the volume ID and target path
// (Parser.Unpublish), then unpublishes. It works from them alone and is OK
// when anything is already gone.
func (n nodeServer) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	if err := n.s.Parser.Unpublish(req); err != nil {
		return nil, err
	}
	if err := n.s.Node.Unpublish(ctx, req.GetVolumeId(), req.GetTargetPath()); err != nil {
		return nil, err
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

func (n nodeServer) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	return n.s.Node.VolumeStats(ctx, req)
}

func (n nodeServer) NodeGetVolumeHealth(ctx context.Context, req *csi.NodeGetVolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error) {
	return n.s.Node.VolumeHealth(ctx, req)
}
