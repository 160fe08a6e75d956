package framework

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

// identityServer and nodeServer are the CSI services Run registers. They are
// unexported, so every CSI call reaches the driver through the gRPC server and
// its interceptor (codes, metrics, logging), never around it.
type identityServer struct {
	csi.UnimplementedIdentityServer
	d *Driver
}

type nodeServer struct {
	csi.UnimplementedNodeServer
	d *Driver
}

func (s identityServer) GetPluginInfo(ctx context.Context, req *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return s.d.getPluginInfo(ctx, req)
}

func (s identityServer) GetPluginCapabilities(ctx context.Context, req *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return s.d.getPluginCapabilities(ctx, req)
}

func (s identityServer) Probe(ctx context.Context, req *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return s.d.probe(ctx, req)
}

func (s nodeServer) NodeGetInfo(ctx context.Context, req *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return s.d.nodeGetInfo(ctx, req)
}

func (s nodeServer) NodeGetCapabilities(ctx context.Context, req *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	return s.d.nodeGetCapabilities(ctx, req)
}

func (s nodeServer) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	return s.d.nodeStageVolume(ctx, req)
}

func (s nodeServer) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	return s.d.nodeUnstageVolume(ctx, req)
}

func (s nodeServer) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	return s.d.nodeExpandVolume(ctx, req)
}

func (s nodeServer) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	return s.d.nodePublishVolume(ctx, req)
}

// NodeUnpublishVolume drops the volume's stats answer, and stops a walk of it
// in progress (whose open directories would make the unmount fail), before
// and after the unpublish: a volume published again under the same ID is
// walked afresh.
func (s nodeServer) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	s.d.stats.Forget(req.GetVolumeId())
	resp, err := s.d.nodeUnpublishVolume(ctx, req)
	if err == nil {
		s.d.stats.Forget(req.GetVolumeId())
	}
	return resp, err
}

func (s nodeServer) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	return s.d.nodeGetVolumeStats(ctx, req)
}

func (s nodeServer) NodeGetVolumeHealth(ctx context.Context, req *csi.NodeGetVolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error) {
	return s.d.nodeGetVolumeHealth(ctx, req)
}
