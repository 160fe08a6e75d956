//go:build darwin || dragonfly || freebsd || linux || netbsd || openbsd

package boltstore

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestProtectFault: reading a mapped page past the end of its file (SIGBUS), as
// bbolt does on a truncated file, is an error on a protected goroutine.
func TestProtectFault(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ps := os.Getpagesize()
	if err := f.Truncate(int64(2 * ps)); err != nil {
		t.Fatal(err)
	}
	b, err := syscall.Mmap(int(f.Fd()), 0, 2*ps, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(b)
	if err := f.Truncate(0); err != nil {
		t.Fatal(err)
	}

	var got byte
	err = protect(func() error {
		got = b[ps+1]
		return nil
	})
	var perr *panicError
	if !errors.As(err, &perr) || !isCorruption(err) || !strings.Contains(err.Error(), "memory fault at") {
		t.Fatalf("protect(read past the end) = %v, %d; want a memory fault", err, got)
	}
	t.Log(err)
}

func TestProtectPanic(t *testing.T) {
	err := protect(func() error { panic("assertion failed: page 3") })
	var perr *panicError
	if !errors.As(err, &perr) || !strings.Contains(err.Error(), "assertion failed: page 3") {
		t.Errorf("protect(panic) = %v", err)
	}
	want := errors.New("plain")
	if err := protect(func() error { return want }); err != want {
		t.Errorf("protect(return err) = %v, want %v", err, want)
	}
}
