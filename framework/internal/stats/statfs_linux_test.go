//go:build linux

package stats

import (
	"math"
	"testing"
)

// The statfs of a tmpfs mounted with size=8E (what a size of 2^63-2 becomes):
// 2^51 blocks of 4096 bytes.
func TestStatfsUsageSaturates(t *testing.T) {
	const blocks = 1 << 51
	u := statfsUsage(blocks, blocks-256, blocks-256, 3085510, 3085509, 4096)
	want := Usage{
		BytesTotal: math.MaxInt64, BytesAvail: (blocks - 256) * 4096, BytesUsed: 256 * 4096,
		InodesTotal: 3085510, InodesFree: 3085509, InodesUsed: 1,
	}
	if u != want {
		t.Errorf("statfsUsage = %+v, want %+v", u, want)
	}
	// Counts beyond int64 and free counts above the total (read while they
	// changed) saturate and floor instead of wrapping.
	u = statfsUsage(math.MaxUint64, math.MaxUint64, 0, math.MaxUint64, math.MaxUint64, 1)
	want = Usage{BytesTotal: math.MaxInt64, InodesTotal: math.MaxInt64, InodesFree: math.MaxInt64}
	if u != want {
		t.Errorf("statfsUsage of huge counts = %+v, want %+v", u, want)
	}
	if u := statfsUsage(10, 20, 20, 5, 9, 4096); u.BytesUsed != 0 || u.InodesUsed != 0 {
		t.Errorf("free above total: %+v, want used 0", u)
	}
}
