package errkind

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ephemera-csi/ephemera/api"
)

// Every kind has a distinct reason of google.rpc.ErrorInfo's shape, a code
// other than OK, and is the first match of its own sentinel (a kind that an
// earlier row shadows could never be sent).
func TestKindsTable(t *testing.T) {
	shape := regexp.MustCompile(`^[A-Z][A-Z0-9_]+[A-Z0-9]$`)
	seen := map[string]bool{ReasonStatus: true}
	for _, k := range Kinds {
		if !shape.MatchString(k.Reason) || len(k.Reason) > 63 {
			t.Errorf("%s: not an ErrorInfo reason (UPPER_SNAKE_CASE, at most 63)", k.Reason)
		}
		if seen[k.Reason] {
			t.Errorf("%s: reason twice (or ReasonStatus)", k.Reason)
		}
		seen[k.Reason] = true
		if k.Code == codes.OK || k.Err == nil {
			t.Errorf("%s: code %s, sentinel %v", k.Reason, k.Code, k.Err)
		}
		if got, _ := match(fmt.Errorf("x: %w", k.Err)); got.Reason != k.Reason {
			t.Errorf("%s: its sentinel matches %s first", k.Reason, got.Reason)
		}
	}
}

// WireStatus and FromWire round-trip every kind: the sentinel that comes
// back has the code the error had.
func TestWireRoundTrip(t *testing.T) {
	for _, k := range Kinds {
		for _, err := range []error{fmt.Errorf("b: %w", k.Err), With(k.Err, errors.New("marked"))} {
			st := status.Convert(WireStatus(err))
			if st.Code() != k.Code || st.Message() != err.Error() {
				t.Errorf("%s: wire status %s %q, want %s %q", k.Reason, st.Code(), st.Message(), k.Code, err.Error())
			}
			back, ok := FromWire(st)
			if !ok || !errors.Is(back, k.Err) || Code(back) != k.Code {
				t.Errorf("%s: back as %v (%v), code %s", k.Reason, back, ok, Code(back))
			}
		}
	}
	// A backend's status keeps its code and details, and gets ReasonStatus.
	own, _ := status.New(codes.OutOfRange, "too far").WithDetails(&errdetails.ErrorInfo{Domain: "example.com", Reason: "FAR"})
	st := status.Convert(WireStatus(fmt.Errorf("b: %w", own.Err())))
	if st.Code() != codes.OutOfRange || st.Message() != "b: too far" || len(st.Details()) != 2 {
		t.Errorf("backend status on the wire: %s %q %v", st.Code(), st.Message(), st.Details())
	}
	if back, ok := FromWire(st); !ok || Code(back) != codes.OutOfRange {
		t.Errorf("backend status back as %v (%v)", back, ok)
	}
	// An error without a kind, and the protocol's own refusals, carry none.
	for _, err := range []error{errors.New("boom"), Bare(codes.Unimplemented, "no %s", "LIST")} {
		st := status.Convert(WireStatus(err))
		if _, ok := FromWire(st); ok || len(st.Details()) != 0 {
			t.Errorf("%v: a kind on the wire: %v", err, st.Details())
		}
	}
	if c := status.Code(WireStatus(Bare(codes.FailedPrecondition, "v9"))); c != codes.FailedPrecondition {
		t.Errorf("Bare: code %s", c)
	}
}

// The outermost kind decides, then a status in the chain, then the table.
func TestCodeOrder(t *testing.T) {
	for _, c := range []struct {
		err  error
		code codes.Code
	}{
		{With(api.ErrUnavailable, fmt.Errorf("x: %w", status.Error(codes.NotFound, "n"))), codes.Unavailable},
		{fmt.Errorf("x: %w; y: %w", status.Error(codes.NotFound, "n"), syscall.EBUSY), codes.NotFound},
		{errors.Join(api.ErrNotFound, syscall.EBUSY), codes.Aborted},
		{With(errors.New("not a kind"), api.ErrBusy), codes.Internal},
		{errors.New("plain"), codes.Internal},
	} {
		if got := Code(c.err); got != c.code {
			t.Errorf("%v: %s, want %s", c.err, got, c.code)
		}
	}
}

// docs/design.md, "Errors → codes", lists the table as it is: each kind's
// reason and code, in the table's order, then STATUS.
func TestKindsMatchDesign(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "design.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "\n## Errors → codes")
	if !ok {
		t.Fatal(`docs/design.md has no "## Errors → codes" section`)
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	row := regexp.MustCompile("(?m)^\\| `([A-Z_]+)` \\| [^|]+ \\| ([A-Za-z ]+) \\|")
	var got []string
	for _, m := range row.FindAllStringSubmatch(sec, -1) {
		got = append(got, m[1]+" "+m[2])
	}
	var want []string
	for _, k := range Kinds {
		want = append(want, k.Reason+" "+k.Code.String())
	}
	want = append(want, ReasonStatus+" its own")
	if !slices.Equal(got, want) {
		t.Errorf("docs/design.md's table:\n%s\nerrkind.Kinds:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
