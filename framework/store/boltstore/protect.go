package boltstore

import (
	"fmt"
	"runtime/debug"
)

// panicError is a panic recovered by protect: a memory fault reading the mapped
// file, or one of bbolt's assertions about its pages.
type panicError struct{ value any }

func (e *panicError) Error() string {
	if f, ok := e.value.(interface{ Addr() uintptr }); ok {
		return fmt.Sprintf("memory fault at %#x reading the mapped file (%v)", f.Addr(), e.value)
	}
	return fmt.Sprintf("bbolt panicked reading the file: %v", e.value)
}

// protect runs fn on a goroutine of its own on which a memory fault panics instead
// of killing the process (debug.SetPanicOnFault: a SIGBUS from reading a mapped
// page past the end of the file, a SIGSEGV past the mapping), and returns any panic
// as a *panicError. Only fn's own goroutine is protected: bbolt must not start
// goroutines that read the file (tx.Check does; Open with an unsaved freelist
// does, which checkLayout refuses).
func protect(fn func() error) error {
	done := make(chan error, 1)
	go func() {
		debug.SetPanicOnFault(true)
		defer func() {
			if p := recover(); p != nil {
				done <- &panicError{value: p}
			}
		}()
		done <- fn()
	}()
	return <-done
}
