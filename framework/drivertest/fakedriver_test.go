package drivertest

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

const kfakeDriverName = "fake.csi.example.com"

// kfakeDriver is a CSI node plugin that records what it receives. It creates the
// target directory on a successful publish and removes it on unpublish, like a
// well-behaved driver.
type kfakeDriver struct {
	csi.UnimplementedNodeServer
	csi.UnimplementedIdentityServer

	mu           sync.Mutex
	caps         []csi.NodeServiceCapability_RPC_Type
	capsErr      []codes.Code // per NodeGetCapabilities call, consumed in order
	publishErr   codes.Code
	unpublishErr codes.Code
	// unpublishErrs are the answers of the next unpublishes, consumed in
	// order before unpublishErr applies.
	unpublishErrs []codes.Code
	// onUnpublish, when set, runs (without d.mu) before each unpublish
	// answers.
	onUnpublish func(*csi.NodeUnpublishVolumeRequest)
	keepTarget  bool // unpublish leaves the target alone
	publishes   []*csi.NodePublishVolumeRequest
	unpublishes []*csi.NodeUnpublishVolumeRequest
	authorities []string
	accepts     atomic.Int64
}

func (d *kfakeDriver) recordAuthority(ctx context.Context) {
	md, _ := metadata.FromIncomingContext(ctx)
	d.authorities = append(d.authorities, md.Get(":authority")...)
}

func (d *kfakeDriver) NodeGetCapabilities(ctx context.Context, _ *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.recordAuthority(ctx)
	if len(d.capsErr) > 0 {
		c := d.capsErr[0]
		d.capsErr = d.capsErr[1:]
		if c != codes.OK {
			return nil, status.Error(c, "injected capabilities failure")
		}
	}
	resp := &csi.NodeGetCapabilitiesResponse{}
	for _, t := range d.caps {
		resp.Capabilities = append(resp.Capabilities, &csi.NodeServiceCapability{
			Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: t}},
		})
	}
	return resp, nil
}

func (d *kfakeDriver) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	d.mu.Lock()
	d.recordAuthority(ctx)
	d.publishes = append(d.publishes, proto.Clone(req).(*csi.NodePublishVolumeRequest))
	code := d.publishErr
	d.mu.Unlock()
	if code != codes.OK {
		return nil, status.Error(code, "injected publish failure")
	}
	if _, err := os.Stat(filepath.Dir(req.GetTargetPath())); err != nil {
		return nil, status.Errorf(codes.Internal, "parent of target: %v", err)
	}
	if err := os.Mkdir(req.GetTargetPath(), 0o750); err != nil && !os.IsExist(err) {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

func (d *kfakeDriver) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	d.mu.Lock()
	d.recordAuthority(ctx)
	d.unpublishes = append(d.unpublishes, proto.Clone(req).(*csi.NodeUnpublishVolumeRequest))
	code, keep, hook := d.unpublishErr, d.keepTarget, d.onUnpublish
	if len(d.unpublishErrs) > 0 {
		code, d.unpublishErrs = d.unpublishErrs[0], d.unpublishErrs[1:]
	}
	d.mu.Unlock()
	if hook != nil {
		hook(req)
	}
	if code != codes.OK {
		return nil, status.Error(code, "injected unpublish failure")
	}
	if !keep {
		if err := os.Remove(req.GetTargetPath()); err != nil && !os.IsNotExist(err) {
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

func (d *kfakeDriver) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: kfakeDriverName, VendorVersion: "test"}, nil
}

func (d *kfakeDriver) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{}, nil
}

func (d *kfakeDriver) set(f func(d *kfakeDriver)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	f(d)
}

func (d *kfakeDriver) gotPublishes() []*csi.NodePublishVolumeRequest {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.publishes)
}

func (d *kfakeDriver) gotUnpublishes() []*csi.NodeUnpublishVolumeRequest {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.unpublishes)
}

// countingListener counts accepted connections.
type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// startKfake serves a kfakeDriver on a unix socket in a short temporary
// directory and returns it with its socket path.
func startKfake(t *testing.T) (*kfakeDriver, string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "dt")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "csi.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		os.RemoveAll(dir)
		t.Fatal(err)
	}
	d := &kfakeDriver{}
	srv := grpc.NewServer()
	csi.RegisterNodeServer(srv, d)
	csi.RegisterIdentityServer(srv, d)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(countingListener{lis, &d.accepts})
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
		os.RemoveAll(dir)
	})
	return d, sock
}

func newTestKubelet(t *testing.T, opts KubeletOptions) (*Kubelet, *kfakeDriver) {
	t.Helper()
	d, sock := startKfake(t)
	if opts.Root == "" {
		opts.Root = t.TempDir()
	}
	if opts.Endpoint == "" {
		opts.Endpoint = "unix://" + sock
	}
	if opts.DriverName == "" {
		opts.DriverName = kfakeDriverName
	}
	if opts.Timeout == 0 {
		opts.Timeout = 10 * time.Second
	}
	return NewKubelet(opts), d
}

func kpathExists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

func kptr[T any](v T) *T { return &v }
