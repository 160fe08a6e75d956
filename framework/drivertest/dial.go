package drivertest

import (
	"context"
	"errors"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"

	"github.com/ephemera-csi/ephemera/framework/internal/unixsock"
)

// nodeGetCapabilities sends one NodeGetCapabilities RPC.
func (k *Kubelet) nodeGetCapabilities(ctx context.Context) ([]*csi.NodeServiceCapability, error) {
	var caps []*csi.NodeServiceCapability
	err := k.call(ctx, "NodeGetCapabilities", func(c csi.NodeClient) error {
		resp, err := c.NodeGetCapabilities(ctx, &csi.NodeGetCapabilitiesRequest{})
		caps = resp.GetCapabilities()
		return err
	})
	return caps, err
}

// call logs the RPC and runs it on a new connection that is closed afterwards,
// as the kubelet does for every CSI call.
func (k *Kubelet) call(ctx context.Context, name string, rpc func(csi.NodeClient) error) error {
	conn, err := k.dial()
	if err != nil {
		return err
	}
	defer conn.Close()
	k.mu.Lock()
	k.calls = append(k.calls, name)
	if name == "NodeGetCapabilities" {
		k.capCalls++
	}
	k.mu.Unlock()
	return rpc(csi.NewNodeClient(conn))
}

func (k *Kubelet) dial() (*grpc.ClientConn, error) {
	path := k.endpoint
	if rest, ok := strings.CutPrefix(path, "unix://"); ok {
		path = rest
	} else if rest, ok := strings.CutPrefix(path, "unix:"); ok {
		path = rest
	}
	if path == "" {
		return nil, errors.New("drivertest: KubeletOptions.Endpoint is empty")
	}
	return unixsock.DialGRPC(path, nil)
}
