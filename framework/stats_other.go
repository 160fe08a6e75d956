//go:build !linux && !windows

package framework

import "github.com/ephemera-csi/ephemera/framework/mount"

type fsUsage struct {
	bytesTotal, bytesAvail, bytesUsed   int64
	inodesTotal, inodesFree, inodesUsed int64
}

func filesystemUsage(string) (fsUsage, error) { return fsUsage{}, mount.ErrNotSupported }

func directoryUsage(string) (fsUsage, error) { return fsUsage{}, mount.ErrNotSupported }
