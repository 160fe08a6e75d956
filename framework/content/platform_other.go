//go:build !unix

package content

import (
	"io/fs"
	"os"
)

// fileGID returns -1: there are no numeric groups on this platform.
func fileGID(fs.FileInfo) int { return -1 }

// syncDir does nothing: Windows cannot flush a directory handle opened for
// reading, and NTFS journals directory entries itself.
func syncDir(*os.Root, string) error { return nil }
