package unixsock

import (
	"errors"

	"golang.org/x/sys/windows"
)

// refused reports whether a connect failed because nobody listens on the
// socket. Winsock reports WSAECONNREFUSED, which is not syscall.ECONNREFUSED
// (an errno Go invents on Windows).
func refused(err error) bool { return errors.Is(err, windows.WSAECONNREFUSED) }
