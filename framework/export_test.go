package framework

import (
	"context"
	"time"
)

// Hooks into the stats walks of directory volumes for the external tests.

// SetStatsWalkHook makes every later walk of d call visited after each entry,
// with the walk's context and the running count of entries.
func SetStatsWalkHook(d *Driver, visited func(ctx context.Context, entries int64)) {
	d.engine.Stats().SetVisited(visited)
}

// StatsWalks is the number of walks d started.
func StatsWalks(d *Driver) int64 { return d.engine.Stats().Walks() }

// StatsWaiters is the number of calls waiting for the walk of volume id.
func StatsWaiters(d *Driver, id string) int { return d.engine.Stats().Waiting(id) }

// StatsCached is the number of volumes with a stats answer or walk.
func StatsCached(d *Driver) int { return d.engine.Stats().Size() }

// WaitStatsWalks waits for d's walks in progress to end.
func WaitStatsWalks(d *Driver) { d.engine.Stats().WaitIdle() }

// StatsForget drops the stats answer of volume id.
func StatsForget(d *Driver, id string) { d.engine.Stats().Forget(id) }

// SetProvisionSlowAfter scales the kubelet's deadline after which a
// background Create posts ProvisioningSlow (2m) for d's later publishes.
func SetProvisionSlowAfter(d *Driver, after time.Duration) {
	d.engine.SetProvisionSlowAfter(after)
}
