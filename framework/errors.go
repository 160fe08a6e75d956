package framework

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"syscall"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// toStatus is the one place where errors become gRPC codes. Handlers never return
// a bare error: the kubelet would see codes.Unknown, which it treats as final.
//
// The kubelet treats Canceled, DeadlineExceeded, Unavailable, ResourceExhausted
// and Aborted as "maybe still in progress" (it keeps the volume and calls
// NodeUnpublish later); every other code is final.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if s, ok := status.FromError(err); ok {
		return s.Err()
	}
	var code codes.Code
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	case errors.Is(err, api.ErrInvalidParams), errors.Is(err, mount.ErrSymlink),
		errors.Is(err, mount.ErrNotEmpty):
		code = codes.InvalidArgument
	case errors.Is(err, mount.ErrNotSupported):
		code = codes.InvalidArgument
	case errors.Is(err, api.ErrPermissionDenied):
		code = codes.PermissionDenied
	case errors.Is(err, api.ErrAlreadyExists):
		code = codes.AlreadyExists
	case errors.Is(err, api.ErrResourceExhausted), errors.Is(err, syscall.ENOSPC):
		code = codes.ResourceExhausted
	case errors.Is(err, api.ErrBusy), errors.Is(err, syscall.EBUSY),
		errors.Is(err, mount.ErrTargetMoved), errors.Is(err, mount.ErrMounted):
		// ErrTargetMoved: a rename raced the mount and it was undone;
		// ErrMounted: something was mounted at the target meanwhile. Both are
		// worth a retry, which sees the target as it is then.
		code = codes.Aborted
	case errors.Is(err, api.ErrUnavailable):
		code = codes.Unavailable
	case errors.Is(err, api.ErrNotFound), errors.Is(err, store.ErrNotFound):
		code = codes.NotFound
	case errors.Is(err, fs.ErrNotExist):
		// A directory the kubelet should have created is missing: it retries.
		code = codes.Unavailable
	default:
		code = codes.Internal
	}
	return status.Error(code, err.Error())
}

// Helpers for request validation errors, which are final and say what to fix.
func invalidArgf(format string, args ...any) error {
	return status.Error(codes.InvalidArgument, fmt.Sprintf(format, args...))
}

// transient marks err as retryable: the kubelet keeps the volume as uncertain and
// retries or calls NodeUnpublish later.
func transient(err error) error {
	return status.Error(codes.Unavailable, err.Error())
}
