package boltstore

import (
	"errors"
	"os"
	"time"

	"golang.org/x/sys/windows"
)

// lockFile takes the lock bbolt takes on f (LockFileEx on the byte range -1..0,
// exclusive or shared), waiting up to timeout; it fails with errLockTimeout when
// another handle holds it.
func lockFile(f *os.File, exclusive bool, timeout time.Duration) error {
	flags := uint32(windows.LOCKFILE_FAIL_IMMEDIATELY)
	if exclusive {
		flags |= windows.LOCKFILE_EXCLUSIVE_LOCK
	}
	deadline := time.Now().Add(timeout)
	for {
		err := windows.LockFileEx(windows.Handle(f.Fd()), flags, 0, 1, 0, lockRange())
		if !errors.Is(err, windows.ERROR_LOCK_VIOLATION) {
			return err
		}
		if time.Now().After(deadline) {
			return errLockTimeout
		}
		time.Sleep(lockRetry)
	}
}

// handOver releases the lock taken by lockFile so that bbolt can take it on the
// same handle (Windows locks do not nest). Another process could take the lock in
// between; bbolt's open then times out and Open fails with ErrLocked.
func handOver(f *os.File) error {
	return windows.UnlockFileEx(windows.Handle(f.Fd()), 0, 1, 0, lockRange())
}

func lockRange() *windows.Overlapped {
	const m1 = ^uint32(0) // offset -1, as bbolt locks it
	return &windows.Overlapped{Offset: m1, OffsetHigh: m1}
}

// syncDir does nothing: NTFS journals directory entries, and a directory handle
// opened for reading cannot be flushed.
func syncDir(string) error { return nil }
