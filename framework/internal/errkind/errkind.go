package errkind

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"syscall"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/api"
	"github.com/ephemera-csi/ephemera/framework/mount"
	"github.com/ephemera-csi/ephemera/framework/store"
)

// Kinds of the framework's own that have no api sentinel.
var (
	// ErrFailedPrecondition: the node is not in a state the request can be
	// served in (a foreign mount at the target, a store that does not answer).
	ErrFailedPrecondition = errors.New("failed precondition")
	// ErrUnimplemented: an RPC or feature this driver does not provide.
	ErrUnimplemented = errors.New("unimplemented")
	// ErrInternal: a bug (a recovered panic).
	ErrInternal = errors.New("internal error")
)

// Kind is one row of the table.
type Kind struct {
	// Reason names the kind on the wire (google.rpc.ErrorInfo.reason:
	// UPPER_SNAKE_CASE). Never renamed: a plugin and a driver of different
	// versions must agree on it.
	Reason string
	// Err is the sentinel: an error matches the kind when errors.Is(err, Err),
	// and an answer of the kind comes back from a plugin wrapping Err.
	Err error
	// Code is the kind's gRPC code.
	Code codes.Code
}

// Domain is the google.rpc.ErrorInfo domain of the reasons of Kinds.
const Domain = "ephemera.dev"

// ReasonStatus marks a gRPC status a plugin's backend returned itself: its
// code passes through, as it does in process.
const ReasonStatus = "STATUS"

// Kinds is the table, in the order errors are matched. The kubelet treats
// Canceled, DeadlineExceeded, Unavailable, ResourceExhausted and Aborted as
// "maybe still in progress" (it keeps the volume and calls NodeUnpublish
// later); every other code is final.
var Kinds = []Kind{
	{"DEADLINE_EXCEEDED", context.DeadlineExceeded, codes.DeadlineExceeded},
	{"CANCELED", context.Canceled, codes.Canceled},
	{"FAILED_PRECONDITION", ErrFailedPrecondition, codes.FailedPrecondition},
	{"UNIMPLEMENTED", ErrUnimplemented, codes.Unimplemented},
	{"INTERNAL", ErrInternal, codes.Internal},
	{"INVALID_PARAMS", api.ErrInvalidParams, codes.InvalidArgument},
	{"SYMLINK", mount.ErrSymlink, codes.InvalidArgument},
	{"NOT_EMPTY", mount.ErrNotEmpty, codes.InvalidArgument},
	{"NOT_SUPPORTED", api.ErrNotSupported, codes.InvalidArgument},
	{"PERMISSION_DENIED", api.ErrPermissionDenied, codes.PermissionDenied},
	{"ALREADY_EXISTS", api.ErrAlreadyExists, codes.AlreadyExists},
	{"RESOURCE_EXHAUSTED", api.ErrResourceExhausted, codes.ResourceExhausted},
	{"ENOSPC", syscall.ENOSPC, codes.ResourceExhausted},
	{"BUSY", api.ErrBusy, codes.Aborted},
	{"EBUSY", syscall.EBUSY, codes.Aborted},
	// A rename raced the mount and it was undone; something was mounted at
	// the target meanwhile: both are worth a retry, which sees the target as
	// it is then.
	{"TARGET_MOVED", mount.ErrTargetMoved, codes.Aborted},
	{"MOUNTED", mount.ErrMounted, codes.Aborted},
	{"UNAVAILABLE", api.ErrUnavailable, codes.Unavailable},
	{"NOT_FOUND", api.ErrNotFound, codes.NotFound},
	{"RECORD_NOT_FOUND", store.ErrNotFound, codes.NotFound},
	// A directory the kubelet should have created is missing: it retries.
	{"NOT_EXIST", fs.ErrNotExist, codes.Unavailable},
}

// byReason indexes Kinds by Reason.
var byReason = func() map[string]Kind {
	m := make(map[string]Kind, len(Kinds))
	for _, k := range Kinds {
		m[k.Reason] = k
	}
	return m
}()

// kindError marks err with a kind that decides its code. Its message is err's.
type kindError struct {
	kind error
	err  error
}

func (e *kindError) Error() string   { return e.err.Error() }
func (e *kindError) Unwrap() []error { return []error{e.kind, e.err} }

