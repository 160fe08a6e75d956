package stats

import (
	"math"
	"math/bits"
)

// Saturating arithmetic for the filesystem figures of NodeGetVolumeStats: a
// filesystem can be larger than int64 bytes (a tmpfs of 8EiB), and a sum of
// sparse file sizes can exceed it. A figure is then reported as
// math.MaxInt64, never wrapped negative.

// mulSat returns n*size, or math.MaxInt64 when that is larger; a size <= 0
// gives 0.
func mulSat(n uint64, size int64) int64 {
	if size <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(n, uint64(size))
	if hi != 0 || lo > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(lo)
}

// addSat returns a+b for a >= 0, or math.MaxInt64 when that is larger; a
// negative b counts as 0.
func addSat(a, b int64) int64 {
	if b <= 0 {
		return a
	}
	if b > math.MaxInt64-a {
		return math.MaxInt64
	}
	return a + b
}

// clampInt64 returns n, or math.MaxInt64 when n is larger.
func clampInt64(n uint64) int64 {
	if n > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(n)
}

// subFloor returns a-b, or 0 when b > a (free space counted while it changed).
func subFloor(a, b uint64) uint64 {
	if b > a {
		return 0
	}
	return a - b
}
