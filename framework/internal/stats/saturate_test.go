package stats

import (
	"math"
	"testing"
)

func TestSaturatingArithmetic(t *testing.T) {
	const maxI = math.MaxInt64
	for _, tc := range []struct {
		n    uint64
		size int64
		want int64
	}{
		{0, 4096, 0},
		{3, 4096, 3 * 4096},
		{1 << 51, 4096, maxI},          // an 8EiB tmpfs: 2^63 bytes
		{1<<51 - 1, 4096, maxI - 4095}, // one block less fits
		{math.MaxUint64, 2, maxI},      // the high word is set
		{math.MaxUint64, 1, maxI},      // fits in uint64, not in int64
		{maxI, 1, maxI},
		{5, 0, 0},
		{5, -4096, 0},
	} {
		if got := mulSat(tc.n, tc.size); got != tc.want {
			t.Errorf("mulSat(%d, %d) = %d, want %d", tc.n, tc.size, got, tc.want)
		}
	}
	for _, tc := range []struct{ a, b, want int64 }{
		{1, 2, 3},
		{maxI - 1, 1, maxI},
		{maxI - 1, 2, maxI},
		{maxI, maxI, maxI},
		{5, -3, 5},
		{5, math.MinInt64, 5},
	} {
		if got := addSat(tc.a, tc.b); got != tc.want {
			t.Errorf("addSat(%d, %d) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
	if clampInt64(math.MaxUint64) != maxI || clampInt64(1<<63) != maxI || clampInt64(maxI) != maxI || clampInt64(7) != 7 {
		t.Error("clampInt64 does not saturate")
	}
	if subFloor(3, 5) != 0 || subFloor(5, 3) != 2 {
		t.Error("subFloor goes below 0")
	}
}
