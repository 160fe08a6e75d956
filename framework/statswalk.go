package framework

import (
	"time"
)

// StatsWalkLimits bound the walk that NodeGetVolumeStats makes of a directory
// volume (the dir backend, a plugin's directory source): its usage is counted
// like du, entry by entry, and the pod decides how many entries there are and
// how deep they nest. A walk that reaches a bound stops there and the answer
// is what it counted, a lower bound (logged and counted in
// ephemera_stats_walks_total; the volume is not reported abnormal). Zero
// fields take the defaults.
type StatsWalkLimits struct {
	// MaxEntries caps the entries (files, directories, links) one walk
	// visits. Defaults to 1,000,000.
	MaxEntries int64
	// MaxDepth caps how deep below the volume's root a walk goes: entries
	// nested deeper are not counted. It also bounds the directories a walk
	// holds open. Defaults to 128.
	MaxDepth int
	// Timeout caps one walk's wall time, whoever waits for it (the walk runs
	// under its own deadline, not the caller's). Defaults to 5s, well under
	// the kubelet's stats deadline; at most 1m.
	Timeout time.Duration
	// MaxConcurrent caps the walks in progress on the node, whatever the
	// volumes: a walk waits for one of them before it starts (its Timeout
	// counts from then), and a caller that goes away stops waiting. Each walk
	// holds up to about stats.WalkMemory of memory, so that the walks of a
	// node are a fixed part of the driver's memory plan whatever the pods
	// put in their directories and however many cores walk them. Defaults
	// to 4.
	MaxConcurrent int
	// MaxLinkedFiles caps the files with several hard links one walk
	// remembers (to count each once, like du): past it the walk stops, its
	// answer a lower bound. It bounds the memory of a walk (about 40 bytes
	// each). Defaults to 65,536.
	MaxLinkedFiles int
	// CacheTTL is how long a walk's answer is reused for the same volume
	// (concurrent calls always share one walk). The kubelet asks once a
	// minute per volume, so a pod's directory costs at most one Timeout of
	// walking per CacheTTL. Defaults to 1m; negative: answers are not reused.
	CacheTTL time.Duration
}

// Defaults of StatsWalkLimits, shared by setDefaults and BindFlags.
const (
	defaultStatsMaxEntries = 1_000_000
	defaultStatsMaxDepth   = 128
	defaultStatsTimeout    = 5 * time.Second
	defaultStatsCacheTTL   = time.Minute
	defaultStatsWalks      = 4
	defaultStatsLinked     = 1 << 16
)

func (l *StatsWalkLimits) setDefaults() {
	if l.MaxEntries == 0 {
		l.MaxEntries = defaultStatsMaxEntries
	}
	if l.MaxDepth == 0 {
		l.MaxDepth = defaultStatsMaxDepth
	}
	if l.Timeout == 0 {
		l.Timeout = defaultStatsTimeout
	}
	if l.CacheTTL == 0 {
		l.CacheTTL = defaultStatsCacheTTL
	}
	if l.MaxConcurrent == 0 {
		l.MaxConcurrent = defaultStatsWalks
	}
	if l.MaxLinkedFiles == 0 {
		l.MaxLinkedFiles = defaultStatsLinked
	}
}
