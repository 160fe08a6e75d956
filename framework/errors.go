package framework

import (
	"fmt"

	"google.golang.org/grpc/codes"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/internal/errkind"
)

// Errors become gRPC codes in one place, toStatus, which the interceptor applies
// to every handler's error, by the module's one table (framework/internal/errkind,
// which plugins answer by too: a backend's error has the same code in process
// and through a plugin). Handlers and the code below them return plain Go
// errors: the api sentinels, wrapped with %w, or an error marked with a kind
// (withKind) where the situation, not the cause, decides the code (a failed
// repair is transient whatever failed). A kind keeps the message as it is and
// the cause reachable with errors.Is and errors.As.

// Kinds of the framework's own that have no api sentinel (errkind's).
var (
	// errFailedPrecondition: the node is not in a state the request can be
	// served in (a foreign mount at the target, a store that does not answer).
	errFailedPrecondition = errkind.ErrFailedPrecondition
	// errUnimplemented: an RPC or feature this driver does not provide.
	errUnimplemented = errkind.ErrUnimplemented
	// errInternal: a bug (a recovered panic).
	errInternal = errkind.ErrInternal
)

// withKind marks err with kind (an api sentinel or one of the errors above),
// which decides its code. Its message is err's.
func withKind(kind, err error) error { return errkind.With(kind, err) }

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

// toStatus is the one place where errors become gRPC codes (errkind.Status).
// Handlers never return a bare error to the kubelet: it would see
// codes.Unknown, which it treats as final. The code is, in this order: the
// outermost kind; the code of a gRPC status in the chain (a backend or content
// provider may return one); the first kind of errkind.Kinds that matches;
// Internal. The message is the error's, with any gRPC status inside it reduced
// to its own message, so that the kubelet's event never reads "rpc error: code
// = ... rpc error: ...".
func toStatus(err error) error { return errkind.Status(err) }

// codeOf is err's code (errkind.Code).
func codeOf(err error) codes.Code { return errkind.Code(err) }
