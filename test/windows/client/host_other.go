//go:build !windows

package main

import "errors"

// The client is meant for Windows nodes; on other systems it builds (so that
// `go vet ./...` covers it) and the Windows-only checks fail.

var errNotWindows = errors.New("only checked on Windows")

func volumeRoot(string) error { return errNotWindows }

func detached(string) error { return errNotWindows }
