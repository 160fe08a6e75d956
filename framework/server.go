package framework

import (
	"context"
	"errors"
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
	"github.com/ephemera-csi/ephemera/framework/store"
)

// intercept wraps every RPC: it attaches a contextual logger carrying the
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
func (d *Driver) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	start := time.Now()
	if info.FullMethod == "/csi.v1.Node/NodeGetCapabilities" || info.FullMethod == "/csi.v1.Identity/Probe" {
		defer func() {
			if p := recover(); p != nil {
				d.opts.Observability.Logger.Error(fmt.Errorf("panic: %v", p), "Handler panicked", logkeys.Method, info.FullMethod, logkeys.Stack, string(debug.Stack()))
				err = errkind.Errorf(errkind.ErrInternal, "internal error in %s: %v", info.FullMethod, p)
			}
			err = errkind.Status(err)
			d.metrics.ObserveRPC(info.FullMethod, status.Code(err), time.Since(start))
		}()
		return handler(ctx, req)
	}
	log := d.requestLogger(info.FullMethod, req)
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
		d.metrics.ObserveRPC(info.FullMethod, code, time.Since(start))
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
func (d *Driver) requestLogger(method string, req any) klog.Logger {
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
	base := d.opts.Observability.Logger
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

// getPluginInfo implements csi.IdentityServer.
func (d *Driver) getPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return d.pluginInfo, nil
}

// getPluginCapabilities implements csi.IdentityServer: a node-only plugin has no
// controller service and no topology.
func (d *Driver) getPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{}, nil
}

// probe implements csi.IdentityServer. It is not ready until the startup reconcile
// finished, and fails when the state store is unusable.
func (d *Driver) probe(ctx context.Context, _ *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	if err := d.healthy(ctx); err != nil {
		return nil, errkind.Errorf(errkind.ErrFailedPrecondition, "driver not healthy: %w", err)
	}
	return &csi.ProbeResponse{Ready: wrapperspbBool(d.ready.Load())}, nil
}

// nodeGetInfo implements csi.NodeServer.
func (d *Driver) nodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return d.nodeInfo, nil
}

// nodeGetCapabilities implements csi.NodeServer. The kubelet calls it twice per
// publish; the response is built once.
func (d *Driver) nodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	return d.capabilities, nil
}

// nodeStageVolume implements csi.NodeServer: inline volumes are never staged.
func (d *Driver) nodeStageVolume(context.Context, *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	return nil, errkind.Errorf(errkind.ErrUnimplemented, "NodeStageVolume: ephemeral inline volumes are never staged")
}

// nodeUnstageVolume implements csi.NodeServer: inline volumes are never staged.
func (d *Driver) nodeUnstageVolume(context.Context, *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	return nil, errkind.Errorf(errkind.ErrUnimplemented, "NodeUnstageVolume: ephemeral inline volumes are never staged")
}

// nodeExpandVolume implements csi.NodeServer: inline volumes cannot be expanded.
func (d *Driver) nodeExpandVolume(context.Context, *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	return nil, errkind.Errorf(errkind.ErrUnimplemented, "NodeExpandVolume: ephemeral inline volumes cannot be expanded")
}

func wrapperspbBool(b bool) *wrapperspb.BoolValue { return wrapperspb.Bool(b) }

// healthy reports whether the state store answers.
func (d *Driver) healthy(ctx context.Context) error {
	if d.store == nil {
		return errors.New("state store is not open")
	}
	if _, err := d.store.Get(ctx, "\x00probe"); err != nil && !errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("state store: %w", err)
	}
	return nil
}
