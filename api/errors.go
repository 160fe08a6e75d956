package api

import (
	"errors"
	"fmt"
)

// Sentinel errors a backend or content provider returns (wrapped with %w and a
// message saying what to fix). The framework maps them to gRPC codes in one place:
//
//	ErrInvalidParams      InvalidArgument    (final: the pod spec must change)
//	ErrPermissionDenied   PermissionDenied   (final)
//	ErrNotFound           NotFound
//	ErrAlreadyExists      AlreadyExists      (final)
//	ErrResourceExhausted  ResourceExhausted  (kubelet retries)
//	ErrUnavailable        Unavailable        (kubelet retries)
//	ErrBusy               Aborted            (kubelet retries)
//	ErrNotSupported       InvalidArgument    (final: not on this platform)
//
// Any other error is Internal. A backend may also return a gRPC status error; it
// passes through unchanged.
var (
	ErrInvalidParams     = errors.New("invalid volume attributes")
	ErrPermissionDenied  = errors.New("permission denied")
	ErrNotFound          = errors.New("not found")
	ErrAlreadyExists     = errors.New("already exists")
	ErrResourceExhausted = errors.New("resource exhausted")
	ErrUnavailable       = errors.New("unavailable")
	ErrBusy              = errors.New("busy")
	// ErrNotSupported is returned for what the platform cannot do (for example
	// a tmpfs on Windows).
	ErrNotSupported = errors.New("not supported on this platform")
)

// InvalidParamf returns an error wrapping ErrInvalidParams with a message for the
// pod author.
func InvalidParamf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidParams, fmt.Sprintf(format, args...))
}
