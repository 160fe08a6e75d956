//go:build darwin || dragonfly || freebsd || linux || netbsd || openbsd

package boltstore

import (
	"errors"
	"os"
	"syscall"
	"time"
)

// lockFile takes the lock bbolt takes on f (flock, exclusive or shared), waiting up
// to timeout; it fails with errLockTimeout when another open file holds it.
func lockFile(f *os.File, exclusive bool, timeout time.Duration) error {
	how := syscall.LOCK_SH
	if exclusive {
		how = syscall.LOCK_EX
	}
	deadline := time.Now().Add(timeout)
	for {
		err := syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return err
		}
		if time.Now().After(deadline) {
			return errLockTimeout
		}
		time.Sleep(lockRetry)
	}
}

// handOver prepares f, locked by lockFile, for bbolt. Nothing to do: bbolt flocks
// the same open file description again, which succeeds, so the lock is never
// released between the check and bbolt's open.
func handOver(*os.File) error { return nil }

// syncDir makes a new directory entry in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
