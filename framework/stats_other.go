//go:build !linux && !windows

package framework

import (
	"os"

	"github.com/ephemera-csi/ephemera/framework/mount"
)

type fsUsage struct {
	bytesTotal, bytesAvail, bytesUsed   int64
	inodesTotal, inodesFree, inodesUsed int64
}

func filesystemUsage(*os.Root, string) (fsUsage, error) { return fsUsage{}, mount.ErrNotSupported }

func directoryUsage(*os.Root, string) (fsUsage, error) { return fsUsage{}, mount.ErrNotSupported }
