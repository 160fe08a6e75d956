//go:build !(darwin || dragonfly || freebsd || linux || netbsd || openbsd || windows)

package boltstore

import (
	"os"
	"time"
)

// lockFile does nothing on this platform: the file is checked without holding
// bbolt's lock, so a driver writing the file at that moment could make a healthy
// file look damaged. Only bbolt's own lock protects the store.
func lockFile(*os.File, bool, time.Duration) error { return nil }

// handOver does nothing; see lockFile.
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
