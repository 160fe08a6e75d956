package csiserver

import (
	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
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
