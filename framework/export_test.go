package framework

import (
	"context"
	"time"
)

// Hooks into the stats walks of directory volumes for the external tests.

// SetStatsWalkHook makes every later walk of d call visited after each entry,
// with the walk's context and the running count of entries.
func SetStatsWalkHook(d *Driver, visited func(ctx context.Context, entries int64)) {
	d.stats.SetVisited(visited)
}

// StatsWalks is the number of walks d started.
func StatsWalks(d *Driver) int64 { return d.stats.Walks() }

// StatsWaiters is the number of calls waiting for the walk of volume id.
func StatsWaiters(d *Driver, id string) int { return d.stats.Waiting(id) }

// StatsCached is the number of volumes with a stats answer or walk.
func StatsCached(d *Driver) int { return d.stats.Size() }

// WaitStatsWalks waits for d's walks in progress to end.
func WaitStatsWalks(d *Driver) { d.stats.WaitIdle() }

// StatsForget drops the stats answer of volume id.
func StatsForget(d *Driver, id string) { d.stats.Forget(id) }

// SetProvisionSlowAfter scales the kubelet's deadline after which a
// background Create posts ProvisioningSlow (2m) for d's later publishes.
func SetProvisionSlowAfter(d *Driver, after time.Duration) {
	d.provisions.slowAfter.Store(int64(after))
}