// With marks err with kind (a sentinel of Kinds), which decides its code
// whatever err wraps. The cause stays reachable with errors.Is and errors.As.
func With(kind, err error) error {
	if err == nil {
		return nil
	}
	return &kindError{kind: kind, err: err}
}

// Errorf is With of a formatted error (%w works as in fmt.Errorf).
func Errorf(kind error, format string, args ...any) error {
	return With(kind, fmt.Errorf(format, args...))
}

// Invalidf is a refused request (api.ErrInvalidParams, InvalidArgument):
// final, its message says what to fix.
func Invalidf(format string, args ...any) error {
	return Errorf(api.ErrInvalidParams, format, args...)
}

// Transient marks err as retryable (api.ErrUnavailable, Unavailable): the
// kubelet keeps the volume as uncertain and retries or calls NodeUnpublish
// later.
func Transient(err error) error { return With(api.ErrUnavailable, err) }

// grpcStatus is what a gRPC status error implements (also when wrapped).
type grpcStatus interface{ GRPCStatus() *status.Status }

// match is the first kind of the table err's chain matches.
func match(err error) (Kind, bool) {
	for _, k := range Kinds {
		if errors.Is(err, k.Err) {
			return k, true
		}
	}
	return Kind{}, false
}

// classify is what decides err's code: a kind, or else a gRPC status of its
// chain; neither: Internal.
func classify(err error) (Kind, *status.Status, bool) {
	var ke *kindError
	if errors.As(err, &ke) {
		if k, ok := match(ke.kind); ok {
			return k, nil, true
		}
		return Kind{Code: codes.Internal}, nil, false
	}
	var gs grpcStatus
	if errors.As(err, &gs) {
		return Kind{}, gs.GRPCStatus(), true
	}
	k, ok := match(err)
	return k, nil, ok
}

// Code is err's gRPC code (see the package doc).
func Code(err error) codes.Code {
	if err == nil {
		return codes.OK
	}
	k, st, ok := classify(err)
	switch {
	case st != nil:
		return st.Code()
	case ok:
		return k.Code
	}
	return codes.Internal
}

// Status is err as the answer of an RPC: its code, and its message with
// every gRPC status inside it reduced to its own message, so that no message
// reads "rpc error: code = ... rpc error: ...". Nil for nil.
func Status(err error) error {
	if err == nil {
		return nil
	}
	return status.Error(Code(err), Message(err))
}

// WireStatus is Status with err's kind attached as a google.rpc.ErrorInfo
// detail: the answer of a plugin. An error without a kind (Internal) has no
// detail; a gRPC status of the backend's keeps its details and gets
// ReasonStatus.
func WireStatus(err error) error {
	if err == nil {
		return nil
	}
	var b *bareError
	if errors.As(err, &b) {
		return b.s.Err()
	}
	k, st, ok := classify(err)
	if !ok {
		return status.Error(codes.Internal, Message(err))
	}
	s := status.New(k.Code, Message(err))
	reason := k.Reason
	if st != nil {
		p := st.Proto()
		p.Message = Message(err)
		s, reason = status.FromProto(p), ReasonStatus
	}
	if ws, derr := s.WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: Domain}); derr == nil {
		s = ws
	}
	return s.Err()
}

// Bare is an answer of code c that WireStatus sends without a kind: a refusal
// of the plugin protocol itself (a call the handshake did not offer, a
// protocol version it does not speak, an answer it cannot carry), which the
// driver maps by its code.
func Bare(c codes.Code, format string, args ...any) error {
	return &bareError{status.New(c, fmt.Sprintf(format, args...))}
}

// bareError is Bare's status.
type bareError struct{ s *status.Status }

func (e *bareError) Error() string              { return e.s.Err().Error() }
func (e *bareError) GRPCStatus() *status.Status { return e.s }

// FromWire is the kind a plugin's answer st carries: the sentinel of its
// reason, or for ReasonStatus st itself as an error (its code then passes
// through Code). False when st carries none this version knows.
func FromWire(st *status.Status) (error, bool) {
	for _, d := range st.Details() {
		info, ok := d.(*errdetails.ErrorInfo)
		if !ok || info.GetDomain() != Domain {
			continue
		}
		if info.GetReason() == ReasonStatus {
			return st.Err(), true
		}
		if k, ok := byReason[info.GetReason()]; ok {
			return k.Err, true
		}
	}
	return nil, false
}

// Message is err's message with every gRPC status in its chain spelled as
// its own message ("desc") only.
func Message(err error) string {
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
