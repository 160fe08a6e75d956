package api_test

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/ephemera-csi/ephemera/api"
)

// Quantity accepts every whole number of bytes from 1 to 2^63-2 however it is
// written, and refuses anything else with InvalidArgument (ErrInvalidParams)
// saying why: it never wraps, rounds or caps a value.
func TestQuantity(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    int64
		wantErr string
	}{
		{in: "64Mi", want: 64 << 20},
		{in: "1", want: 1},
		{in: "1G", want: 1e9},
		{in: "9.2233720368547E18", want: 9223372036854700000},
		{in: "9223372036854775806", want: math.MaxInt64 - 1},
		{in: "9223372036854775806000m", want: math.MaxInt64 - 1},
		{in: "7Ei", want: 7 << 60},
		{in: "7.5Ei", want: 15 << 59},
		{in: "1000000000000000000000m", want: 1e18},

		// The parser caps binary-suffixed values above 2^63-1 at 2^63-1, so
		// that value is refused with everything above it.
		{in: "9223372036854775807", wantErr: "too large"},
		{in: "8Ei", wantErr: "too large"},
		{in: "8192Pi", wantErr: "too large"},
		{in: "99999999999999999999999Ei", wantErr: "too large"},
		{in: "9.3E18", wantErr: "too large"},
		{in: "18446744073709551616", wantErr: "too large"},
		{in: "1e400", wantErr: "too large"},

		{in: "0.5", wantErr: "not a whole number of bytes"},
		{in: "1500m", wantErr: "not a whole number of bytes"},
		{in: "1m", wantErr: "not a whole number of bytes"},
		{in: "9223372036854775806.5", wantErr: "not a whole number of bytes"},
		{in: "1e-400", wantErr: "not a whole number of bytes"},

		{in: "0", wantErr: "greater than zero"},
		{in: "-1", wantErr: "greater than zero"},
		{in: "-8Ei", wantErr: "greater than zero"},
		{in: "64 Mi", wantErr: "not a quantity"},
		{in: "", wantErr: "not a quantity"},
	} {
		n, err := api.Params{"size": tc.in}.Quantity("size", 7)
		if tc.wantErr == "" {
			if err != nil || n != tc.want {
				t.Errorf("Quantity(%q) = %d, %v; want %d", tc.in, n, err, tc.want)
			}
			continue
		}
		if !errors.Is(err, api.ErrInvalidParams) || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), `"size"`) {
			t.Errorf("Quantity(%q) = %d, %v; want ErrInvalidParams naming the attribute and saying %q", tc.in, n, err, tc.wantErr)
		}
	}
	if n, err := (api.Params{}).Quantity("size", 7); n != 7 || err != nil {
		t.Errorf("unset: %d, %v; want the default", n, err)
	}
}
