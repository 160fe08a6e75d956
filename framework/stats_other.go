//go:build !linux && !windows

package framework

import (
	"context"
	"os"

	"github.com/ephemera-csi/ephemera/framework/mount"
)

type fsUsage struct {
	bytesTotal, bytesAvail, bytesUsed   int64
	inodesTotal, inodesFree, inodesUsed int64
}

func filesystemUsage(*os.Root, string) (fsUsage, error) { return fsUsage{}, mount.ErrNotSupported }

func ownFilesystem(string) bool { return false }

func walkUsage(context.Context, *os.Root, string, StatsWalkLimits, func(context.Context, int64)) (walkResult, error) {
	return walkResult{}, mount.ErrNotSupported
}

// memoryBacked reports whether the volume r is on a filesystem whose pages
// are memory: not known here.
func memoryBacked(*os.Root) (bool, error) { return false, nil }
