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

// MemoryUsed is what the memory-backed filesystem of the volume r uses:
// not known here.
func MemoryUsed(*os.Root) (mem bool, bytes, inodes int64, err error) { return false, 0, 0, nil }

// MemoryBound is what the memory-backed filesystem of the volume r may
// hold: not known here.
func MemoryBound(*os.Root) (mem bool, bytes, inodes int64, err error) { return false, 0, 0, nil }
