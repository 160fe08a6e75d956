package pluginserver

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/api"
)

// statusf is an answer of the plugin protocol with code c.
func statusf(c codes.Code, format string, args ...any) error {
	return status.Error(c, fmt.Sprintf(format, args...))
}

// toStatus maps the api sentinel errors to the codes the protocol names; a
// gRPC status passes through.
func toStatus(err error) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	code := codes.Internal
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	case errors.Is(err, api.ErrInvalidParams), errors.Is(err, api.ErrNotSupported):
		code = codes.InvalidArgument
	case errors.Is(err, api.ErrPermissionDenied):
		code = codes.PermissionDenied
	case errors.Is(err, api.ErrNotFound):
		code = codes.NotFound
	case errors.Is(err, api.ErrAlreadyExists):
		code = codes.AlreadyExists
	case errors.Is(err, api.ErrResourceExhausted):
		code = codes.ResourceExhausted
	case errors.Is(err, api.ErrUnavailable):
		code = codes.Unavailable
	case errors.Is(err, api.ErrBusy):
		code = codes.Aborted
	}
	return status.Error(code, err.Error())
}
