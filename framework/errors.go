package framework

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"syscall"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// Errors become gRPC codes in one place, toStatus, which the interceptor applies
// to every handler's error. Handlers and the code below them return plain Go
// errors: the api sentinels, wrapped with %w, or an error marked with a kind
// (withKind) where the situation, not the cause, decides the code (a failed
// repair is transient whatever failed). A kind keeps the message as it is and
// the cause reachable with errors.Is and errors.As.
//
// The kubelet treats Canceled, DeadlineExceeded, Unavailable, ResourceExhausted
// and Aborted as "maybe still in progress" (it keeps the volume and calls
// NodeUnpublish later); every other code is final.

// Kinds of the framework's own that have no api sentinel.
var (
	// errFailedPrecondition: the node is not in a state the request can be
	// served in (a foreign mount at the target, a store that does not answer).
	errFailedPrecondition = errors.New("failed precondition")
	// errUnimplemented: an RPC or feature this driver does not provide.
	errUnimplemented = errors.New("unimplemented")
	// errInternal: a bug (a recovered panic).
	errInternal = errors.New("internal error")
)

// kindError marks err with a kind (an api sentinel or one of the errors above)
// that decides its code. Its message is err's.
type kindError struct {
	kind error
	err  error
}

func (e *kindError) Error() string   { return e.err.Error() }
func (e *kindError) Unwrap() []error { return []error{e.kind, e.err} }

// withKind marks err with kind.
func withKind(kind, err error) error {
	if err == nil {
		return nil
	}
	return &kindError{kind: kind, err: err}
}

// kindf is withKind of a formatted error (%w works as in fmt.Errorf).
func kindf(kind error, format string, args ...any) error {
	return withKind(kind, fmt.Errorf(format, args...))
}

// invalidArgf is a refused request: final, its message says what to fix.
func invalidArgf(format string, args ...any) error {
	return kindf(api.ErrInvalidParams, format, args...)
}

// transient marks err as retryable: the kubelet keeps the volume as uncertain and
// retries or calls NodeUnpublish later.
func transient(err error) error { return withKind(api.ErrUnavailable, err) }

// grpcStatus is what a gRPC status error implements (also when wrapped).
type grpcStatus interface{ GRPCStatus() *status.Status }

// toStatus is the one place where errors become gRPC codes. Handlers never
// return a bare error to the kubelet: it would see codes.Unknown, which it
// treats as final. The code is, in this order: the outermost kind; the code of
// a gRPC status in the chain (a backend or content provider may return one);
// the first sentinel that matches below; Internal. The message is the error's,
// with any gRPC status inside it reduced to its own message, so that the
// kubelet's event never reads "rpc error: code = ... rpc error: ...".
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	return status.Error(codeOf(err), message(err))
}

func codeOf(err error) codes.Code {
	var k *kindError
	if errors.As(err, &k) {
		return codeOfKind(k.kind)
	}
	var gs grpcStatus
	if errors.As(err, &gs) {
		return gs.GRPCStatus().Code()
	}
	return codeOfKind(err)
}

// codeOfKind maps sentinels (a kind, or anything in err's chain) to codes.
func codeOfKind(err error) codes.Code {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	case errors.Is(err, errFailedPrecondition):
		return codes.FailedPrecondition
	case errors.Is(err, errUnimplemented):
		return codes.Unimplemented
	case errors.Is(err, errInternal):
		return codes.Internal
	case errors.Is(err, api.ErrInvalidParams), errors.Is(err, mount.ErrSymlink),
		errors.Is(err, mount.ErrNotEmpty), errors.Is(err, api.ErrNotSupported):
		return codes.InvalidArgument
	case errors.Is(err, api.ErrPermissionDenied):
		return codes.PermissionDenied
	case errors.Is(err, api.ErrAlreadyExists):
		return codes.AlreadyExists
	case errors.Is(err, api.ErrResourceExhausted), errors.Is(err, syscall.ENOSPC):
		return codes.ResourceExhausted
	case errors.Is(err, api.ErrBusy), errors.Is(err, syscall.EBUSY),
		errors.Is(err, mount.ErrTargetMoved), errors.Is(err, mount.ErrMounted):
		// ErrTargetMoved: a rename raced the mount and it was undone;
		// ErrMounted: something was mounted at the target meanwhile. Both are
		// worth a retry, which sees the target as it is then.
		return codes.Aborted
	case errors.Is(err, api.ErrUnavailable):
		return codes.Unavailable
	case errors.Is(err, api.ErrNotFound), errors.Is(err, store.ErrNotFound):
		return codes.NotFound
	case errors.Is(err, fs.ErrNotExist):
		// A directory the kubelet should have created is missing: it retries.
		return codes.Unavailable
	}
	return codes.Internal
}

// message is err's message with every gRPC status in its chain spelled as its
// own message ("desc") only.
func message(err error) string {
	msg := err.Error()
	var walk func(e error)
	walk = func(e error) {
		if e == nil {
			return
		}
		if gs, ok := e.(grpcStatus); ok {
			s := gs.GRPCStatus()
			msg = strings.ReplaceAll(msg, s.Err().Error(), s.Message())
		}
		switch u := e.(type) {
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		case interface{ Unwrap() []error }:
			for _, inner := range u.Unwrap() {
				walk(inner)
			}
		}
	}
	walk(err)
	return msg
}
