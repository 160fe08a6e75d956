//go:build !linux

package exepages

// Release is not supported off Linux.
func Release() (Result, error) { return Result{}, ErrUnsupported }
