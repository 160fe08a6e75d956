//go:build windows

package mount

import (
	"context"
	"net"

	"github.com/Microsoft/go-winio"
)

// dialPipe connects to a named pipe: the only Windows-only part of the
// csi-proxy seam.
var dialPipe = func(ctx context.Context, pipe string) (net.Conn, error) {
	return winio.DialPipeContext(ctx, pipe)
}
