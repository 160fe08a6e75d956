//go:build !unix

package content

import (
	"errors"
	"io/fs"
	"os"
	"syscall"
)

// noSpace reports whether err says the volume is full (ERROR_DISK_FULL,
// ERROR_HANDLE_DISK_FULL on Windows; ENOSPC elsewhere).
func noSpace(err error) bool {
	const errorHandleDiskFull, errorDiskFull = syscall.Errno(39), syscall.Errno(112)
	return errors.Is(err, errorDiskFull) || errors.Is(err, errorHandleDiskFull) || errors.Is(err, syscall.ENOSPC)
}

// fileGID returns -1: there are no numeric groups on this platform.
func fileGID(fs.FileInfo) int { return -1 }

// syncDir does nothing: Windows cannot flush a directory handle opened for
// reading, and NTFS journals directory entries itself.
func syncDir(*os.Root, string) error { return nil }
