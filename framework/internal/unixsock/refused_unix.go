//go:build !windows

package unixsock

import (
	"errors"
	"syscall"
)

// refused reports whether a connect failed because nobody listens on the socket.
func refused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }
