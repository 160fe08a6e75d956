// Package stats is what NodeGetVolumeStats measures of a published volume,
// below the lifecycle: the usage of its filesystem (Filesystem, exact and
// O(1) for a filesystem of its own), whether that filesystem is memory
// (MemoryBacked), and the bounded walk of a directory volume that shares
// the host's filesystem (Walk), counted like du -x. Its core types:
//
//   - Usage: the bytes and inodes reported for a volume;
//   - Limits: the bounds of one walk, and of the node's walks at once;
//   - Result and Bound: what a walk counted, and which bounds stopped it
//     short (its answer is then a lower bound);
//   - Cache: the node's walks, one per volume at a time, at most
//     Limits.MaxConcurrent at once, their answers reused for CacheTTL.
//
// The OS-specific parts are thin (os_linux.go: by descriptor with
// getdents/fstatat/statx; os_windows.go: os.Root); the walk and the cache
// are portable and tested on every OS.
package stats

import "time"

// Limits bound the walks of directory volumes (framework.StatsWalkLimits,
// after its defaults): the entries, depth, linked files and wall time of
// one walk, the walks at once on the node, and how long an answer is
// reused.
type Limits struct {
	MaxEntries     int64
	MaxDepth       int
	Timeout        time.Duration
	MaxConcurrent  int
	MaxLinkedFiles int
	CacheTTL       time.Duration
}

// WalkMemory is what one walk may hold at most, for the driver's memory
// plan: its remembered links (MaxLinkedFiles of about 40 bytes, with the
// map's growth), the batches of entries of MaxDepth open directories, and
// the garbage of both (test/bench TestDriverHeldMemory measures it).
const WalkMemory = 8 << 20
