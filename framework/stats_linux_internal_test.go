//go:build linux

package framework

import (
	"math"
	"testing"
)

// The statfs of a tmpfs mounted with size=8E (what a size of 2^63-2 becomes):
// 2^51 blocks of 4096 bytes.
func TestStatfsUsageSaturates(t *testing.T) {
	const blocks = 1 << 51
	u := statfsUsage(blocks, blocks-256, blocks-256, 3085510, 3085509, 4096)
	want := fsUsage{
		bytesTotal: math.MaxInt64, bytesAvail: (blocks - 256) * 4096, bytesUsed: 256 * 4096,
		inodesTotal: 3085510, inodesFree: 3085509, inodesUsed: 1,
	}
	if u != want {
		t.Errorf("statfsUsage = %+v, want %+v", u, want)
	}
	// Counts beyond int64 and free counts above the total (read while they
	// changed) saturate and floor instead of wrapping.
	u = statfsUsage(math.MaxUint64, math.MaxUint64, 0, math.MaxUint64, math.MaxUint64, 1)
	want = fsUsage{bytesTotal: math.MaxInt64, inodesTotal: math.MaxInt64, inodesFree: math.MaxInt64}
	if u != want {
		t.Errorf("statfsUsage of huge counts = %+v, want %+v", u, want)
	}
	if u := statfsUsage(10, 20, 20, 5, 9, 4096); u.bytesUsed != 0 || u.inodesUsed != 0 {
		t.Errorf("free above total: %+v, want used 0", u)
	}
}
