// Package csiserver is the driver's CSI side: the Identity and Node services
// the kubelet calls, the interceptor every call passes (its logger, the
// sanitized request log, panics turned into Internal, errors into gRPC codes
// by errkind.Status, the RPC metrics), and the reading of requests into what
// the lifecycle acts on (Parser: a NodePublishVolumeRequest becomes a
// Publish; an unpublish, a checked volume ID and target path).
//
// Its core types: Server (Register puts its services on a gRPC server), Node
// (what the framework root provides: the volume lifecycle's events and the
// driver's state), Parser and Publish.
//
// It imports no part of the framework root: the root builds a Server from its
// Options and implements Node.
package csiserver
