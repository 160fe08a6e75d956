package unixsock

import (
	"context"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// DialGRPC returns a gRPC client of the server on the UNIX socket path, as the
// kubelet connects to a CSI driver: no TLS, authority "localhost", the socket
// dialed by its path (also a Windows path, which a target URL would mangle).
// Nothing is dialed before the first call; the caller closes the connection.
func DialGRPC(path string) (*grpc.ClientConn, error) {
	return grpc.NewClient("passthrough:///localhost",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithAuthority("localhost"),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}))
}
