package unixsock

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// EndpointPath returns the socket path of a plugin endpoint:
// "unix:///absolute/path.sock" or an absolute path.
func EndpointPath(endpoint string) (string, error) {
	p, isURL := strings.CutPrefix(endpoint, "unix://")
	if !isURL && strings.Contains(endpoint, "://") {
		return "", fmt.Errorf("endpoint %q: only unix:// sockets are supported", endpoint)
	}
	if !filepath.IsAbs(p) {
		return "", fmt.Errorf("endpoint %q: want unix:///absolute/path.sock or an absolute path", endpoint)
	}
	return p, nil
}

// DialGRPC returns a gRPC client of the server on the UNIX socket path, as the
// kubelet connects to a CSI driver: no TLS, authority "localhost", the socket
// dialed by its path (also a Windows path, which a target URL would mangle).
// Nothing is dialed before the first call; the caller closes the connection.
// onDial, when set, is called after each connection the client makes (the
// first, and each reconnect: a restarted server).
func DialGRPC(path string, onDial func(), opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	opts = append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithAuthority("localhost"),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			c, err := d.DialContext(ctx, "unix", path)
			if err == nil && onDial != nil {
				onDial()
			}
			return c, err
		}),
	}, opts...)
	return grpc.NewClient("passthrough:///localhost", opts...)
}
