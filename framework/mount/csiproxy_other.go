//go:build !windows

package mount

import (
	"context"
	"net"
)

// dialPipe is nil: named pipes exist only on Windows, so CSIProxyOptions.Dial
// is required here.
var dialPipe func(ctx context.Context, pipe string) (net.Conn, error)
