package csiserver

import (
	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"

	"github.com/ephemera-csi/ephemera/framework/internal/volstats"
)

// Methods are the full names of the CSI methods the server serves, Identity's
// and Node's ("/csi.v1.Node/NodePublishVolume"), for the metrics.
func Methods() []string {
	var methods []string
	for _, sd := range []grpc.ServiceDesc{csi.Identity_ServiceDesc, csi.Node_ServiceDesc} {
		for _, m := range sd.Methods {
			methods = append(methods, "/"+sd.ServiceName+"/"+m.MethodName)
		}
	}
	return methods
}

// NodeCapabilities lists what the driver really implements. Ephemeral inline
// volumes are never staged or expanded.
func NodeCapabilities() []*csi.NodeServiceCapability {
	var caps []*csi.NodeServiceCapability
	for _, c := range []csi.NodeServiceCapability_RPC_Type{
		csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
		csi.NodeServiceCapability_RPC_GET_VOLUME_HEALTH,
		volstats.LegacyVolumeCondition,
		csi.NodeServiceCapability_RPC_VOLUME_MOUNT_GROUP,
	} {
		caps = append(caps, &csi.NodeServiceCapability{
			Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: c}},
		})
	}
	return caps
}
