//go:build linux

package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// statelessDriver is the reference a stateful driver is measured against: a
// bare CSI node plugin that publishes a tmpfs with mkdir + mount(2) and
// unpublishes with umount + rmdir, and does nothing else (no state, no
// validation beyond what it needs, no locks, no logging, no metrics). It is
// what a driver that keeps nothing would cost under the same kubelet load.
type statelessDriver struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedNodeServer
}

func (statelessDriver) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: "stateless.bench", VendorVersion: "1"}, nil
}

func (statelessDriver) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{}, nil
}

func (statelessDriver) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{NodeId: "node-1"}, nil
}

func (statelessDriver) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	return &csi.NodeGetCapabilitiesResponse{}, nil
}

func (statelessDriver) NodePublishVolume(_ context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	t := req.GetTargetPath()
	if err := unix.Mkdir(t, 0o750); err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if err := unix.Mount("stateless", t, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, fmt.Sprintf("size=%d,mode=0777", volSize)); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

func (statelessDriver) NodeUnpublishVolume(_ context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	t := req.GetTargetPath()
	if err := unix.Unmount(t, 0); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if err := unix.Rmdir(t); err != nil && !errors.Is(err, unix.ENOENT) {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// serveStateless serves the reference driver on a socket in dir until the test
// ends and returns its endpoint.
func serveStateless(tb testing.TB, dir string) string {
	tb.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		tb.Fatal(err)
	}
	sock := filepath.Join(dir, "csi.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		tb.Fatal(err)
	}
	srv := grpc.NewServer()
	csi.RegisterIdentityServer(srv, statelessDriver{})
	csi.RegisterNodeServer(srv, statelessDriver{})
	go func() { _ = srv.Serve(lis) }()
	tb.Cleanup(srv.Stop)
	return "unix://" + sock
}
