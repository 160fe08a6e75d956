//go:build !linux && !windows

package stats

import (
	"context"
	"os"

	"github.com/ephemera-csi/ephemera/framework/mount"
)

type Usage struct {
	BytesTotal, BytesAvail, BytesUsed   int64
	InodesTotal, InodesFree, InodesUsed int64
}

func Filesystem(*os.Root, string) (Usage, error) { return Usage{}, mount.ErrNotSupported }

func OwnFilesystem(string) bool { return false }

func Walk(context.Context, *os.Root, string, Limits, func(context.Context, int64)) (Result, error) {
	return Result{}, mount.ErrNotSupported
}

// MemoryBacked reports whether the volume r is on a filesystem whose pages
// are memory: not known here.
func MemoryBacked(*os.Root) (bool, error) { return false, nil }
